"""Session keys and session ids (docs/decisions.md#memory-session-keys).

* ``session_key = "{platform}:{bot_id}:{scope}:{scene_id}"`` names a conversation place:
  ``scope`` is ``private`` | ``group`` | ``channel``; for a private chat ``scene_id`` is the
  peer's user id. Example: ``onebot11:10001:group:123456``.
* ``session_id = "{session_key}#{epoch}"`` names one epoch of it (``epoch`` ≥ 1). ``/new`` and
  ``/clear`` archive the epoch and start the next (:meth:`ContextRepository.archive_session`).

Rules for the parts: none may be empty or contain ``#``, whitespace or control characters;
``platform`` and ``bot_id`` may not contain ``:`` (``scene_id`` may: it is the last part).
Epochs are decimal without a sign or leading zeros.

:func:`key_hash` is the stable hash of a key (CRC-32 of its UTF-8 bytes, the same in every
process): router shards split keys by it (``actors.placement.router.shard_of``), and the durable inbox keeps
it per row so a shard can select its own keys in SQL (``runtime.memory.inbox``).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Literal, TypeAlias, cast, get_args

__all__ = [
    "SCOPES",
    "Scope",
    "SessionId",
    "SessionKey",
    "SessionKeyError",
    "key_hash",
    "make_session_id",
    "make_session_key",
    "parse_session_id",
    "parse_session_key",
]

Scope: TypeAlias = Literal["private", "group", "channel"]
SCOPES: tuple[str, ...] = get_args(Scope)

_BAD = re.compile(r"[#\s\x00-\x1f\x7f]")
_EPOCH = re.compile(r"[1-9][0-9]*")


class SessionKeyError(ValueError):
    """A malformed session key, session id or key part (the message names the part and the rule)."""


@dataclass(frozen=True, slots=True)
class SessionKey:
    """A parsed session key; ``str(key)`` gives the canonical string."""

    platform: str
    bot_id: str
    scope: Scope
    scene_id: str

    def __str__(self) -> str:
        return f"{self.platform}:{self.bot_id}:{self.scope}:{self.scene_id}"


@dataclass(frozen=True, slots=True)
class SessionId:
    """A parsed session id: the key and its epoch (≥ 1); ``str(sid)`` gives the canonical string."""

    key: SessionKey
    epoch: int

    def __str__(self) -> str:
        return f"{self.key}#{self.epoch}"


def _check_part(name: str, value: object, *, colon_ok: bool) -> str:
    if not isinstance(value, str) or not value:
        raise SessionKeyError(f"session key part {name!r} must be a non-empty string, got {value!r}")
    if _BAD.search(value):
        raise SessionKeyError(
            f"session key part {name!r} = {value!r} may not contain '#', whitespace or control characters"
        )
    if not colon_ok and ":" in value:
        raise SessionKeyError(f"session key part {name!r} = {value!r} may not contain ':'")
    return value


def _check_scope(scope: object) -> Scope:
    if scope not in SCOPES:
        raise SessionKeyError(f"session scope must be one of {'|'.join(SCOPES)}, got {scope!r}")
    return cast(Scope, scope)


def key_hash(session_key: str) -> int:
    """CRC-32 of ``session_key``'s UTF-8 bytes, in ``[0, 2**32)``: stable in every process and
    across restarts (never Python's salted ``hash()``)."""
    return zlib.crc32(session_key.encode("utf-8"))


def make_session_key(platform: str, bot_id: str, scope: str, scene_id: str) -> str:
    """Build ``"{platform}:{bot_id}:{scope}:{scene_id}"``.

    Args:
        platform: Platform id (``onebot11``, ``telegram``, ``console``…).
        bot_id: The bot's own id on that platform (``self_id``).
        scope: ``private`` | ``group`` | ``channel``.
        scene_id: Group/channel id, or the peer's user id for a private chat.

    Raises:
        SessionKeyError: an empty part, a forbidden character or an unknown scope.
    """
    return str(
        SessionKey(
            _check_part("platform", platform, colon_ok=False),
            _check_part("bot_id", bot_id, colon_ok=False),
            _check_scope(scope),
            _check_part("scene_id", scene_id, colon_ok=True),
        )
    )


def parse_session_key(session_key: str) -> SessionKey:
    """Parse ``"{platform}:{bot_id}:{scope}:{scene_id}"``.

    Raises:
        SessionKeyError: not four ``:``-separated parts, an unknown scope, an empty part or a
            forbidden character (a session *id* passed here fails on its ``#``).
    """
    if not isinstance(session_key, str):
        raise SessionKeyError(f"session key must be a string, got {type(session_key).__name__}")
    parts = session_key.split(":", 3)
    if len(parts) != 4:
        raise SessionKeyError(
            f"malformed session key {session_key!r}: expected 'platform:bot_id:scope:scene_id'"
        )
    platform, bot_id, scope, scene_id = parts
    try:
        return SessionKey(
            _check_part("platform", platform, colon_ok=False),
            _check_part("bot_id", bot_id, colon_ok=False),
            _check_scope(scope),
            _check_part("scene_id", scene_id, colon_ok=True),
        )
    except SessionKeyError as exc:
        raise SessionKeyError(f"malformed session key {session_key!r}: {exc}") from None


def make_session_id(session_key: str, epoch: int) -> str:
    """Build ``"{session_key}#{epoch}"``.

    Raises:
        SessionKeyError: a malformed key, or ``epoch`` not an int ≥ 1.
    """
    key = parse_session_key(session_key)
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise SessionKeyError(f"session epoch must be an int >= 1, got {epoch!r}")
    return str(SessionId(key, epoch))


def parse_session_id(session_id: str) -> SessionId:
    """Parse ``"{session_key}#{epoch}"``.

    Raises:
        SessionKeyError: no ``#``, a bad epoch (not decimal ≥ 1 without leading zeros) or a
            malformed key part.
    """
    if not isinstance(session_id, str):
        raise SessionKeyError(f"session id must be a string, got {type(session_id).__name__}")
    key_text, sep, epoch_text = session_id.rpartition("#")
    if not sep:
        raise SessionKeyError(f"malformed session id {session_id!r}: expected '{{session_key}}#{{epoch}}'")
    if not _EPOCH.fullmatch(epoch_text):
        raise SessionKeyError(f"malformed session id {session_id!r}: epoch {epoch_text!r} is not an int >= 1")
    try:
        key = parse_session_key(key_text)
    except SessionKeyError as exc:
        raise SessionKeyError(f"malformed session id {session_id!r}: {exc}") from None
    return SessionId(key, int(epoch_text))

"""Control of a live session as one typed request (`docs/decisions.md#typed-control-request`).

A master's ``steer`` / ``follow_up`` and an admin's ``abort`` / ``archive`` travel as one
:class:`ControlRequest` from where they enter (the admin API, the web console,
``actors.placement.runtime.SessionRuntime``) through the session's router shard to its session host, which
hands it to :func:`run_control`: the one place that dispatches on :class:`ControlKind` to the
:class:`~runtime.session.core.SessionCore` methods. The answer is a :class:`ControlReply`.

Refusals are exceptions, never error dicts: :class:`NotMasterError` (``steer`` / ``follow_up``
from a user who is not a master of the bot, docs/decisions.md#steer-masters-only),
:class:`UnknownSessionError` (no live session with that key), :class:`BadControlRequest` (a
``steer`` / ``follow_up`` without text or sender) and its subclass :class:`MalformedKeyError` (a
key that is not ``platform:bot_id:scope:scene_id``: a usage error, not an unknown session). They share the
base :class:`ControlError`; the admin API maps them to HTTP status codes in one table
(``actors.http.admin.ERROR_STATUS``). Nothing here imports Ray.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, assert_never

from pydantic import BaseModel, ConfigDict, model_validator

if TYPE_CHECKING:
    from runtime.session.core import SessionCore

__all__ = [
    "BadControlRequest",
    "ControlError",
    "ControlKind",
    "ControlReply",
    "ControlRequest",
    "MalformedKeyError",
    "NotMasterError",
    "UnknownSessionError",
    "run_control",
]


class ControlKind(StrEnum):
    """What a :class:`ControlRequest` asks of a live session (the value is the wire name: the admin
    route ``POST /admin/sessions/{key}/{kind}`` and the metric label ``kind``)."""

    STEER = "steer"
    """Inject ``text`` into the latest active turn (its next LLM call); no active turn: run as one."""
    FOLLOW_UP = "follow_up"
    """Queue ``text`` on the latest active turn (used when it would stop); no active turn: run as one."""
    ABORT = "abort"
    """Abort every running turn (no reply is sent for them)."""
    ARCHIVE = "archive"
    """``/new``: archive the active epoch and continue in a fresh, empty one."""

    @property
    def master_only(self) -> bool:
        """Only a master of the session's bot may send it; it carries ``text`` and ``sender_id``."""
        return self in (ControlKind.STEER, ControlKind.FOLLOW_UP)


class ControlError(Exception):
    """A control request was refused (base of the refusals below; the message says why)."""


class NotMasterError(ControlError, PermissionError):
    """``steer`` / ``follow_up`` from a user who is not a master of the bot
    (docs/decisions.md#steer-masters-only)."""


class UnknownSessionError(ControlError, LookupError):
    """No live session with that (well-formed) key: never seen, or passivated."""


class BadControlRequest(ControlError):
    """A request that cannot be carried out as stated (a ``steer`` / ``follow_up`` without a
    non-empty ``text`` and ``sender_id``). Raised by :class:`ControlRequest` itself."""


class MalformedKeyError(BadControlRequest, ValueError):
    """The session key is not ``platform:bot_id:scope:scene_id`` (the message is
    :class:`runtime.keys.SessionKeyError`'s: it names the part and the rule). The admin API answers
    it 400, never 404: the caller has to fix the key, no session can ever have it."""


class ControlRequest(BaseModel):
    """One control request for the live session ``session_key``.

    ``text`` and ``sender_id`` (the master's platform user id) are needed by the
    :attr:`~ControlKind.master_only` kinds and ignored by the others.

    Raises:
        BadControlRequest: a ``steer`` / ``follow_up`` with an empty ``text`` or ``sender_id``.
        pydantic.ValidationError: an unknown ``kind`` or a field of the wrong type.
    """

    model_config = ConfigDict(frozen=True)

    kind: ControlKind
    session_key: str
    text: str = ""
    sender_id: str = ""

    @model_validator(mode="after")
    def _master_kinds_carry_text_and_sender(self) -> ControlRequest:
        if self.kind.master_only and not (self.text.strip() and self.sender_id.strip()):
            raise BadControlRequest(f"{self.kind} needs a non-empty text and sender_id")
        return self


class ControlReply(BaseModel):
    """The answer to a :class:`ControlRequest` that was carried out.

    ``result`` by kind: ``steer`` ``"steered"`` or ``"started"``; ``follow_up`` ``"queued"`` or
    ``"started"`` (``started``: no active turn, the text runs as a turn of its own); ``abort`` the
    number of turns aborted; ``archive`` the new ``session_id``.
    """

    model_config = ConfigDict(frozen=True)

    kind: ControlKind
    session_key: str
    result: int | str


async def run_control(core: SessionCore, request: ControlRequest) -> ControlReply:
    """Carry out ``request`` on ``core`` (the session it names; the caller checked that and, for
    the master-only kinds, the sender). The one dispatch on :class:`ControlKind`.

    Raises:
        Whatever :meth:`SessionCore.archive` raises (database errors).
    """
    result: int | str
    match request.kind:
        case ControlKind.STEER:
            result = core.steer(request.text, request.sender_id)
        case ControlKind.FOLLOW_UP:
            result = core.follow_up(request.text, request.sender_id)
        case ControlKind.ABORT:
            result = core.abort()
        case ControlKind.ARCHIVE:
            result = await core.archive()
        case _:
            assert_never(request.kind)
    return ControlReply(kind=request.kind, session_key=request.session_key, result=result)

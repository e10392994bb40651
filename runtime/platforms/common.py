"""Helpers shared by the platform codecs: trigger modes, config access, media paths, HTTP results,
and the rules for input from outside — one definition each, also used by the ingress, the admin
API and the console API (``actors/``): JSON decoding (:func:`decode_json`, :func:`load_event`),
valid Unicode (:func:`lone_surrogate_at`, :func:`valid_unicode`), the 64-bit integer range
(:data:`INT64_MIN`, :data:`INT64_MAX`, :func:`int_id`) and the event-time range
(:data:`MAX_EVENT_TIME_MS`, :func:`event_time_in_range`, :func:`epoch_ms`)."""

from __future__ import annotations

import email.utils
import json
import logging
import re
import time
from collections.abc import Collection, Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from runtime import metrics
from runtime.platforms.base import MalformedEvent, SendResult, header

log = logging.getLogger("sessionray.platforms")

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MASTER_ROLE",
    "MAX_EVENT_TIME_MS",
    "TRIGGER_MODES",
    "JsonInputError",
    "MediaPathError",
    "check_trigger",
    "decode_json",
    "epoch_ms",
    "event_time_in_range",
    "http_send_result",
    "int_id",
    "is_triggered",
    "keyword_hit",
    "keywords_of",
    "load_event",
    "lone_surrogate_at",
    "media_filename",
    "media_unavailable",
    "parse_retry_after",
    "read_media_path",
    "resolve_media_path",
    "setting",
    "trigger_settings",
    "valid_unicode",
    "with_master_role",
]

TRIGGER_MODES = ("always", "mention", "keyword")
"""When a group message starts a turn (docs/decisions.md#platform-triggers): every message, only
when the bot is mentioned, or when a configured keyword (or a mention) appears. Private messages
always do."""


def check_trigger(platform: str, trigger: str) -> str:
    """Return ``trigger`` when it is one of :data:`TRIGGER_MODES`.

    Raises:
        ValueError: any other value, naming the platform (``"<platform> trigger must be one of …"``).
    """
    if trigger not in TRIGGER_MODES:
        raise ValueError(f"{platform} trigger must be one of {', '.join(TRIGGER_MODES)}, got {trigger!r}")
    return trigger


def is_triggered(
    scene_type: str, trigger: str, addressed: bool, text: str, keywords: tuple[str, ...] | list[str]
) -> bool:
    """Whether an inbound message starts a turn (see :data:`TRIGGER_MODES`).

    Private scenes and ``always`` → True; ``keyword`` → ``addressed`` or a keyword in ``text``
    (:func:`keyword_hit`); ``mention`` → ``addressed`` (the bot is mentioned, or a platform's
    equivalent such as a Telegram bot command).
    """
    if scene_type == "private" or trigger == "always":
        return True
    if trigger == "keyword":
        return addressed or keyword_hit(text, keywords)
    return addressed


MASTER_ROLE = "master"
"""The role a codec adds to ``Sender.roles`` when the sender is one of the bot's configured
masters (``bots[].masters``); commands and control messages check for it."""


def with_master_role(roles: list[str], sender_id: str, masters: Collection[str]) -> list[str]:
    """Return ``roles`` (the platform's own, in order) followed by :data:`MASTER_ROLE` when
    ``sender_id`` is in ``masters`` (ids compared as strings, exactly); a new list, ``roles`` is
    not changed."""
    return [*roles, MASTER_ROLE] if sender_id in masters else list(roles)


def trigger_settings(bot: Any) -> dict[str, Any]:
    """The codec keyword arguments every platform reads the same way from a ``bots:`` entry:
    ``trigger`` (default ``mention``), ``keywords`` (:func:`keywords_of`), ``masters`` (as
    strings, default none) and ``media_dir`` (default None)."""
    return {
        "trigger": setting(bot, "trigger", None) or "mention",
        "keywords": keywords_of(bot),
        "masters": [str(m) for m in setting(bot, "masters", None) or ()],
        "media_dir": setting(bot, "media_dir", None),
    }


class MediaPathError(ValueError):
    """A ``path`` medium cannot be used; ``reason`` is a ``runtime.reply.media`` reject reason
    (``outside_media_dir`` | ``not_found``)."""

    def __init__(self, message: str, reason: str = "outside_media_dir") -> None:
        super().__init__(message)
        self.reason = reason


def read_media_path(value: str, media_dir: Path | None) -> bytes:
    """The bytes of a ``path`` medium (confined like :func:`resolve_media_path`).

    Raises:
        MediaPathError: outside the media directory, or not a readable file (``not_found``).
    """
    path = resolve_media_path(value, media_dir)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise MediaPathError(f"media path {value!r}: {exc.strerror or exc}", "not_found") from None


def media_unavailable(platform: str, segment_type: str, exc: MediaPathError) -> str:
    """Count and log an attachment the codec cannot send, and return the notice text that replaces
    it (the same text as ``runtime.reply.media``; replaced and counted, never dropped:
    docs/decisions.md#security-media-bytes).

    Normally ``runtime.reply.media.check_reply_media`` has already replaced unusable media before a
    codec renders; this covers a media directory configured for the check but not for the bot.
    """
    from runtime.reply.media import MediaPolicy

    metrics.MEDIA_REJECTED.inc(reason=exc.reason)
    log.warning("%s: %s attachment unavailable: %s", platform, segment_type, exc)
    return MediaPolicy().unavailable_text


def setting(bot: Any, name: str, default: Any) -> Any:
    """Read an optional field of a ``bots:`` entry (a pydantic model, a dataclass or a dict)."""
    if isinstance(bot, Mapping):
        return bot.get(name, default)
    return getattr(bot, name, default)


def keywords_of(bot: Any) -> list[str]:
    """The trigger keywords of a ``bots:`` entry: ``keyword`` (one word, the config key) plus any
    ``keywords`` list."""
    words = [str(k) for k in setting(bot, "keywords", None) or ()]
    one = setting(bot, "keyword", None)
    return [*words, str(one)] if one else words


def keyword_hit(text: str, keywords: tuple[str, ...] | list[str]) -> bool:
    """True when any non-empty keyword occurs in ``text`` (case-insensitive substring)."""
    low = text.casefold()
    return any(k and k.casefold() in low for k in keywords)


def resolve_media_path(value: str, media_dir: Path | None) -> Path:
    """Resolve a ``path`` medium to an absolute path confined to ``media_dir``.

    Relative values are taken relative to ``media_dir``; ``..`` and symlinks that leave the
    directory are refused (docs/decisions.md#security-media-references).

    Raises:
        MediaPathError: no ``media_dir`` configured, or the path resolves outside it.
    """
    if media_dir is None:
        raise MediaPathError(f"media path {value!r} given but no media directory is configured")
    root = media_dir.resolve()
    if ".." in PurePosixPath(value).parts:
        raise MediaPathError(f"media path {value!r} contains '..'")
    candidate = (root / value).resolve()
    if candidate != root and root not in candidate.parents:
        raise MediaPathError(f"media path {value!r} resolves outside the media directory")
    return candidate


def media_filename(kind: str, value: str) -> str:
    """A file name for an upload: the last path component of a ``path``/``url`` medium, else ``file``."""
    if kind == "path":
        return PurePosixPath(value).name or "file"
    if kind == "url":
        return PurePosixPath(urlsplit(value).path).name or "file"
    return "file"


def parse_retry_after(value: str | None, *, now_s: float | None = None) -> float | None:
    """Parse an HTTP ``Retry-After`` value (delta seconds or an HTTP date) into seconds ≥ 0."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


def http_send_result(status: int, headers: Mapping[str, str], body: bytes) -> SendResult:
    """A failed :class:`SendResult` for a non-200 HTTP answer: retryable on 429 and 5xx, with
    ``Retry-After`` in seconds; the error names the status and the start of the body."""
    snippet = body[:300].decode("utf-8", errors="replace")
    return SendResult(
        ok=False,
        error=f"HTTP {status}: {snippet}",
        retry_after_s=parse_retry_after(header(headers, "Retry-After")),
        retryable=status == 429 or status >= 500,
    )


# --------------------------------------------------------------------------- inbound validation

INT64_MIN = -(2**63)
"""Smallest value of a SQL ``BIGINT`` (SQLite ``INTEGER`` / PostgreSQL ``bigint``, signed 64 bit)."""
INT64_MAX = 2**63 - 1
"""Largest value of a SQL ``BIGINT``: the range of inbound integer ids and stored times."""
MAX_EVENT_TIME_MS = 2**32 * 1000
"""Upper bound (exclusive) of an inbound event time in Unix **milliseconds**: 2**32 Unix seconds
(year 2106), the one limit of every codec whether the platform sends seconds (OneBot, Telegram)
or milliseconds (console). A larger value is a malformed event (the attack's ``time: 1e20``
overflowed SQLite's INTEGER)."""

_INT_TEXT = re.compile(r"-?[0-9]{1,19}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPES = re.compile(
    r"\\\\"  # an escaped backslash (consumed whole, so the scan never starts inside one)
    r"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"  # a surrogate pair: kept
    r"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"  # a lone surrogate
)
_JSON_TYPES = ("application/json", "text/json")


def lone_surrogate_at(value: str) -> int | None:
    """The index of the first lone UTF-16 surrogate (U+D800–U+DFFF) in ``value``, or None.

    A Python string holds such a character after decoding a ``"\\ud800"`` JSON escape (or raw
    surrogate bytes); UTF-8 cannot encode it, so no transcript or session row can store it. A
    string without one is valid Unicode (encodable as UTF-8).
    """
    found = _LONE_SURROGATE.search(value)
    return None if found is None else found.start()


def valid_unicode(value: str) -> bool:
    """True when ``value`` is encodable as UTF-8, i.e. has no lone surrogate (:func:`lone_surrogate_at`)."""
    return _LONE_SURROGATE.search(value) is None


def event_time_in_range(time_ms: float) -> bool:
    """True when an event time in Unix ms lies in ``[0,`` :data:`MAX_EVENT_TIME_MS` ``)`` (NaN
    and infinities are not)."""
    return 0 <= time_ms < MAX_EVENT_TIME_MS


def _shown(value: Any) -> str:
    """A short repr of a rejected value for an error message (at most 60 characters)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def int_id(
    value: Any, field: str, platform: str, *, digit_strings: bool = False, positive: bool = False
) -> str:
    """An integer id of an inbound event as its canonical decimal string (``"-100123"``).

    Accepts a JSON integer (never a boolean or float) within [:data:`INT64_MIN`,
    :data:`INT64_MAX`] and, with ``digit_strings``, an ASCII decimal string of the same range
    (OneBot implementations that send ids as strings). The result never contains ``#``, ``:``,
    spaces or control characters, so it is always a valid session key part (``runtime.keys``).
    With ``positive``, the id must be ≥ 1 (QQ account and group numbers; OneBot message ids and
    Telegram chat ids may be negative).

    Raises:
        MalformedEvent: anything else, naming ``platform`` and ``field`` (ingress answers 400).
    """
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok and digit_strings and isinstance(value, str):
        ok = _INT_TEXT.fullmatch(value) is not None
    if not ok:
        kind = "an integer or a decimal string" if digit_strings else "an integer"
        raise MalformedEvent(f"{platform} {field} must be {kind}, got {_shown(value)}")
    number = int(value)
    if not INT64_MIN <= number <= INT64_MAX:
        raise MalformedEvent(f"{platform} {field} is outside the 64-bit integer range: {_shown(value)}")
    if positive and number < 1:
        raise MalformedEvent(f"{platform} {field} must be a positive number, got {_shown(value)}")
    return str(number)


def epoch_ms(value: Any, field: str, platform: str, *, floats: bool = False) -> int:
    """An event time given in Unix **seconds** as Unix **milliseconds**.

    Accepts an integer (with ``floats`` also a finite float; never a boolean) whose milliseconds
    are :func:`event_time_in_range` (``0 ≤ value < 2**32`` seconds).

    Raises:
        MalformedEvent: another type or a value out of that range, naming ``field``.
    """
    bad_type = isinstance(value, bool) or not isinstance(value, int | float)
    if bad_type or (isinstance(value, float) and not floats):
        kind = "a number" if floats else "an integer"
        raise MalformedEvent(f"{platform} {field} must be {kind} of Unix seconds, got {_shown(value)}")
    if not event_time_in_range(value * 1000):
        raise MalformedEvent(f"{platform} {field} must be within 0..2**32 Unix seconds, got {_shown(value)}")
    return int(value * 1000)


def _surrogate_escape(match: re.Match[str]) -> str:
    """One token of :data:`_ESCAPES`: a lone surrogate escape becomes ``\\ufffd``, the rest stays."""
    token = match.group(0)
    return "\\ufffd" if len(token) == 6 else token


class JsonInputError(ValueError):
    """A body :func:`decode_json` cannot decode; the message names ``what`` and the cause (never
    the body). ``too_deep`` is True for nesting beyond the decoder (``RecursionError``)."""

    def __init__(self, message: str, *, too_deep: bool = False) -> None:
        super().__init__(message)
        self.too_deep = too_deep


def decode_json(raw: bytes, *, what: str = "JSON body", replace_lone_surrogates: bool = False) -> Any:
    """Decode UTF-8 JSON bytes — the one JSON decoder for input from outside (webhooks through
    :func:`load_event`, the admin and console APIs through ``actors.http.input_checks.loads_json``).

    Args:
        raw: The body (UTF-8, a BOM allowed; raw surrogate bytes decode as lone surrogates, as
            ``json.loads`` does).
        what: What the body is, for the error message (``"OneBot event"``).
        replace_lone_surrogates: Replace every lone surrogate — ``"\\ud800"`` escapes and raw
            bytes; escaped pairs are kept — by U+FFFD (same UTF-16 length). When False they are
            kept and the caller refuses them field by field (:func:`lone_surrogate_at`).

    Raises:
        JsonInputError: ``"<what> is not valid UTF-8: …"``, ``"<what> is not valid JSON: …"`` or
            ``"<what> is nested too deeply"`` (``too_deep``).
    """
    try:
        text = raw.decode("utf-8-sig", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise JsonInputError(f"{what} is not valid UTF-8: {exc}") from exc
    if replace_lone_surrogates:
        if _SURROGATE_ESCAPE.search(text):
            text = _ESCAPES.sub(_surrogate_escape, text)
        if _LONE_SURROGATE.search(text):
            text = _LONE_SURROGATE.sub("\ufffd", text)
    try:
        return json.loads(text)
    except RecursionError:
        raise JsonInputError(f"{what} is nested too deeply", too_deep=True) from None
    except ValueError as exc:
        raise JsonInputError(f"{what} is not valid JSON: {exc}") from exc


def is_json_content_type(ctype: str | None) -> bool:
    """Whether a ``Content-Type`` value names JSON (``application/json``, ``text/json`` or
    ``application/<x>+json``; parameters ignored). ``None`` (no header) is not JSON. A browser
    sends a cross-site POST without a CORS preflight only with ``text/plain``, form or multipart
    types, so requiring a JSON type is what keeps other websites from driving an endpoint."""
    if ctype is None:
        return False
    mime = ctype.split(";", 1)[0].strip().lower()
    return mime in _JSON_TYPES or (mime.startswith("application/") and mime.endswith("+json"))


def load_event(
    headers: Mapping[str, str],
    body: bytes,
    platform: str,
    *,
    replace_lone_surrogates: bool = True,
) -> Any:
    """Decode a webhook body as JSON, the one way every codec does
    (docs/decisions.md#platform-strict-boundary).

    * A ``Content-Type`` header, when present, must be JSON (:func:`is_json_content_type`); a
      missing one is accepted (a browser-facing codec, the console, has the ingress require it:
      ``browser_facing``).
    * The body must be UTF-8 JSON; nesting too deep for the decoder (``RecursionError``) is a
      malformed event, not a server error (:func:`decode_json`).
    * With ``replace_lone_surrogates`` (OneBot, Telegram) lone UTF-16 surrogates (``"\\ud800"``
      escapes or their raw bytes) are replaced by U+FFFD in every string: real OneBot
      implementations cut nicknames and texts at UTF-16 units, so rejecting would lose a real
      user's message, and U+FFFD keeps UTF-16 lengths (Telegram entity offsets stay right);
      every later step (SQLite, JSON storage) needs valid Unicode. Without it (the console,
      whose browser never sends one) they are kept for the codec to refuse.

    Raises:
        MalformedEvent: a non-JSON ``Content-Type``, invalid UTF-8/JSON, or too deep nesting
            (``"<platform> event is …"``).
    """
    ctype = header(headers, "Content-Type")
    if ctype is not None and not is_json_content_type(ctype):
        raise MalformedEvent(f"{platform} event must be sent as application/json, got {_shown(ctype)}")
    try:
        return decode_json(body, what=f"{platform} event", replace_lone_surrogates=replace_lone_surrogates)
    except JsonInputError as exc:
        raise MalformedEvent(str(exc)) from exc

"""Checks of HTTP request input shared by the ingress webhook, the admin API and the console API
(one rule each: docs/decisions.md#security-input-limits).

The admin and console APIs hand user text to ``SessionRuntime.steer`` / ``follow_up``; whatever the
runtime could not store (a lone surrogate cannot be encoded as UTF-8, so ``append_messages``
refuses it) or should not run (megabytes of text) is refused here, where the input enters, with an
error naming the field:

* :func:`loads_json` — the body through :func:`runtime.platforms.common.decode_json` (the decoder
  the platform codecs use too); a body nested too deeply for the parser is a 400 with a fixed
  message (never the exception text);
* :func:`check_text` — a non-empty string, valid Unicode (:func:`check_unicode`, 400 otherwise), at
  most :func:`max_text_chars` characters (413 otherwise, :func:`text_too_long` — the same message
  as the webhook's 413);
* :func:`valid_session_key` — the session-key test of the admin and console routes;
* :func:`query_int` — a whole-number query parameter within its range (the admin routes' ``limit``
  and ``offset``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from runtime.config import ServerConfig
from runtime.keys import SessionKeyError, parse_session_key
from runtime.platforms.common import JsonInputError, decode_json, valid_unicode

__all__ = [
    "DEFAULT_MAX_TEXT_CHARS",
    "InputError",
    "check_text",
    "check_unicode",
    "loads_json",
    "max_text_chars",
    "text_too_long",
    "valid_session_key",
]

DEFAULT_MAX_TEXT_CHARS: int = ServerConfig.model_fields["max_text_chars"].default
"""``server.max_text_chars`` of the config model (16000 characters): the limit when the object at
hand has no ``server`` section (an admin runtime without a config)."""


class InputError(ValueError):
    """Refused request input: ``status`` (400 or 413) and a message naming the field.

    Args:
        message: What is wrong, naming the field (no input echoed back beyond its length).
        status: HTTP status to answer (400 malformed, 413 too large).
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def response(self) -> JSONResponse:
        """``{"error": message}`` with :attr:`status`."""
        return JSONResponse({"error": self.message}, status_code=self.status)


def max_text_chars(config: Any) -> int:
    """The text limit in characters: ``config.server.max_text_chars`` when the config has it (and
    it is a positive int), else :data:`DEFAULT_MAX_TEXT_CHARS`. ``config`` may be None."""
    value = getattr(getattr(config, "server", None), "max_text_chars", None)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return DEFAULT_MAX_TEXT_CHARS


def text_too_long(what: str, length: int, limit: int) -> str:
    """The one 413 message for a text over ``server.max_text_chars``, e.g. ``"`text` is too long:
    101 characters, at most 100 (server.max_text_chars)"``."""
    return f"{what} is too long: {length} characters, at most {limit} (server.max_text_chars)"


def loads_json(raw: bytes) -> Any:
    """Parse a request body (UTF-8 JSON; lone surrogates kept for :func:`check_unicode`).

    Raises:
        InputError: 400 ``"JSON body is nested too deeply"`` (``RecursionError`` in the parser).
        ValueError: not JSON or not UTF-8 (callers answer 400 with their own message).
    """
    try:
        return decode_json(raw)
    except JsonInputError as exc:
        if exc.too_deep:
            raise InputError(str(exc)) from None
        raise


def check_unicode(field: str, value: str) -> str:
    """Return ``value`` when it is valid Unicode (:func:`runtime.platforms.common.valid_unicode`).

    Raises:
        InputError: 400 ``"`field` is not valid Unicode text (it contains a lone surrogate)"``.
    """
    if not valid_unicode(value):
        raise InputError(f"`{field}` is not valid Unicode text (it contains a lone surrogate)")
    return value


def check_text(field: str, value: Any, *, max_chars: int) -> str:
    """Return ``value`` when it is a usable message text.

    Args:
        field: The JSON field name, used in the error (e.g. ``text``).
        value: The field's value from the body.
        max_chars: Most characters accepted (:func:`max_text_chars`).

    Raises:
        InputError: 400 not a string, empty/blank, or not valid Unicode (lone surrogate);
            413 longer than ``max_chars`` characters (:func:`text_too_long`).
    """
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"`{field}` must be a non-empty string")
    check_unicode(field, value)
    if len(value) > max_chars:
        raise InputError(text_too_long(f"`{field}`", len(value), max_chars), 413)
    return value


def valid_session_key(key: Any, platform: str | None = None) -> bool:
    """True when ``key`` is a well-formed session key (``runtime.keys.parse_session_key``)
    and, when ``platform`` is given, one of that platform (the console acts on ``console:*`` only)."""
    try:
        parsed = parse_session_key(key)
    except SessionKeyError:
        return False
    return platform is None or parsed.platform == platform


def query_int(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """The query parameter ``name`` as an int in ``[low, high]``, ``default`` when it is absent.

    Raises:
        ValueError: not an integer, or out of range (the message names the parameter and the value).
    """
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"`{name}` must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"`{name}` must be between {low} and {high}, got {value}")
    return value

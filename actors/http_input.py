"""Checks of HTTP request input shared by the admin API and the console API (attack report #5, #7, #9).

Both APIs hand user text to ``SessionRuntime.steer`` / ``follow_up``; whatever the runtime could not
store (a lone surrogate cannot be encoded as UTF-8, so ``append_messages`` refuses it) or should not
run (megabytes of text) is refused here, where the input enters, with an error naming the field:

* :func:`loads_json` — a body nested too deeply for the JSON parser (``RecursionError``) is a 400
  with a fixed message (never the exception text);
* :func:`check_text` — a non-empty string, valid Unicode (400 otherwise), at most
  ``server.max_text_chars`` characters (413 otherwise; :func:`max_text_chars`, default 16000).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from runtime.platforms.console import valid_unicode

__all__ = [
    "DEFAULT_MAX_TEXT_CHARS",
    "InputError",
    "check_text",
    "loads_json",
    "max_text_chars",
]

DEFAULT_MAX_TEXT_CHARS = 16000
"""Characters of steer / follow-up text accepted when the config has no ``server.max_text_chars``."""


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
    """``config.server.max_text_chars`` when the config has it (and it is a positive int), else
    :data:`DEFAULT_MAX_TEXT_CHARS`. ``config`` may be None."""
    value = getattr(getattr(config, "server", None), "max_text_chars", None)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return DEFAULT_MAX_TEXT_CHARS


def loads_json(raw: bytes) -> Any:
    """Parse a request body.

    Raises:
        InputError: 400, the body nests deeper than the parser can go (``RecursionError``).
        ValueError: not JSON or not UTF-8 (callers answer 400 with their own message).
    """
    try:
        return json.loads(raw)
    except RecursionError:
        raise InputError("JSON body is nested too deeply") from None


def check_text(field: str, value: Any, *, max_chars: int) -> str:
    """Return ``value`` when it is a usable message text.

    Args:
        field: The JSON field name, used in the error (e.g. ``text``).
        value: The field's value from the body.
        max_chars: Most characters accepted (``server.max_text_chars``).

    Raises:
        InputError: 400 not a string, empty/blank, or not valid Unicode (lone surrogate);
            413 longer than ``max_chars`` characters.
    """
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"`{field}` must be a non-empty string")
    if not valid_unicode(value):
        raise InputError(f"`{field}` is not valid Unicode text (it contains a lone surrogate)")
    if len(value) > max_chars:
        raise InputError(f"`{field}` is too long: {len(value)} characters, at most {max_chars}", 413)
    return value

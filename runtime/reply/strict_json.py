"""Strict JSON pre-check for structured output
(docs/decisions.md#reply-strict-validation).

pydantic's JSON parser accepts a few things a *contract* must not: a duplicated object key (the
last one silently wins, so ``{"type": "text", "type": "mention", ...}`` means whatever the parser
picks), the non-standard literals ``NaN`` / ``Infinity`` / ``-Infinity``, and numbers that overflow
to infinity (``1e400``). :func:`json_contract_problem` finds them before validation, so
:meth:`runtime.reply.segments.Reply.model_validate_json` and :func:`runtime.reply.structured.validate_raw`
reject an ambiguous or non-standard answer as a whole instead of guessing.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import ValidationError

__all__ = ["json_contract_problem", "json_invalid_error"]


class _Ambiguous(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _Ambiguous(f"duplicate key {key!r}")
        seen.add(key)
    return dict(pairs)


def _constant(name: str) -> Any:
    raise _Ambiguous(f"{name} is not valid JSON")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Ambiguous(f"number {text[:40]} is out of range")
    return value


def json_contract_problem(raw: str | bytes) -> str | None:
    """Return why ``raw`` cannot be a contract answer, or ``None`` when the pre-check passes.

    Flags duplicate object keys (at any depth), ``NaN``/``Infinity`` literals and floats that
    overflow (e.g. ``1e400``). Syntax errors are *not* reported here (``None``): pydantic's own
    parser reports them with line/column, and it stays the one source of those messages.

    Args:
        raw: The model's raw output (text, or UTF-8 bytes).

    Returns:
        A short reason such as ``"duplicate key 'type'"``, or ``None``.
    """
    try:
        json.loads(raw, object_pairs_hook=_pairs, parse_constant=_constant, parse_float=_float)
    except _Ambiguous as exc:
        return str(exc)
    except (ValueError, RecursionError):  # syntax (JSONDecodeError), bad UTF-8, nesting: pydantic reports
        return None
    return None


def json_invalid_error(title: str, raw: str | bytes, reason: str) -> ValidationError:
    """Build the ``pydantic.ValidationError`` (type ``json_invalid``, root location) that a strict
    entry point raises for a pre-check ``reason``, so callers handle one exception type."""
    return ValidationError.from_exception_data(
        title, [{"type": "json_invalid", "loc": (), "input": raw, "ctx": {"error": reason}}]
    )

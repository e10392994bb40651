"""Python entry points used by the ``*.tool.md`` tests (``tests.features.handlers:<name>``)."""

from __future__ import annotations

from typing import Any


def add(args: dict[str, Any]) -> dict[str, Any]:
    """Sum ``a`` and ``b``."""
    return {"sum": args["a"] + args["b"]}


async def shout(args: dict[str, Any]) -> str:
    """Upper-case ``text`` (async handler)."""
    return str(args["text"]).upper()


NOT_CALLABLE = 3

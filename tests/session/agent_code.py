"""Functions named by ``ai.agent.pre_tools`` / ``ai.agent.deferred_tasks`` in the knob tests."""

from __future__ import annotations

import threading
from typing import Any


def where_am_i(turn: Any) -> str:
    """A plain (sync) pre-tool: says which thread ran it and for which sender."""
    return f"sender {turn.sender.get('id')} on thread {threading.current_thread().name}"


async def nothing_to_add(turn: Any) -> None:
    """An async pre-tool with nothing to add."""
    return None


def square(args: dict[str, Any]) -> str:
    """A deferred task."""
    return f"{args['x'] ** 2}"


NOT_CALLABLE = 42

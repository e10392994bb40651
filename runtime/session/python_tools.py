"""Python code named in the configuration: ``ai.python_tools`` (business tools) and
``ai.agent.pre_tools`` / ``ai.agent.deferred_tasks`` (:func:`load_pre_tools`,
:func:`load_deferred_tasks`). Resolving one ``module:attribute`` reference is the configuration's
general loader (:mod:`runtime.config.entry_points`); this module turns what it loads into a
session's tools, pre-tools and deferred tasks.

Each entry is a ``"module:attribute"`` reference. The attribute is

* an :class:`~runtime.agent.tools.AgentTool`,
* a list or tuple of them, or
* a function without arguments that returns either of the above (called once per process).

The module is imported where the tools are used — at start-up (:func:`load_python_tools` is run
once so a bad reference stops the start) and inside each session host — so it must be
importable there (on ``PYTHONPATH``; ``sessionray serve`` puts the repository root on it).
Loading is all-or-nothing, like ``*.tool.md`` (``docs/decisions.md#tool-md-hard-fail``).

Example (``examples/bot/bot_tools.py``)::

    ai:
      python_tools: ["examples.bot.bot_tools:TOOLS"]
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from runtime.agent.tools import AgentTool
from runtime.config.entry_points import PythonToolError, import_entry_point, load_callable
from runtime.session.turn import PreTool, TurnInput

__all__ = [
    "load_deferred_tasks",
    "load_pre_tools",
    "load_python_tools",
]


def _as_tools(ref: str, value: Any) -> list[AgentTool[Any]]:
    items = list(value) if isinstance(value, list | tuple) else [value]
    bad = [type(v).__name__ for v in items if not isinstance(v, AgentTool)]
    if bad:
        raise PythonToolError(f"{ref}: expected AgentTool objects, got {', '.join(bad)}")
    return items


def load_python_tools(refs: Sequence[str]) -> list[AgentTool[Any]]:
    """Load the tools of every reference, in order.

    Raises:
        PythonToolError: a reference cannot be imported, its value (or what its function returns)
            is not an ``AgentTool`` or a list of them, its function raises, or two tools share a
            name; the message names the reference.
    """
    tools: list[AgentTool[Any]] = []
    seen: dict[str, str] = {}
    for ref in refs:
        try:
            value = import_entry_point(ref)
        except (ImportError, AttributeError, ValueError) as exc:
            raise PythonToolError(f"{ref}: cannot be imported: {exc}") from None
        if callable(value) and not isinstance(value, AgentTool):
            try:
                value = value()
            except Exception as exc:
                raise PythonToolError(
                    f"{ref}: the tool function raised {type(exc).__name__}: {exc}"
                ) from None
        for tool in _as_tools(ref, value):
            if tool.name in seen:
                raise PythonToolError(
                    f"{ref}: tool name {tool.name!r} is already declared by {seen[tool.name]}"
                )
            seen[tool.name] = ref
            tools.append(tool)
    return tools


def load_pre_tools(refs: Sequence[str]) -> list[PreTool]:
    """``ai.agent.pre_tools``: each ``"module:function"`` as a :class:`PreTool` named after the
    function. The function takes the turn (:class:`~runtime.session.turn.TurnInput`) and returns
    text or ``None``; a plain function runs in a worker thread (docs/decisions.md#session-hosts).

    Raises:
        PythonToolError: a reference cannot be imported or is not callable.
    """
    return [PreTool(ref.partition(":")[2], _pre_tool_run(load_callable(ref))) for ref in refs]


def load_deferred_tasks(refs: Mapping[str, str]) -> dict[str, Callable[[dict[str, Any]], str]]:
    """``ai.agent.deferred_tasks``: task name → the imported function (run later as a Ray task).

    Raises:
        PythonToolError: a reference cannot be imported or is not callable.
    """
    return {name: load_callable(ref) for name, ref in refs.items()}


def _pre_tool_run(fn: Any) -> Callable[[TurnInput], Awaitable[str | None]]:
    async def run(turn: TurnInput) -> str | None:
        value = fn(turn) if inspect.iscoroutinefunction(fn) else await asyncio.to_thread(fn, turn)
        if inspect.isawaitable(value):
            value = await value
        return None if value is None else str(value)

    return run

"""Where a session's records go between running turns' tool exchanges, without Ray
(docs/decisions.md#session-turn-records, docs/decisions.md#session-hot-chat-coalescing).

Every record of a session goes through its single writer, in one order. Two rules keep that order
usable by the next turn's request:

* a turn's assistant messages and tool results are *in flight* until the turn ends: a turn that
  starts meanwhile does not see another turn's half-done tool exchange (:meth:`Exchanges.visible`);
* history of a message no turn answers (a message over a coalescing chat's queue) is never written
  between a tool call and its result — a provider rejects a user message there — but with the
  append that closes the exchange (:meth:`Exchanges.append_between`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from runtime.llm.types import AgentMessage, AssistantMessage, ToolResultMessage
from runtime.session.turn import SessionWriter

__all__ = ["Exchanges"]

Held = list[tuple[list[AgentMessage], asyncio.Future[None]]]


class Exchanges:
    """The in-flight records and open tool calls of one session's running turns.

    Args:
        writer: ``() -> SessionWriter``: the session's writer at the time of each append (``/new``
            replaces it).

    A turn is identified by any hashable owner object (the core passes its ``TurnControl``).
    """

    def __init__(self, writer: Callable[[], SessionWriter]) -> None:
        self._writer = writer
        self._inflight: dict[int, object] = {}
        self._open_calls: dict[str, object] = {}
        self._held: Held = []

    def visible(self, messages: Sequence[AgentMessage], owner: object) -> list[AgentMessage]:
        """``messages`` without the in-flight records of turns other than ``owner`` (a copy of
        ``messages`` when no turn has records in flight: one turn at a time, the common case,
        does not walk the context; docs/decisions.md#agent-incremental-convert)."""
        if not self._inflight:
            return list(messages)
        return [m for m in messages if self._inflight.get(id(m), owner) is owner]

    def recorder(self, owner: object) -> Callable[[Sequence[AgentMessage]], Awaitable[Any]]:
        """The record function of ``owner``'s turn: appends through the writer, marks its assistant
        messages and tool results in flight and tracks its open tool calls; history held while
        a call was open goes in with the append that closes the last one."""

        async def record(messages: Sequence[AgentMessage]) -> Any:
            for m in messages:
                if isinstance(m, AssistantMessage | ToolResultMessage):
                    self._inflight[id(m)] = owner
                if isinstance(m, AssistantMessage) and m.stop_reason not in ("error", "aborted"):
                    self._open_calls.update((c.id, owner) for c in m.tool_calls())
                elif isinstance(m, ToolResultMessage):
                    self._open_calls.pop(m.tool_call_id, None)
            held = self._take_held()
            try:
                out = await self._writer().append([*messages, *(r for recs, _ in held for r in recs)])
            except Exception as exc:
                _settle(held, exc)
                raise
            _settle(held, None)
            return out

        return record

    async def append_between(self, records: list[AgentMessage]) -> None:
        """Append ``records`` now, or — while a tool call is open — with the append that closes
        the exchange (or when its turn ends), never between a call and its result.

        Raises:
            Whatever the append raises.
        """
        if not self._open_calls:
            await self._writer().append(records)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._held.append((records, fut))
        await fut

    async def end(self, owner: object) -> None:
        """``owner``'s turn ended: its records are no longer in flight and its calls left open
        (aborted, failed) no longer hold anything back; write the history held behind them.
        Never raises (a failed write fails the holders' waits)."""
        self._inflight = {k: v for k, v in self._inflight.items() if v is not owner}
        self._open_calls = {k: v for k, v in self._open_calls.items() if v is not owner}
        held = self._take_held()
        if not held:
            return
        try:
            await self._writer().append([r for recs, _ in held for r in recs])
        except Exception as exc:
            _settle(held, exc)
            return
        _settle(held, None)

    def _take_held(self) -> Held:
        if self._open_calls:
            return []
        held, self._held = self._held, []
        return held


def _settle(held: Held, exc: Exception | None) -> None:
    for _, fut in held:
        if fut.done():
            continue
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)

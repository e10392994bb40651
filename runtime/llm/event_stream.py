"""One generic event stream, :class:`EventStream` ``[T, R]``: an async iterator of events of type
``T`` with an awaitable result of type ``R`` (docs/decisions.md#llm-errors-as-events).

Both event families use it: an LLM call's :class:`runtime.llm.events.AssistantMessageEventStream`
(``T`` an assistant message event, ``R`` the final :class:`~runtime.llm.types.AssistantMessage`)
and an agent loop run (:func:`runtime.agent.loop.agent_loop`: ``T`` an agent event, ``R`` the
messages the run added).

A producer fills it and ends it once:

* :meth:`EventStream.push` appends an event without waiting (an LLM call: a chunk never waits
  for its reader); :meth:`EventStream.send` appends one and returns only when the consumer asks
  for the next event (the agent loop: a consumer that reacts to an event, e.g. aborts, sees the
  loop exactly where that event left it);
* the stream ends on a *terminal* event (``terminal(event)``, its result ``result_of(event)``), on
  :meth:`EventStream.end` with the result, or on :meth:`EventStream.fail` with an exception, which
  iteration raises after the events before it and :meth:`EventStream.result` raises too.

One consumer iterates it (``async for``) and/or awaits :meth:`EventStream.result`; anything pushed
after the end is ignored. A stream filled with :meth:`~EventStream.send` must be iterated (its
producer waits for each event to be taken).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

__all__ = ["EventStream"]

T = TypeVar("T")
R = TypeVar("R")


def _never(event: object) -> bool:
    return False


class EventStream(Generic[T, R]):
    """Single-consumer async stream of ``T`` events with an awaitable ``R`` result.

    Args:
        terminal: Whether an event ends the stream (default: none does; :meth:`end` ends it).
        result_of: The result a terminal event carries (required with ``terminal``).
        cancel_on_close: The consumer owns the producer: when its iteration stops early
            (``break`` and the iterator closed, or :meth:`aclose`), the producer task is
            cancelled (see :meth:`attach`).

    Must be created with a running event loop.
    """

    def __init__(
        self,
        terminal: Callable[[T], bool] = _never,
        result_of: Callable[[T], R] | None = None,
        *,
        cancel_on_close: bool = False,
    ) -> None:
        self._terminal = terminal
        self._result_of = result_of
        self._cancel_on_close = cancel_on_close
        self._buffer: deque[tuple[T, asyncio.Future[None] | None]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._error: BaseException | None = None
        self._result: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ producer

    def push(self, event: T) -> None:
        """Append one event without waiting; a terminal event ends the stream and sets the result."""
        self._append(event, None)

    async def send(self, event: T) -> None:
        """Append one event and return when the consumer asks for the next one (or stops
        iterating); at once after the end."""
        if self._ended:
            return
        taken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._append(event, taken)
        await taken

    def end(self, result: R) -> None:
        """End the stream with ``result`` (nothing when it has ended already)."""
        if not self._ended:
            self._finish(result)
            self._wake()

    def fail(self, error: BaseException) -> None:
        """End the stream with ``error``: iteration raises it after the events before it, and so
        does :meth:`result` (nothing when it has ended already)."""
        if self._ended:
            return
        self._ended, self._error = True, error
        if not self._result.done():
            self._result.set_exception(error)
            self._result.exception()  # retrieved: a stream only iterated does not log it
        self._wake()

    def attach(self, task: asyncio.Task[None]) -> None:
        """Keep the producer ``task`` (referenced while the stream lives; cancelled when an
        iteration of a ``cancel_on_close`` stream stops early)."""
        self._task = task

    @property
    def ended(self) -> bool:
        """True once the stream ended (terminal event, :meth:`end` or :meth:`fail`)."""
        return self._ended

    def _append(self, event: T, taken: asyncio.Future[None] | None) -> None:
        if self._ended:
            return
        self._buffer.append((event, taken))
        if self._terminal(event):
            assert self._result_of is not None, "a stream with terminal events needs result_of"
            self._finish(self._result_of(event))
        self._wake()

    def _finish(self, result: R) -> None:
        self._ended = True
        if not self._result.done():
            self._result.set_result(result)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # ------------------------------------------------------------------ consumer

    def __aiter__(self) -> AsyncIterator[T]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[T]:
        try:
            while True:
                while self._buffer:
                    event, taken = self._buffer.popleft()
                    try:
                        yield event
                    finally:
                        if taken is not None and not taken.done():
                            taken.set_result(None)
                    if self._terminal(event):
                        return
                if self._ended:
                    break
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
                self._waiter = None
            if self._error is not None:
                raise self._error
        finally:
            if self._cancel_on_close and self._task is not None and not self._task.done():
                self._task.cancel()

    async def aclose(self) -> None:
        """Stop a ``cancel_on_close`` stream: cancel its producer and wait for it to stop."""
        task = self._task
        if self._cancel_on_close and task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def result(self) -> R:
        """Wait for the end and return the result; raises the exception of :meth:`fail`."""
        return await asyncio.shield(self._result)

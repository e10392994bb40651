"""Natural batching of calls that cross a process boundary (issue 8 benchmark: throughput).

A :class:`Batcher` turns many concurrent ``submit(item)`` calls into few ``flush(items)`` calls
without adding latency: when nothing is in flight, an item is flushed at once, alone; items that
arrive while a flush is in flight queue and go together in the next flush (at most ``max_batch``
per flush). Under load each Ray call then carries several messages; at rest every message still
travels alone and immediately. This is the group-commit pattern, applied to the
ingress → router call (:meth:`actors.runtime.SessionRuntime.submit`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Batcher"]

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """Group concurrent submissions into batched ``flush`` calls.

    Args:
        flush: ``async (items) -> results``, one result per item, in order. An exception fails
            every item of that batch (each waiting ``submit`` raises it); later batches still run.
        max_batch: Most items per flush (≥ 1).

    Raises:
        ValueError: ``max_batch`` < 1.

    Bound to the event loop of its first use; when used from another loop while a flush is in
    flight there, an item is flushed alone (no batching across loops).
    """

    def __init__(self, flush: Callable[[list[T]], Awaitable[Sequence[R]]], max_batch: int = 64) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._flush = flush
        self.max_batch = max_batch
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._busy = False
        self._drainer: asyncio.Task[None] | None = None
        self.flushes = 0
        """Flush calls made so far (for tests and the benchmark)."""

    async def submit(self, item: T) -> R:
        """Flush ``item`` now if nothing is in flight, else with the next batch; return its result.

        Raises:
            Whatever ``flush`` raised for the batch ``item`` was in, or a ``RuntimeError`` when
            ``flush`` returned a different number of results than items.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._busy:
                return (await self._call([item]))[0]
            self._loop, self._queue = loop, []
        if self._busy:
            fut: asyncio.Future[R] = loop.create_future()
            self._queue.append((item, fut))
            return await fut
        self._busy = True
        try:
            result = (await self._call([item]))[0]
        finally:
            if self._queue:
                self._drainer = loop.create_task(self._drain())  # the caller answers now
            else:
                self._busy = False
        return result

    async def _call(self, items: list[T]) -> Sequence[R]:
        self.flushes += 1
        results = await self._flush(items)
        if len(results) != len(items):
            raise RuntimeError(f"flush returned {len(results)} results for {len(items)} items")
        return results

    async def _drain(self) -> None:
        try:
            while self._queue:
                batch = self._queue[: self.max_batch]
                del self._queue[: self.max_batch]
                try:
                    results = await self._call([item for item, _ in batch])
                except BaseException as exc:  # handed to every waiter of the batch
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                for (_, fut), result in zip(batch, results, strict=True):
                    if not fut.done():
                        fut.set_result(result)
        finally:
            self._busy = False

"""Per-chat chains of one delivery actor (docs/decisions.md#delivery-outage): the work of one chat
runs one item after another, and each chat with work has its own asyncio task, so a send that
waits out an outage holds back only its own chat's later replies.

Two kinds of items: a *drain* (send the chat's unfinished ledger rows in ledger order: what a
notification from a session host or the sweep asks for; several wake-ups while one is queued
count once) and a *call* (a reply handed straight to the actor, e.g. an ingress notice: its
result goes back to the caller). Nothing here touches SQL or Ray.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

__all__ = ["ChatChains"]

T = TypeVar("T")
log = logging.getLogger("sessionray.delivery")

_DRAIN = object()
"""The queue item asking for a drain of the chat's ledger rows."""


class ChatChains:
    """Chains keyed by session key (create and use on one event loop).

    Args:
        drain: ``drain(session_key)`` sends the chat's unfinished ledger rows in order; an
            exception it raises is logged and ends that drain (the next wake-up tries again).
    """

    def __init__(self, drain: Callable[[str], Awaitable[None]]) -> None:
        self._drain = drain
        self._queues: dict[str, deque[Any]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def wake(self, session_key: str) -> None:
        """Queue a drain of ``session_key`` (no-op when one is already waiting in its chain)."""
        queue = self._queues.setdefault(session_key, deque())
        if not queue or queue[-1] is not _DRAIN:
            queue.append(_DRAIN)
        self._ensure(session_key)

    async def run(self, session_key: str, call: Callable[[], Awaitable[T]]) -> T:
        """Run ``call()`` in ``session_key``'s chain (after what is queued there) and return its
        result (or raise its exception)."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(session_key, deque()).append((call, fut))
        self._ensure(session_key)
        return await fut

    @property
    def active(self) -> int:
        """Chats whose chain runs now."""
        return len(self._tasks)

    def _ensure(self, session_key: str) -> None:
        if session_key not in self._tasks:
            self._tasks[session_key] = asyncio.create_task(self._loop(session_key))

    async def _loop(self, session_key: str) -> None:
        queue = self._queues[session_key]
        try:
            while queue:
                item = queue.popleft()
                if item is _DRAIN:
                    try:
                        await self._drain(session_key)
                    except Exception:
                        log.exception(
                            "delivery of %s stopped; the next wake-up or sweep resumes it", session_key
                        )
                    continue
                call, fut = item
                try:
                    result = await call()
                except asyncio.CancelledError:  # the chain is closed: its caller must not wait on
                    if not fut.done():
                        fut.cancel()
                    raise
                except Exception as exc:
                    if not fut.done():
                        fut.set_exception(exc)
                else:
                    if not fut.done():
                        fut.set_result(result)
        finally:
            self._tasks.pop(session_key, None)
            for item in queue:  # only when cancelled: nobody runs these any more
                if item is not _DRAIN and not item[1].done():
                    item[1].cancel()
            queue.clear()
            self._queues.pop(session_key, None)

    async def close(self) -> None:
        """Cancel every chain and wait for them to end."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

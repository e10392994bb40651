"""Per-session-key ordering of concurrent calls (docs/decisions.md#session-ordered-inbox).

Plain asyncio, no Ray: a router shard and each ingress process
(:class:`actors.placement.runtime.SessionRuntime`) own one :class:`KeyOrder`, and unit tests drive it
directly.

* :class:`KeyOrder` — per-session-key tickets: concurrent calls of one key pass one at a time in
  arrival order, so the host stamps their sequence numbers in arrival order even when the first
  must wait for a placement.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["KeyOrder"]


class KeyOrder:
    """Per-session-key tickets in arrival order (docs/decisions.md#session-ordered-inbox: the router
    stamps each message with the session's next seq; Ray does not order calls to an async actor, so
    *arrival* at the shard's event loop is the order a platform's redelivery-free stream gives).

    ``async with order.turn(key):`` — the ticket is taken when :meth:`turn` is *called* (do it
    before the first ``await`` of the handler); the body runs once every earlier ticket of the key
    left its body (or was cancelled while waiting).
    """

    def __init__(self) -> None:
        self._tail: dict[str, asyncio.Future[None]] = {}

    def turn(self, key: str) -> _Turn:
        """Take the next ticket of ``key`` now; enter the returned context to wait for it."""
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        prev = self._tail.get(key)
        self._tail[key] = mine
        return _Turn(self, key, prev, mine)

    def waiting(self, key: str) -> bool:
        """Whether a ticket of ``key`` is taken and not yet released."""
        return key in self._tail

    def _release(self, key: str, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self._tail.get(key) is mine:
            del self._tail[key]


class _Turn:
    def __init__(
        self, owner: KeyOrder, key: str, prev: asyncio.Future[None] | None, mine: asyncio.Future[None]
    ) -> None:
        self._owner, self._key, self._prev, self._mine = owner, key, prev, mine

    async def __aenter__(self) -> None:
        prev = self._prev
        if prev is None or prev.done():
            return
        try:
            await asyncio.wait({prev})  # never cancels ``prev`` (a plain await would)
        except BaseException:
            # Cancelled while waiting: our successors must still wait for ``prev``.
            prev.add_done_callback(lambda _: self._owner._release(self._key, self._mine))
            raise

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._owner._release(self._key, self._mine)

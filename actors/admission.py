"""Admission bookkeeping of a router shard: the cap of live sessions
(docs/decisions.md#session-lifecycle).

Plain asyncio, no Ray: :class:`~actors.router.RouterActor` owns one of each and unit tests drive
them directly.

* :class:`Live` — the shard's directory entry of one live (or activating / passivating) session.
* :class:`SlotQueue` — the ``ceil(max_live_sessions / N)`` slots of a shard. A new session takes a
  free slot at once only when nobody waits; otherwise it queues, and every slot that frees goes to
  the **oldest** waiter (FIFO, one future per waiter — no shared event, no thundering herd). A slot
  freed while nobody waits stays free (no lost wake-up). A granted slot is *reserved* until the
  waiter turns it into a directory entry, so a newcomer cannot take it in between. A slot freed by
  an LRU passivation can carry the passivated, now blank, actor (:class:`Grant`): the waiter
  activates its session on it without a pool ``release`` / ``acquire`` round trip.
* :class:`KeyOrder` — per-session-key tickets: concurrent ``submit`` calls of one key pass the
  admission one at a time in arrival order, so their sequence numbers follow arrival order even
  when the first must wait for a slot.
* :func:`should_recycle` — the warm pool's recycling rule (``runtime.recycle_after_sessions``,
  ``runtime.recycle_memory_mib``), which a handed-over actor must obey too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from runtime.session.turn import TurnInput

__all__ = ["Grant", "KeyOrder", "Live", "SlotQueue", "should_recycle"]


@dataclass
class Live:
    """The shard's view of one live (or activating, or passivating) session.

    ``next_seq``: the seq the next accepted message gets; ``pending``: accepted messages whose turn
    has not handed its reply to delivery, by seq; ``ready``: the activation task; ``generation``:
    bumped by each crash re-bind; ``last_used``: ``time.monotonic()`` of the last activity (LRU);
    ``refused_until``: monotonic time before which an LRU passivation is not tried again (the actor
    refused the last one: a control turn was still running); ``since``: monotonic time each pending
    seq was handed to the actor; ``probed_at``: last hung-turn ping of the actor.
    """

    key: str
    actor: Any = None
    session_id: str = ""
    next_seq: int = 1
    pending: dict[int, TurnInput] = field(default_factory=dict)
    ready: asyncio.Task[None] | None = None
    generation: int = 0
    last_used: float = field(default_factory=time.monotonic)
    turns: int = 0
    passivating: bool = False
    passivation: asyncio.Event | None = None
    refused_until: float = 0.0
    since: dict[int, float] = field(default_factory=dict)
    probed_at: float = 0.0

    @property
    def idle(self) -> bool:
        """No accepted message pending, activation done, no passivation in flight."""
        return not self.pending and self.ready is not None and self.ready.done() and not self.passivating


def should_recycle(sessions_served: int, uss_mib: float, after_sessions: int, memory_mib: float) -> bool:
    """The warm pool's recycling rule (``PoolSupervisor.release``): a blank actor that served
    ``after_sessions`` sessions or whose process USS is above ``memory_mib`` MiB is replaced."""
    return sessions_served >= after_sessions or uss_mib > memory_mib


@dataclass
class Grant:
    """A slot granted to one new session; ``actor``: a blank, passivated session actor handed
    over with it (``None``: take one from the warm pool)."""

    actor: Any = None


class SlotQueue:
    """FIFO admission to ``cap`` live-session slots.

    Args:
        cap: Slots of this shard (≥ 1).
        occupied: Returns how many slots the directory holds now (its entries, passivating ones
            included: a slot is free only once its passivation ended).
        unused_actor: Called with a handed-over actor nobody took (a waiter left with it); the
            owner returns it to the warm pool.
    """

    def __init__(self, cap: int, occupied: Callable[[], int], unused_actor: Callable[[Any], None]) -> None:
        self.cap = cap
        self._occupied = occupied
        self._unused_actor = unused_actor
        self._waiters: deque[asyncio.Future[Grant]] = deque()
        self.reserved = 0
        """Slots granted to a waiter that has not bound its session yet."""

    @property
    def waiting(self) -> int:
        """New sessions waiting for a slot."""
        return len(self._waiters)

    def free(self) -> int:
        """Slots neither held by a directory entry nor reserved (may be ≤ 0)."""
        return self.cap - self._occupied() - self.reserved

    def try_take(self) -> Grant | None:
        """A slot at once when one is free and nobody waits (FIFO), else ``None``. The caller must
        :meth:`consume` the grant (bind its session) or :meth:`give_back` it."""
        if self._waiters or self.free() <= 0:
            return None
        self.reserved += 1
        return Grant()

    async def wait(self, timeout_s: float) -> Grant | None:
        """Queue for the next free slot; the grant, or ``None`` after ``timeout_s`` seconds.

        A grant that arrives while the caller is cancelled is passed on to the next waiter."""
        fut: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait({fut}, timeout=max(0.0, timeout_s))
        except BaseException:
            self._leave(fut)
            raise
        if fut.done():
            return fut.result()
        self._leave(fut)
        return None

    def _leave(self, fut: asyncio.Future[Grant]) -> None:
        if fut.done():
            self.give_back(fut.result())
            return
        fut.cancel()
        with contextlib.suppress(ValueError):  # only offer() pops, and it resolves what it pops
            self._waiters.remove(fut)

    def offer(self, actor: Any = None) -> bool:
        """Slots were freed: grant free ones to the oldest waiters, the first with ``actor`` (a
        blank actor handed over). Returns whether ``actor`` was taken; when it was not, the
        caller keeps it (returns it to the pool)."""
        taken = actor is None
        while self._waiters and self.free() > 0:
            fut = self._waiters.popleft()
            self.reserved += 1
            fut.set_result(Grant(None if taken else actor))
            taken = True
        return taken

    def consume(self, grant: Grant) -> None:
        """The grant became a directory entry (call right after adding it, without an await)."""
        del grant
        self.reserved -= 1

    def give_back(self, grant: Grant) -> None:
        """The grant is not used: its slot (and actor) goes to the next waiter or is freed."""
        self.reserved -= 1
        if not self.offer(grant.actor):
            self._unused_actor(grant.actor)


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

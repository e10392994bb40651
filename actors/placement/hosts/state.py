"""A session host's record of one live session, and the errors of a host
(docs/decisions.md#session-hosts), and small helpers of the host. No Ray:
:mod:`actors.placement.hosts.host` keeps one :class:`LiveSession` per live
:class:`~runtime.session.core.SessionCore`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.session.control import UnknownSessionError

if TYPE_CHECKING:
    from runtime.session.turn import TurnResult

__all__ = [
    "FRESH_S",
    "ROOM_RECHECK_S",
    "HostFullError",
    "LiveSession",
    "RoomWaiters",
    "SessionNotBoundError",
    "current_pid",
    "evictable",
    "host_row",
    "oldest_idle_s",
    "recorded",
    "session_rows",
    "shielded",
]

FRESH_S = 5.0
"""Seconds a just activated session is not evicted before its first message (its caller sends it)."""
ROOM_RECHECK_S = 0.5
"""An activation waiting for room looks again at least this often, in seconds (a fresh session
becomes evictable after ``FRESH_S`` without any turn ending)."""


class SessionNotBoundError(UnknownSessionError):
    """A control call reached a host that does not hold the session (passivated or moved)."""


class HostFullError(RuntimeError):
    """The host is at its capacity (sessions or memory) and may not (or cannot) passivate an idle
    session for a new one."""


class RoomWaiters:
    """Activations of one host waiting for room at its cap (actors/placement/hosts/host.py): each waits on a
    future of the host's loop; :meth:`wake_one` (a session turned idle or left) wakes the oldest."""

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def wait(self, timeout_s: float) -> None:
        """Wait until :meth:`wake_one` picks this waiter or ``timeout_s`` seconds passed."""
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(fut)

    def wake_one(self) -> None:
        """Wake the oldest waiter still waiting (none: nothing happens)."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return


@dataclass
class LiveSession:
    core: Any
    epoch: int
    router: str
    """Name of the session's router shard (told on passivation)."""
    next_seq: int = 1
    pending: int = 0
    last_used: float = field(default_factory=time.monotonic)
    turns: int = 0
    fresh: bool = True
    """Activated and no message arrived yet: evicted only when no other session is idle (its
    first message is on the way from the caller that placed it)."""

    @property
    def idle(self) -> bool:
        return self.pending == 0 and bool(self.core.idle)


def evictable(live: dict[str, LiveSession], now: float) -> list[tuple[bool, float, str]]:
    """``(fresh, last_used, key)`` of each session an eviction may passivate at ``now``
    (monotonic s): idle, and not just activated and still waiting for its first message."""
    idle = [(s.fresh, s.last_used, k) for k, s in list(live.items()) if s.idle]
    return [v for v in idle if not v[0] or now - v[1] > FRESH_S]


def oldest_idle_s(live: dict[str, LiveSession], now: float) -> float:
    """Seconds since the least recently used :func:`evictable` session was used (0.0: none); the
    router evicts on the host with the oldest one first (close to a global LRU)."""
    return max((now - last_used for _, last_used, _ in evictable(live, now)), default=0.0)


def host_row(
    index: int, cap: int, uss_mib: float, live: dict[str, LiveSession], stats: dict[str, int]
) -> dict[str, Any]:
    """A host's status: ``{"index", "pid", "live", "in_flight", "oldest_idle_s", "cap", "uss_mib",
    **stats}`` — ``in_flight``: accepted messages of its sessions whose turn has not ended, whoever
    sent them (an ingress, a router shard's inbox recovery)."""
    return {
        "index": index,
        "pid": os.getpid(),
        "live": len(live),
        "in_flight": sum(s.pending for s in list(live.values())),
        "oldest_idle_s": round(oldest_idle_s(live, time.monotonic()), 3),
        "cap": cap,
        "uss_mib": round(uss_mib, 2),
        **stats,
    }


def session_rows(live: dict[str, LiveSession], keys: list[str] | None, now: float) -> list[dict[str, Any]]:
    """Per live session (all, or those of ``keys``): ``session_key``, ``session_id``, ``epoch``,
    ``pending``, ``turns``, ``idle_s``."""
    wanted = list(live) if keys is None else [k for k in keys if k in live]
    return [
        {
            "session_key": k,
            "session_id": live[k].core.session_id,
            "epoch": live[k].epoch,
            "pending": live[k].pending,
            "turns": live[k].turns,
            "idle_s": round(now - live[k].last_used, 3),
        }
        for k in wanted
    ]


def recorded(live: LiveSession, message_id: str) -> bool:
    """Whether the session's loaded context already records a turn of ``message_id`` (its inbound
    marker): a redelivery that arrives after the session was passivated or moved hosts is a
    duplicate too, not only one this host's dedup window saw."""
    from runtime.session.turn import INBOUND_MARKER

    return live.core.writer.marker(INBOUND_MARKER, message_id) is not None


def answered(live: LiveSession, message_id: str) -> bool:
    """Whether the session's context records the reply of ``message_id`` (its reply marker, written
    with the reply's ledger row): only then is a duplicate of it *handled* in the inbox. A duplicate
    of a turn still running, or cut off by a crash, is not (docs/decisions.md#inbox-durable)."""
    from runtime.session.turn import REPLY_MARKER

    return live.core.writer.marker(REPLY_MARKER, message_id) is not None


async def current_pid() -> int:
    """This process's id, answered on the loop that runs the coroutine (a liveness probe)."""
    return os.getpid()


async def shielded(task: asyncio.Task[TurnResult]) -> TurnResult:
    """The turn's result; a caller that goes away never cancels the turn."""
    return await asyncio.shield(task)

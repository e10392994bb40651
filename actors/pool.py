"""The warm pool supervisor: blank ``SessionActor`` s ready to be bound
(docs/decisions.md#session-warm-pool).

Why (measured, docs/benchmarks.md): creating an actor costs a process start (0.45–0.65 s); binding a
pre-created blank actor is one call (p50 ≈ 3 ms). So activation takes an actor from here and
passivation gives it back; process churn happens only when the pool grows, shrinks or recycles.

* ``PoolSupervisor`` is a **detached** named actor (``sessionray-pool`` in namespace
  ``sessionray``): the session actors it creates are owned by it, so they do not die with a
  router (non-detached actors die with their creator).
* It keeps ``warm_pool`` (config ``runtime.warm_pool``) blank actors ready and refills in the
  background after each acquire; an empty pool means a *cold* actor is created on the spot
  (counted in ``sessionray_warm_pool_exhausted_total``). A passivated actor comes back to the
  pool, which keeps up to ``warm_pool + max(1, warm_pool // 2)`` of them, so the LRU churn at the
  live-session cap reuses processes instead of killing one and starting one per message.
* Recycling: an actor returned after serving ``recycle_after_sessions`` sessions, or whose
  process is above ``recycle_memory_mib`` (USS), is killed and replaced by a fresh one.
* Dead members: a warm actor that fails its health ping is replaced; an actor the router reports
  dead (its process was killed; with ``max_restarts`` Ray restarts it blank) is pinged and, once
  back, reused; otherwise killed and replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

import ray

from actors.admission import should_recycle
from actors.session_actor import SessionActor
from runtime import metrics
from runtime.config import Config
from runtime.session.turn import SetupFactory

__all__ = ["NAMESPACE", "POOL_NAME", "PoolSupervisor", "actor_key"]

NAMESPACE = "sessionray"
POOL_NAME = "sessionray-pool"

PING_TIMEOUT_S = 60.0
"""Bound on a new actor's first answer (process start; slow on a loaded 2-core machine)."""
HEALTH_INTERVAL_S = 5.0


def actor_key(handle: Any) -> str:
    """A stable id of an actor handle (its Ray actor id, hex)."""
    return str(handle._actor_id.hex())


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class PoolSupervisor:
    """Keeps blank session actors warm; hands them out and takes them back.

    Args:
        config: ``runtime.config.Config``, passed on to every session actor; its ``runtime``
            section gives the pool's knobs: ``warm_pool`` (blank actors kept ready; 0 disables
            warming), ``recycle_after_sessions`` (kill an actor after it served this many
            sessions) and ``recycle_memory_mib`` (kill an actor whose USS is above this many MiB
            when returned).
        setup_factory: Passed by value to every session actor (see ``SessionActor``).
        delivery: The delivery pool handle passed to every session actor.
    """

    def __init__(self, config: Config, setup_factory: SetupFactory, delivery: Any) -> None:
        with contextlib.suppress(Exception):
            from actors.ray_metrics import install_ray_metrics

            install_ray_metrics()
        self._args = (config, setup_factory, delivery)
        rt = config.runtime
        self.size = rt.warm_pool
        self.spare = max(1, self.size // 2) if self.size > 0 else 0
        """Released actors kept above ``size``: at the live-session cap every new session
        passivates an idle one and then takes an actor; without room for the returned actor the
        pool would kill it and start a new process (≈ 2.5 s of CPU) for each such message."""
        self.recycle_after_sessions = rt.recycle_after_sessions
        self.recycle_memory_mib = rt.recycle_memory_mib
        self._warm: deque[Any] = deque()
        self._all: dict[str, Any] = {}
        self._creating = 0
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self.stats = {"created": 0, "warm_acquired": 0, "cold_acquired": 0, "recycled": 0, "replaced": 0}

    # ------------------------------------------------------------------ lifecycle

    async def start(self, wait: bool = False, timeout_s: float = 60.0) -> int:
        """Start the refill and health loops (idempotent). With ``wait``, return once the pool is
        full or ``timeout_s`` passed. Returns the number of warm actors."""
        if self._wake is None:
            self._wake = asyncio.Event()
            self._tasks = [asyncio.create_task(self._refill_loop()), asyncio.create_task(self._health_loop())]
            self._wake.set()
        if wait:
            deadline = time.monotonic() + timeout_s
            while len(self._warm) < self.size and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        return len(self._warm)

    async def shutdown(self) -> int:
        """Kill every actor of the pool (warm and bound); returns how many."""
        for t in self._tasks:
            t.cancel()
        n = 0
        for h in list(self._all.values()):
            with contextlib.suppress(Exception):
                ray.kill(h, no_restart=True)
                n += 1
        self._all.clear()
        self._warm.clear()
        return n

    def _create(self) -> Any:
        h = SessionActor.remote(*self._args)  # type: ignore[attr-defined]
        self._all[actor_key(h)] = h
        self.stats["created"] += 1
        return h

    async def _refill_loop(self) -> None:
        assert self._wake is not None
        backoff = 0.5
        while True:
            await self._wake.wait()
            self._wake.clear()
            while len(self._warm) + self._creating < self.size:
                self._creating += 1
                h = None
                try:
                    h = self._create()
                    await _ready(h)
                    self._warm.append(h)
                    backoff = 0.5
                except Exception:
                    if h is not None:  # never leave a half-started process behind (no spiral under load)
                        self._kill(h)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
                finally:
                    self._creating -= 1
                metrics.WARM_POOL_SIZE.set(len(self._warm))

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            for h in list(self._warm):
                if not await self._alive(h, timeout_s=30.0):
                    with contextlib.suppress(ValueError):
                        self._warm.remove(h)
                    self._kill(h)
                    self.stats["replaced"] += 1
            self._poke()

    async def _alive(self, h: Any, timeout_s: float = PING_TIMEOUT_S) -> bool:
        try:
            await _ready(h, timeout_s)
            return True
        except Exception:
            return False

    def _kill(self, h: Any) -> None:
        self._all.pop(actor_key(h), None)
        with contextlib.suppress(Exception):
            ray.kill(h, no_restart=True)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ acquire / release

    async def acquire(self) -> tuple[Any, str]:
        """Take a blank actor: ``(handle, "warm")`` from the pool, or ``(handle, "cold")`` created
        now when the pool is empty (then counted as exhausted).

        Raises:
            ray.exceptions.GetTimeoutError-like errors if a cold actor cannot start.
        """
        self._poke()
        while self._warm:
            h = self._warm.popleft()
            metrics.WARM_POOL_SIZE.set(len(self._warm))
            self.stats["warm_acquired"] += 1
            return h, "warm"
        metrics.WARM_POOL_EXHAUSTED.inc()
        h = self._create()
        try:
            await _ready(h)
        except BaseException:
            self._kill(h)
            raise
        self.stats["cold_acquired"] += 1
        return h, "cold"

    async def release(self, handle: Any, sessions_served: int = 0, uss_mib: float = 0.0) -> str:
        """Return a passivated (blank) actor. Returns ``"warm"`` (kept, up to ``size + spare``
        warm actors), ``"recycled"`` (served ``recycle_after_sessions`` or above
        ``recycle_memory_mib``) or ``"surplus"`` (pool full: killed)."""
        if should_recycle(sessions_served, uss_mib, self.recycle_after_sessions, self.recycle_memory_mib):
            self._kill(handle)
            self.stats["recycled"] += 1
            self._poke()
            return "recycled"
        if len(self._warm) >= self.size + self.spare:
            self._kill(handle)
            return "surplus"
        self._warm.append(handle)
        metrics.WARM_POOL_SIZE.set(len(self._warm))
        return "warm"

    async def report_dead(self, handle: Any) -> str:
        """The router saw ``handle`` die mid-call. Ray restarts it blank (``max_restarts``); if it
        answers a ping it is reused, else it is killed and replaced. Returns ``reused``/``replaced``."""
        if await self._alive(handle):
            return await self.release(handle)
        self._kill(handle)
        self.stats["replaced"] += 1
        self._poke()
        return "replaced"

    async def warm_pids(self, timeout_s: float = 5.0) -> list[int | None]:
        """Process ids of the warm actors (``None`` for one that did not answer in ``timeout_s``)."""

        async def pid(h: Any) -> int | None:
            try:
                return int(await asyncio.wait_for(h.ping.remote(), timeout_s))
            except Exception:
                return None

        return list(await asyncio.gather(*(pid(h) for h in list(self._warm))))

    async def status(self) -> dict[str, Any]:
        """``{"warm", "target", "actors" (all, warm + bound), "creating", **stats}``."""
        return {
            "warm": len(self._warm),
            "target": self.size,
            "actors": len(self._all),
            "creating": self._creating,
            **self.stats,
        }


async def _ready(h: Any, timeout_s: float = PING_TIMEOUT_S) -> None:
    """Both concurrency groups of session actor ``h`` answer (``ping``: control, after the
    warm-up; ``ping_turn``: turn) within ``timeout_s`` each.

    Raises:
        TimeoutError: a group did not answer (its event-loop thread may have died at start-up).
        ray.exceptions.RayActorError: the actor died.
    """
    await asyncio.wait_for(h.ping.remote(), timeout_s)
    await asyncio.wait_for(h.ping_turn.remote(), timeout_s)

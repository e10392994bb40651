"""The host supervisor: the session hosts of a runtime, started ahead of need
(docs/decisions.md#session-hosts).

``HostSupervisor`` is a **detached** named actor (``{prefix}-hosts`` in namespace ``sessionray``):
the :class:`~actors.placement.hosts.host.SessionHost` s it creates are owned by it, so they outlive a
router shard or ingress. It

* starts ``runtime.min_hosts`` hosts at once and keeps at least
  :func:`headroom` free session slots by starting another host in the background whenever the
  hosts fill up, up to :func:`host_capacity`'s host limit — so in steady state no activation waits
  for a process start (a host created while an activation waits is counted in
  ``sessionray_hosts_cold_total``);
* checks every host each ``HEALTH_S``: its ``status`` (live sessions, USS; published as
  ``sessionray_host_live_sessions`` / ``sessionray_host_memory_bytes``) and, every
  ``TURN_PROBE_S``, its ``ping_turn`` within ``runtime.hung_ping_timeout_s`` — a host whose sessions'
  event loop stopped answering is killed; the callers of its turns then take the crash path;
* hands the router shards the list of hosts (:meth:`HostSupervisor.hosts`), creates one on request
  when all are full (:meth:`HostSupervisor.grow`) and replaces a host a shard reports dead.

Placement itself (which host a session goes to) is the router shard's (``actors/placement/router.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from actors.placement.hosts.host import SessionHost
from runtime import metrics
from runtime.config import Config, RuntimeConfig

if TYPE_CHECKING:
    from runtime.session.turn import SetupFactory

__all__ = ["NAMESPACE", "HostSupervisor", "actor_key", "headroom", "host_capacity"]

log = logging.getLogger("sessionray.hosts")

NAMESPACE = "sessionray"
READY_TIMEOUT_S = 300.0
"""Bound on a new host's first answer, in seconds (process start and warm-up; minutes on a loaded
2-core machine: a host that is merely slow is waited for, one whose process died is dropped)."""
STARTS_AT_ONCE = 2
"""Hosts started ahead of need at the same time (a host wanted now by :meth:`HostSupervisor.grow`
is started regardless)."""
TAKE_OVER_AGAIN_S = 5.0
"""Seconds after a removed host's first take-over (``runtime.deliver_in_host``) that the delivery
actors take over its replies once more: ``ray.kill`` returns before the process is gone, and a
head it claimed in between would otherwise wait for its lease (docs/decisions.md#delivery-in-host)."""
HEALTH_S = 1.0
HOSTS_UNPINNABLE_S = 300.0
"""After a host pinned to a node failed to start there, no host is pinned to that node for this
long, in seconds."""
TURN_PROBE_S = 5.0


def _node_for(index: int, unpinnable: dict[str, float]) -> tuple[Any, str | None]:
    """Where host ``index`` goes: the alive nodes in turn, so the hosts — and the sessions placed
    on them — spread over a cluster. Pinned (hard node affinity): Ray 2.60's *soft* affinity put
    an actor on the driver's node although the target node was alive and had room (measured on a
    two-node cluster). A node where a pinned host failed to start recently (``unpinnable``: node
    id → until, monotonic s) is left out. Returns ``(scheduling strategy, target node id)``; one
    usable node: Ray's default placement, None."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    alive = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    now = time.monotonic()
    usable = [n for n in alive if unpinnable.get(n, 0.0) < now]
    if len(alive) < 2 or not usable:
        return "DEFAULT", None
    target = usable[index % len(usable)]
    return NodeAffinitySchedulingStrategy(node_id=target, soft=False), target


def actor_key(handle: Any) -> str:
    """A stable id of an actor handle (its Ray actor id, hex)."""
    return str(handle._actor_id.hex())


def host_capacity(rt: RuntimeConfig) -> tuple[int, int]:
    """``(sessions per host, most hosts)`` for the ``runtime`` section: the formula's one home is
    :meth:`runtime.config.RuntimeConfig.host_capacity` (the PostgreSQL connection budget in
    ``runtime/memory`` counts the same hosts)."""
    return rt.host_capacity()


def headroom(rt: RuntimeConfig) -> int:
    """Free session slots the supervisor keeps by starting hosts ahead of need:
    ``max(min_hosts, ceil(cap / 4))`` (strict mode: ``min_hosts`` empty hosts)."""
    cap, _ = host_capacity(rt)
    return max(rt.min_hosts, math.ceil(cap / 4))


@dataclass
class _Host:
    handle: Any
    index: int
    live: int = 0
    oldest_idle_s: float = 0.0
    uss_mib: float = 0.0
    ready: bool = False
    probed_at: float = 0.0
    target: str | None = None
    """The node id the host is pinned to (None: Ray's default placement)."""


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class HostSupervisor:
    """Starts, watches and replaces the session hosts.

    Args:
        config: ``runtime.config.Config``, passed to every host.
        setup_factory: Passed by value to every host (``(session_key) -> SessionSetup``).
        delivery: The delivery pool handle passed to every host.
    """

    def __init__(self, config: Config, setup_factory: SetupFactory, delivery: Any) -> None:
        with contextlib.suppress(Exception):
            from actors.raylife.metrics import install_ray_metrics

            install_ray_metrics()
        self._args = (config, setup_factory, delivery)
        self.rt = config.runtime
        self.cap, self.most = host_capacity(self.rt)
        self.headroom = min(headroom(self.rt), self.cap * self.most)
        self._hosts: dict[str, _Host] = {}
        self._creating: dict[str, asyncio.Task[_Host | None]] = {}
        self._claims: dict[str, int] = {}
        """Starting host → callers of :meth:`grow` waiting for it (each takes one of its slots)."""
        self._tasks: list[asyncio.Task[Any]] = []
        self._probes: set[asyncio.Task[None]] = set()
        self._closing = False
        self._unpinnable: dict[str, float] = {}
        """Node id → until when (monotonic s) no host is pinned there (a pinned start failed)."""
        self.stats = {"created": 0, "cold": 0, "replaced": 0, "hung": 0}
        self.incarnation = uuid.uuid4().hex[:12]
        """Names this incarnation in its hosts' ledger owner ids
        (``runtime.delivery.owners.host_owner``): at its start it hands on every other host's rows."""
        # Each incarnation starts itself: after a crash Ray restarts this actor (``max_restarts=-1``)
        # and nobody calls start() again. __init__ runs on the actor's event loop in Ray 2.60; were
        # it not, the first call from a router shard starts it.
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().call_soon(self._begin)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, wait: bool = False, timeout_s: float = READY_TIMEOUT_S) -> int:
        """Start ``min_hosts`` hosts and the health loop (idempotent); with ``wait``, return once
        they answer (or ``timeout_s`` passed). Returns the number of ready hosts."""
        self._begin()
        if wait and self._creating:
            await asyncio.wait(set(self._creating.values()), timeout=timeout_s)
        return sum(1 for h in self._hosts.values() if h.ready)

    def _begin(self) -> None:
        """:meth:`start`'s work, once per incarnation: the health loop, ``min_hosts`` hosts, and
        the replies of hosts that are gone to the delivery actors (:meth:`_take_over`)."""
        if self._tasks:
            return
        self._tasks = [asyncio.create_task(self._health_loop())]
        try:
            for _ in range(max(0, self.rt.min_hosts - len(self._hosts) - len(self._creating))):
                self._spawn_host()
        finally:  # a host that failed to start is the health loop's; the replies are not
            self._take_over(None)

    async def shutdown(self) -> int:
        """Close every host's sessions and kill the hosts; returns how many hosts there were."""
        self._closing = True
        for t in [*self._tasks, *self._creating.values(), *self._probes]:
            t.cancel()
        hosts = list(self._hosts.values())
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(h.handle.shutdown.remote() for h in hosts), return_exceptions=True), 15.0
            )
        for h in hosts:
            with contextlib.suppress(Exception):
                ray.kill(h.handle, no_restart=True)
        self._hosts.clear()
        metrics.HOSTS.set(0)
        return len(hosts)

    def _free_index(self) -> int:
        used = {h.index for h in self._hosts.values()}
        return next(i for i in range(len(used) + 1) if i not in used)

    def _spawn_host(self) -> str:
        """Start one host; returns its key in ``_hosts`` / ``_creating``."""
        index = self._free_index()
        strategy, target = _node_for(index, self._unpinnable)
        handle = SessionHost.options(scheduling_strategy=strategy).remote(  # type: ignore[attr-defined]
            *self._args, self.cap, index, incarnation=self.incarnation
        )
        key = actor_key(handle)
        host = self._hosts[key] = _Host(handle, index, target=target)
        self.stats["created"] += 1
        task = asyncio.create_task(self._await_ready(key, host))
        self._creating[key] = task
        task.add_done_callback(lambda _: self._creating.pop(key, None))
        return key

    async def _await_ready(self, key: str, host: _Host) -> _Host | None:
        try:
            await asyncio.wait_for(host.handle.ping.remote(), READY_TIMEOUT_S)
            await asyncio.wait_for(host.handle.ping_turn.remote(), READY_TIMEOUT_S)
        except Exception:
            if not self._closing:
                log.warning("session host %s did not start; killing it", host.index, exc_info=True)
                if host.target is not None:  # a node that cannot start it: not pinned there for a while
                    self._unpinnable[host.target] = time.monotonic() + HOSTS_UNPINNABLE_S
            self._remove(key)
            return None
        host.ready = True
        metrics.HOSTS.set(sum(1 for h in self._hosts.values() if h.ready))
        return host

    def _remove(self, key: str) -> None:
        host = self._hosts.pop(key, None)
        if host is not None:
            with contextlib.suppress(Exception):
                ray.kill(host.handle, no_restart=True)
            metrics.HOST_LIVE_SESSIONS.set(0, host=str(host.index))
            if self.rt.deliver_in_host:  # the head replies it was sending: to the delivery actors
                self._take_over(key)
        metrics.HOSTS.set(sum(1 for h in self._hosts.values() if h.ready))

    def _take_over(self, key: str | None) -> None:
        """Hand the replies that session hosts were sending themselves to the delivery actors
        (docs/decisions.md#delivery-in-host), now and again :data:`TAKE_OVER_AGAIN_S` later:
        those of the removed host ``key`` (``DeliveryPool.take_over``); None, at this
        incarnation's start, those of every host that is not one of its own
        (``DeliveryPool.take_over_orphans``): the hosts of its previous incarnation died with it,
        and their head replies would wait for their leases (60 s) and the next sweep."""
        from runtime.delivery.owners import host_owner, incarnation_prefix

        pool = self._args[2]
        if key is not None and hasattr(pool, "take_over"):
            call = functools.partial(pool.take_over, host_owner(self.incarnation, key))
        elif key is None and hasattr(pool, "take_over_orphans"):
            call = functools.partial(pool.take_over_orphans, incarnation_prefix(self.incarnation))
        else:
            return
        call()
        # ray.kill returns before the process is gone: a head it claimed meanwhile is taken then
        with contextlib.suppress(RuntimeError):  # no running loop (not in the actor)
            asyncio.get_running_loop().call_later(TAKE_OVER_AGAIN_S, call)

    def _top_up(self) -> None:
        """Start hosts until ``min_hosts`` exist and ``headroom`` slots are free (up to the limit),
        at most ``STARTS_AT_ONCE`` at a time (process starts compete for the same cores)."""
        while len(self._hosts) < self.most and len(self._creating) < STARTS_AT_ONCE:
            free = sum(self.cap - h.live for h in self._hosts.values())
            if len(self._hosts) >= self.rt.min_hosts and free >= self.headroom:
                return
            self._spawn_host()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_S)
            try:
                await self._check_all()
                self._top_up()
            except Exception:  # pragma: no cover - logged; the loop keeps running
                log.exception("host health check failed")

    async def _check_all(self) -> None:
        now = time.monotonic()
        ready = [(k, h) for k, h in self._hosts.items() if h.ready]
        answers = await asyncio.gather(
            *(asyncio.wait_for(h.handle.status.remote(), self.rt.hung_ping_timeout_s) for _, h in ready),
            return_exceptions=True,
        )
        for (key, host), answer in zip(ready, answers, strict=True):
            if self._hosts.get(key) is not host:  # removed meanwhile (hung probe, report_dead)
                continue
            if isinstance(answer, TimeoutError):  # busy or hung: the ping_turn probe decides
                log.info("session host %s: status not answered within the bound", host.index)
            elif isinstance(answer, BaseException):
                log.warning("session host %s does not answer (%r); replacing it", host.index, answer)
                self.stats["replaced"] += 1
                self._remove(key)
                continue
            else:
                host.live, host.uss_mib = int(answer["live"]), float(answer["uss_mib"])
                host.oldest_idle_s = float(answer.get("oldest_idle_s", 0.0))
            if now - host.probed_at >= TURN_PROBE_S or isinstance(answer, TimeoutError):
                host.probed_at = now
                probe = asyncio.create_task(self._probe_turn(key, host))
                self._probes.add(probe)
                probe.add_done_callback(self._probes.discard)

    async def _probe_turn(self, key: str, host: _Host) -> None:
        try:
            await asyncio.wait_for(host.handle.ping_turn.remote(), self.rt.hung_ping_timeout_s)
        except TimeoutError:
            if self._hosts.get(key) is host:
                log.warning(
                    "session host %s: its sessions' loop did not answer within %.1f s; killing it "
                    "(its sessions are re-activated elsewhere, interrupted turns retried once)",
                    host.index,
                    self.rt.hung_ping_timeout_s,
                )
                self.stats["hung"] += 1
                self._remove(key)
        except Exception:  # died meanwhile: the status check removes it
            return

    # ------------------------------------------------------------------ for the router shards

    async def hosts(self) -> list[dict[str, Any]]:
        """The ready hosts: ``[{"host_id", "handle", "index", "live", "oldest_idle_s", "cap"}]``
        (``live`` and ``oldest_idle_s`` as of the last health check)."""
        self._begin()
        return [self._row(k, h) for k, h in self._hosts.items() if h.ready]

    def _row(self, key: str, h: _Host) -> dict[str, Any]:
        return {
            "host_id": key,
            "handle": h.handle,
            "index": h.index,
            "live": h.live,
            "oldest_idle_s": h.oldest_idle_s,
            "cap": self.cap,
        }

    async def grow(self) -> dict[str, Any] | None:
        """Every host is full: start one now (or join one starting that still has an unclaimed
        slot) and return it once ready, or ``None`` at the host limit (the caller then passivates
        an idle session for room). Each caller claims one of a starting host's ``cap`` slots, so
        a burst of new sessions starts as many hosts as it needs (strict mode: one per session)
        instead of all waiting on one (docs/decisions.md#session-hosts)."""
        self._begin()
        key = next((k for k in self._creating if self._claims.get(k, 0) < self.cap), None)
        if key is None:
            if len(self._hosts) >= self.most:
                return None
            key = self._spawn_host()
            self.stats["cold"] += 1
            metrics.HOSTS_CREATED_ON_DEMAND.inc()
        task = self._creating[key]
        self._claims[key] = self._claims.get(key, 0) + 1
        try:
            host = await asyncio.shield(task)
        finally:
            if (left := self._claims.get(key, 1) - 1) > 0:
                self._claims[key] = left
            else:
                self._claims.pop(key, None)
        if host is None:
            return None
        return self._row(actor_key(host.handle), host)

    async def report_dead(self, host_id: str) -> bool:
        """A shard saw a call to ``host_id`` fail as if the host died. Returns whether it was
        removed (it did not answer a ping within 5 s); a replacement starts as needed."""
        self._begin()
        host = self._hosts.get(host_id)
        if host is None:
            return True
        try:
            await asyncio.wait_for(host.handle.ping.remote(), 5.0)
            return False
        except Exception:
            if self._hosts.get(host_id) is host:  # not removed meanwhile by the health loop
                self.stats["replaced"] += 1
                self._remove(host_id)
                self._top_up()
            return True

    async def status(self) -> dict[str, Any]:
        """``{"hosts", "starting", "cap", "most", "headroom", "live", "hosts_detail": [...], **stats}``."""
        return {
            "hosts": sum(1 for h in self._hosts.values() if h.ready),
            "starting": len(self._creating),
            "cap": self.cap,
            "most": self.most,
            "headroom": self.headroom,
            "live": sum(h.live for h in self._hosts.values()),
            "hosts_detail": [
                {"host_id": k, "index": h.index, "live": h.live, "uss_mib": h.uss_mib, "ready": h.ready}
                for k, h in sorted(self._hosts.items(), key=lambda kv: kv[1].index)
            ],
            **self.stats,
        }

    async def in_flight(self, timeout_s: float = 5.0) -> int:
        """Turns in flight on every ready host (each host's ``in_flight``: accepted messages whose
        turn has not ended, whoever submitted them); a host that does not answer in ``timeout_s``
        counts 0.

        Raises:
            RuntimeError: no host answered (while some are ready).
        """

        async def one(h: _Host) -> int | None:
            try:
                return int((await asyncio.wait_for(h.handle.status.remote(), timeout_s))["in_flight"])
            except Exception:
                return None

        counts = await asyncio.gather(*(one(h) for h in self._hosts.values() if h.ready))
        if counts and all(c is None for c in counts):
            raise RuntimeError("no session host answered")
        return sum(c for c in counts if c is not None)

    async def host_pids(self, timeout_s: float = 5.0) -> list[int | None]:
        """Process ids of the ready hosts (``None`` for one that did not answer in ``timeout_s``)."""

        async def pid(h: _Host) -> int | None:
            try:
                return int(await asyncio.wait_for(h.handle.ping.remote(), timeout_s))
            except Exception:
                return None

        return list(await asyncio.gather(*(pid(h) for h in self._hosts.values() if h.ready)))

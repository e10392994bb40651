"""``RouterActor``: one shard of the session directory — session key → host
(docs/decisions.md#session-hosts).

``shard = crc32(session_key) % N`` (:func:`shard_of`; a stable hash, never Python's ``hash()``,
so every process agrees: docs/decisions.md#session-topology). Each shard, a named async actor
``{prefix}-router-{i}`` in namespace ``sessionray``, owns for its keys:

* the **directory** session_key → :class:`Placement` (host handle, host id, ``epoch``). A new
  session is activated on the least-loaded host with room (the supervisor's last reading plus this
  shard's placements since); when every host is full the supervisor starts one (up to its limit),
  and at the limit the least-loaded host passivates its least recently used idle session for it
  (``evict``). No room for ``runtime.activation_wait_s`` (every session busy) → ``busy``;
* the **epoch**: a counter of this shard, new for every placement. Callers cache
  key → (host, epoch) and send messages straight to the host; a host that no longer holds the key
  at that epoch answers ``moved``, and the caller comes back here with the stale epoch
  (:meth:`RouterActor.place`), which drops the entry before placing again
  (docs/decisions.md#session-direct-path);
* **order**: calls for one key pass the shard in arrival order (:class:`actors.placement.admission.KeyOrder`);
* **restart**: a restarted shard first adopts the sessions the hosts hold for its keys, so no live
  session is placed twice; its epochs start above the earlier incarnation's;
* routing of a ``ControlRequest`` (masters only for steer / follow-up) to the session's host, the
  archive of a passivated session, and introspection (:mod:`actors.placement.router_control`);
* the **inbox recovery loop** of its keys (:class:`actors.placement.recovery.InboxRecovery`): from the start
  of each incarnation on, messages stored in the durable inbox whose turn result never came are
  routed again in per-chat order, through this shard's ``place`` (docs/decisions.md#inbox-durable).

Messages themselves do not pass the shard: the host assigns their ``seq``, bounds the mailbox and
drops duplicates. A host that passivates a session tells the shard (:meth:`RouterActor.forget`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from actors.placement.admission import KeyOrder
from actors.placement.router_control import DEAD, RouterAdminMixin
from actors.raylife.self_kick import kick_self
from runtime import metrics, tracing
from runtime.keys import key_hash

__all__ = ["ROUTER_PREFIX", "Placement", "RouterActor", "router_name", "shard_of"]

log = logging.getLogger("sessionray.router")

ROUTER_PREFIX = "sessionray-router"
HOSTS_TTL_S = 1.0
"""How long a shard uses its copy of the supervisor's host list before asking again, in seconds."""
ROOM_WAIT_S = 2.0
"""Longest wait of one activation for room on a host where no session is idle, in seconds (then
the shard reads the host list again and chooses anew, until ``runtime.activation_wait_s``)."""


def router_name(index: int, prefix: str = "sessionray") -> str:
    """``{prefix}-router-{index}`` (actor interfaces, contract 4)."""
    return f"{prefix}-router-{index}"


def shard_of(session_key: str, shards: int) -> int:
    """``crc32(session_key) % shards``: the router shard of a session (stable in every process).

    Raises:
        ValueError: ``shards`` < 1.
    """
    if shards < 1:
        raise ValueError(f"runtime.router_shards must be >= 1, got {shards}")
    return key_hash(session_key) % shards


@dataclass
class Placement:
    """Where one live session is: ``host`` (a SessionHost handle), its ``host_id`` (hex actor id)
    and slot ``index``, the placement ``epoch``; ``ready``: the activation task; ``load_ms``: how
    long the host's ``activate`` took (0 for an adopted placement)."""

    key: str
    epoch: int
    host: Any = None
    host_id: str = ""
    index: int = -1
    session_id: str = ""
    ready: asyncio.Task[None] | None = None
    placed_at: float = field(default_factory=time.monotonic)
    load_ms: float = 0.0

    def reply(self) -> dict[str, Any]:
        """What :meth:`RouterActor.place` answers."""
        return {
            "status": "placed",
            "host": self.host,
            "host_id": self.host_id,
            "epoch": self.epoch,
            "session_id": self.session_id,
            "load_ms": self.load_ms,
        }


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class RouterActor(RouterAdminMixin):
    """One router shard.

    Args:
        config: ``runtime.config.Config``.
        shard: This shard's index; ``shards``: N.
        hosts_name: Name of the :class:`~actors.placement.hosts.supervisor.HostSupervisor`
            (namespace ``sessionray``).
        name: This shard's own actor name (hosts look it up to tell about passivations).
    """

    def __init__(self, config: Any, shard: int, shards: int, hosts_name: str, name: str) -> None:
        with contextlib.suppress(Exception):
            from actors.raylife.metrics import install_ray_metrics

            install_ray_metrics()
        tracing.configure(getattr(config, "tracing", None), "router")
        self.config = config
        self.shard, self.shards = shard, shards
        self.name, self.hosts_name = name, hosts_name
        self.retry_after_s = config.runtime.busy_retry_after_s
        self.activation_wait_s = config.runtime.activation_wait_s
        self._supervisor: Any = None
        self._dir: dict[str, Placement] = {}
        self._order = KeyOrder()
        self._epoch = time.time_ns() // 1000
        """Placement epochs grow across restarts of this shard (µs at start), so a cached epoch
        of an earlier incarnation is never mistaken for a current one."""
        self._adopted: asyncio.Task[None] | None = None
        self._hosts: list[dict[str, Any]] = []
        self._hosts_at = 0.0
        self._no_growth_until = 0.0
        self._placed: dict[str, int] = {}
        """Placements on each host since the host list was read (added to its ``live``)."""
        self._activating: dict[str, int] = {}
        """host_id → activations this shard has asked of it and not had answered yet."""
        self.counts = {
            "placed": 0,
            "forgotten": 0,
            "moved": 0,
            "dead_hosts": 0,
            "busy": 0,
            "evictions": 0,
            "full": 0,
            "refused": 0,
            "adopted": 0,
        }
        self._recovery: Any = None
        self._recovery_task: asyncio.Task[None] | None = None
        # Start the inbox recovery loop as soon as this incarnation runs (a restarted shard
        # replays what its keys left even if no caller asks). A shard object built outside a Ray
        # actor (tests) starts it on its first use.
        kick_self("start_recovery", f"the inbox recovery loop of router shard {shard}")

    async def start_recovery(self) -> None:
        """Start this shard's inbox recovery loop (idempotent; its first pass runs at once)."""
        if self._recovery_task is None:
            from actors.placement.recovery import InboxRecovery

            rt = self.config.runtime
            self._recovery = InboxRecovery(
                self.config.database.url,
                self.place,
                shard=self.shard,
                shards=self.shards,
                replay_window_s=rt.replay_window_s,
            )
            self._recovery_task = asyncio.create_task(self._recovery.run())

    async def recover_now(self) -> dict[str, Any]:
        """Run one inbox recovery pass now (after any pass in progress); returns the loop's
        counters (``passes``, ``resubmitted``, ``handled``, ``expired``, ``failed``, ``errors``)."""
        await self.start_recovery()
        return dict(await self._recovery.pass_once())

    async def inbox_status(self) -> dict[str, Any]:
        """The recovery loop's counters and its submit path's (``submit``)."""
        await self.start_recovery()
        return dict(self._recovery.status())

    async def _adopt(self) -> None:
        """Once per incarnation, before the first placement: take over the sessions the hosts
        already hold for this shard's keys (a restarted shard must not place a live session a
        second time). A host that does not answer is skipped (its sessions re-place on use)."""
        if self._adopted is None:
            self._adopted = asyncio.create_task(self._adopt_once())
        await asyncio.shield(self._adopted)

    async def _adopt_once(self) -> None:
        try:
            hosts = await self._host_list(fresh=True)
        except Exception:  # pragma: no cover - no supervisor yet: nothing to adopt
            return
        for host in hosts:
            try:
                rows = await host["handle"].sessions.remote()
            except Exception:
                continue
            for row in rows:
                key = row["session_key"]
                if shard_of(key, self.shards) != self.shard or key in self._dir:
                    continue
                entry = self._dir[key] = Placement(key, int(row["epoch"]), host["handle"], host["host_id"])
                entry.index, entry.session_id = host["index"], row["session_id"]
                entry.ready = asyncio.create_task(_nothing())
                self.counts["adopted"] += 1
                with contextlib.suppress(Exception):  # the host tells this incarnation from now on
                    await host["handle"].activate.remote(key, entry.epoch, self.name)
        metrics.LIVE_SESSIONS.set(len(self._dir))

    def _get_supervisor(self) -> Any:
        if self._supervisor is None:
            self._supervisor = ray.get_actor(self.hosts_name, namespace="sessionray")
        return self._supervisor

    # ------------------------------------------------------------------ placement

    async def place(
        self, session_key: str, stale_epoch: int | None = None, dead_host: str | None = None
    ) -> dict[str, Any]:
        """The host of ``session_key``, activating it there when it is not live.

        Args:
            stale_epoch: The caller's cached epoch that the host answered ``moved`` to: an entry
                of that epoch (or older) is dropped first.
            dead_host: A host id whose call failed as if it died: every entry on it is dropped
                and the supervisor told.

        Returns:
            ``{"status": "placed", "host", "host_id", "epoch", "session_id", "load_ms"}``
            (``load_ms``: the host's part of the activation, ms, waiting for room included) or
            ``{"status": "busy", "retry_after_s"}`` (no room within ``runtime.activation_wait_s``).

        Raises:
            MalformedKeyError-like repository errors of the activation (a malformed key).
        """
        if dead_host is not None:
            self._host_died(dead_host)
        ticket = self._order.turn(session_key)
        await self._adopt()
        async with ticket:
            entry = self._dir.get(session_key)
            if entry is not None and stale_epoch is not None and entry.epoch <= stale_epoch:
                self.counts["moved"] += 1
                self._forget(entry)
                entry = None
            if entry is None:
                self._epoch += 1
                entry = self._dir[session_key] = Placement(session_key, self._epoch)
                entry.ready = asyncio.create_task(self._activate(entry))
            try:
                assert entry.ready is not None
                await asyncio.shield(entry.ready)
            except _NoRoom:
                self._forget(entry)
                self.counts["busy"] += 1
                return {"status": "busy", "retry_after_s": self.retry_after_s}
            except BaseException:
                self._forget(entry)
                raise
            return entry.reply()

    async def forget(self, session_key: str, epoch: int) -> bool:
        """A host passivated ``session_key`` (placement ``epoch``): drop the entry when it is
        still that placement. Returns whether it was."""
        entry = self._dir.get(session_key)
        if entry is None or entry.epoch != epoch:
            return False
        self.counts["forgotten"] += 1
        self._forget(entry)
        return True

    def _forget(self, entry: Placement) -> None:
        if self._dir.get(entry.key) is entry:
            del self._dir[entry.key]
            metrics.LIVE_SESSIONS.set(len(self._dir))

    def _drop(self, entry: Placement) -> None:
        """Remove ``entry`` (its host lost the session); the next message places it again."""
        self._forget(entry)

    def _host_died(self, host_id: str) -> None:
        self.counts["dead_hosts"] += 1
        for entry in [e for e in self._dir.values() if e.host_id == host_id]:
            self._forget(entry)
        self._hosts = [h for h in self._hosts if h["host_id"] != host_id]
        self._get_supervisor().report_dead.remote(host_id)

    async def _host_list(self, fresh: bool = False) -> list[dict[str, Any]]:
        few = len(self._hosts) < self.config.runtime.min_hosts  # hosts still starting: ask again
        if fresh or few or time.monotonic() - self._hosts_at > HOSTS_TTL_S:
            self._hosts = list(await self._get_supervisor().hosts.remote())
            self._hosts_at = time.monotonic()
            self._placed = {}
        return self._hosts

    def _load(self, host: dict[str, Any]) -> int:
        """Live sessions of ``host`` as this shard knows them: the supervisor's last reading, plus
        what this shard placed since, plus its activations still in flight there — so a burst of
        placements (many chats at once) spreads over the hosts instead of all picking the host
        that was least loaded before any of them was answered."""
        hid = host["host_id"]
        return int(host["live"]) + self._placed.get(hid, 0) + self._activating.get(hid, 0)

    async def _activate(self, entry: Placement) -> None:
        """Activate ``entry`` on a host: one with room (least loaded first), else a host the
        supervisor starts now, else (at the host limit) the least-loaded host passivating an idle
        session for it. Retries until ``runtime.activation_wait_s``.

        Raises:
            _NoRoom: no host took the session in time.
        """
        deadline = time.monotonic() + self.activation_wait_s
        delay = 0.02
        while True:
            hosts = sorted(await self._host_list(), key=self._load)
            with_room = [h for h in hosts if self._load(h) < h["cap"]]
            if await self._try(entry, with_room, evict=False):
                return
            if time.monotonic() >= self._no_growth_until:  # the supervisor said "at the limit"
                grown = await self._get_supervisor().grow.remote()
                if grown is None:
                    self._no_growth_until = time.monotonic() + HOSTS_TTL_S
                elif await self._try(entry, [grown], evict=False):
                    self._hosts.append(grown)
                    return
            # at the host limit: evict on the host whose idle session waited longest (≈ global
            # LRU); hosts that reported no idle session are not asked (one call, not one per host)
            oldest_first = sorted(self._hosts, key=lambda h: -float(h.get("oldest_idle_s", 0.0)))
            idle = [h for h in oldest_first if float(h.get("oldest_idle_s", 0.0)) > 0]
            # None idle (as last read, up to a second old): the host fewest placements wait on.
            # At the host limit the chosen host waits for its next idle session; below it a new
            # host is the answer (waiting there evicted busy sessions in strict mode instead).
            target = idle[:1] or sorted(self._hosts, key=lambda h: self._activating.get(h["host_id"], 0))[:1]
            at_limit = time.monotonic() < self._no_growth_until
            wait_s = min(ROOM_WAIT_S, max(0.0, deadline - time.monotonic())) if at_limit else 0.0
            if await self._try(entry, target, evict=True, wait_s=wait_s):
                self.counts["evictions"] += 1
                return
            if time.monotonic() + delay > deadline:
                raise _NoRoom(entry.key)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _try(
        self, entry: Placement, hosts: list[dict[str, Any]], *, evict: bool, wait_s: float = 0.0
    ) -> bool:
        for host in hosts:
            hid = host["host_id"]
            self._activating[hid] = self._activating.get(hid, 0) + 1
            try:
                info = await host["handle"].activate.remote(entry.key, entry.epoch, self.name, evict, wait_s)
            except DEAD:
                self._host_died(hid)
                continue
            finally:
                if (left := self._activating.get(hid, 1) - 1) > 0:
                    self._activating[hid] = left
                else:
                    self._activating.pop(hid, None)
            if info.get("status") == "full":
                self.counts["full"] += 1
                self._placed[hid] = int(host["cap"])  # full as far as this shard knows
                continue
            entry.host, entry.host_id, entry.index = host["handle"], hid, host["index"]
            entry.session_id, entry.load_ms = info["session_id"], float(info.get("load_ms", 0.0))
            self._placed[hid] = self._placed.get(hid, 0) + 1
            self.counts["placed"] += 1
            metrics.LIVE_SESSIONS.set(len(self._dir))
            return True
        return False

    async def passivate(self, session_key: str, reason: str = "admin") -> bool:
        """Passivate ``session_key`` now if it is live and idle; returns whether it was."""
        entry = await self._settled(session_key)
        if entry is None or entry.host is None:
            return False
        try:
            ok = bool(await entry.host.passivate.remote(session_key, reason))
        except DEAD:
            self._host_died(entry.host_id)
            return False
        if ok:
            self._forget(entry)
        return ok

    async def _settled(self, key: str) -> Placement | None:
        """The entry of ``key`` once its activation ended (``None`` when not live or it failed)."""
        await self._adopt()
        entry = self._dir.get(key)
        if entry is not None and entry.ready is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(entry.ready)
            if entry.ready.cancelled() or entry.ready.exception() is not None:
                return None
        return self._dir.get(key)

    async def shutdown(self) -> None:
        """Stop the inbox recovery loop (its buffered marks written) and forget every placement
        (the supervisor owns and stops the hosts)."""
        task, self._recovery_task = self._recovery_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if self._recovery is not None:
            await self._recovery.close()
        self._dir.clear()


async def _nothing() -> None:
    return None


class _NoRoom(Exception):
    """No host took a session within ``runtime.activation_wait_s``."""

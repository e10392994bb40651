"""``RouterActor``: one shard of the session directory (docs/decisions.md#session-lifecycle).

``shard = crc32(session_key) % N`` (:func:`shard_of`; a stable hash, never Python's ``hash()``,
so every process agrees: docs/decisions.md#session-topology). Each shard, a named async actor
``sessionray-router-{i}`` in namespace ``sessionray``, owns for its keys:

* the **directory** session_key → live ``SessionActor`` (bound through the warm pool);
* **dedup** of redelivered events by ``(platform, bot_id, message_id)`` (a bounded LRU set;
  the ingress also stores each inbound transcript once in SQL);
* a **per-session bounded mailbox**: an accepted message stays *pending* until its turn handed
  the reply to delivery; with ``runtime.mailbox_size`` pending, :meth:`RouterActor.submit` answers
  ``busy`` (503 + ``Retry-After``); nothing accepted is dropped (docs/decisions.md#session-backpressure);
* **sequence numbers**: each accepted message gets the session's next ``seq`` (Ray does not order
  calls to an async actor; the session's inbox does). Messages of one key pass the shard in
  arrival order (a per-key ticket, :class:`actors.admission.KeyOrder`), so a message that waits
  for a slot is never overtaken by a later one of the same session;
* **lifecycle**: activation from the warm pool on the first message; passivation after
  ``runtime.idle_ttl_s`` without activity; a cap of live sessions per shard
  (``ceil(max_live_sessions / N)``). A new session over the cap queues (FIFO,
  :class:`actors.admission.SlotQueue`) for up to ``runtime.activation_wait_s``, then ``busy``;
  for each waiter the shard LRU-passivates one *idle* session (an actor that refuses — a control
  turn still runs — is skipped for ``REFUSED_RETRY_S``), and each freed slot goes to the oldest
  waiter together with the passivated, now blank, actor (no pool round trip) unless the pool's
  recycling rule would replace that actor;
* **crash recovery** (item 8): a ``submit`` that fails because the session actor died makes the
  shard re-bind the session to a fresh actor (context reloaded from SQL, inbox resuming at the
  lowest pending seq) and send every interrupted message once more (``attempt=1``); a second
  failure of the same message is counted as an error and the message is dropped with a log line.
  A *hung* actor (a turn pending ``runtime.hung_turn_s`` and no ``ping_turn`` answer within
  ``runtime.hung_ping_timeout_s``) is killed, which sends its turns down the same path;
* routing of a ``ControlRequest`` (``steer`` / ``follow_up``, masters only, ``abort``, ``archive``;
  ``archive_stored`` also of a passivated session) to the session actor's ``control``; listing of
  live sessions (both in :mod:`actors.router_admin`; docs/decisions.md#typed-control-request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import zlib
from collections import OrderedDict
from typing import Any

import ray

from actors.admission import Grant, KeyOrder, Live, SlotQueue, should_recycle
from actors.router_admin import DEAD, LOST, RouterAdminMixin
from runtime import metrics
from runtime.config import RuntimeConfig
from runtime.session.turn import TurnInput, TurnResult

__all__ = ["ROUTER_PREFIX", "RouterActor", "router_name", "shard_of"]

log = logging.getLogger("sessionray.router")

ROUTER_PREFIX = "sessionray-router"
BIND_TIMEOUT_S = 180.0
"""How long the shard keeps trying to activate a session before its waiting entries fail."""
REFUSED_RETRY_S = 0.5
"""After a session actor refused an LRU passivation (a control turn still ran), seconds before the
shard tries that victim again; other idle sessions are tried meanwhile."""


def router_name(index: int) -> str:
    """``sessionray-router-{index}`` (actor interfaces, contract 4)."""
    return f"{ROUTER_PREFIX}-{index}"


def shard_of(session_key: str, shards: int) -> int:
    """``crc32(session_key) % shards``: the router shard of a session (stable in every process).

    Raises:
        ValueError: ``shards`` < 1.
    """
    if shards < 1:
        raise ValueError(f"runtime.router_shards must be >= 1, got {shards}")
    return zlib.crc32(session_key.encode("utf-8")) % shards


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class RouterActor(RouterAdminMixin):
    """One router shard (``control`` / ``archive_stored`` routing and the introspection methods
    come from :class:`actors.router_admin.RouterAdminMixin`).

    Args:
        config: ``runtime.config.Config``; ``config.runtime`` gives every knob of the shard.
        shard: This shard's index; ``shards``: N.
        pool_name: Name of the warm-pool supervisor actor (namespace ``sessionray``).
    """

    def __init__(self, config: Any, shard: int, shards: int, pool_name: str = "sessionray-pool") -> None:
        with contextlib.suppress(Exception):
            from actors.ray_metrics import install_ray_metrics

            install_ray_metrics()
        self.config = config
        self.shard, self.shards = shard, shards
        self.pool_name = pool_name
        self._pool: Any = None
        rt: RuntimeConfig = config.runtime  # defaults: the model only (docs/decisions.md#config-closed-model)
        self.mailbox = rt.mailbox_size
        self.retry_after_s = rt.busy_retry_after_s
        self.cap = max(1, math.ceil(rt.max_live_sessions / shards))
        self.idle_ttl_s = rt.idle_ttl_s
        self.activation_wait_s = rt.activation_wait_s
        self.dedup_window = rt.dedup_window
        self.hung_turn_s = rt.hung_turn_s
        self.hung_ping_timeout_s = rt.hung_ping_timeout_s
        self.recycle_after_sessions = rt.recycle_after_sessions
        self.recycle_memory_mib = rt.recycle_memory_mib
        self._dir: dict[str, Live] = {}
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._slots = SlotQueue(self.cap, lambda: len(self._dir), self._return_to_pool)
        self._order = KeyOrder()
        self._evicting = 0
        self._retry: asyncio.TimerHandle | None = None
        self._started = False
        self._sweeper: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.counts = {
            "accepted": 0,
            "duplicate": 0,
            "busy": 0,
            "ignored": 0,
            "turns": 0,
            "errors": 0,
            "retried": 0,
            "passivated": 0,
            "activated": 0,
            "refused": 0,
            "handoffs": 0,
            "hung": 0,
        }
        self._recent: list[float] = []

    # ------------------------------------------------------------------ plumbing

    def _start(self) -> None:
        if not self._started:
            self._started = True
            self._sweeper = asyncio.create_task(self._idle_loop())

    def _get_pool(self) -> Any:
        if self._pool is None:
            self._pool = ray.get_actor(self.pool_name, namespace="sessionray")
        return self._pool

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _return_to_pool(self, actor: Any) -> None:
        """A blank actor handed over with a slot that nobody took goes back to the warm pool."""
        if actor is not None:
            self._spawn(self._get_pool().release.remote(actor))

    # ------------------------------------------------------------------ inbound

    async def submit(self, inbound: Any) -> dict[str, Any]:
        """Route one :class:`runtime.platforms.base.InboundMessage`.

        Messages of one session key pass in arrival order (a per-key ticket taken before the
        first ``await``), so their seqs follow arrival even when the first waits for a slot.

        Returns:
            ``{"status": "accepted" | "duplicate" | "busy", "retry_after_s": float | None,
            "seq": int | None}``. ``accepted`` with ``seq`` None: stored but no turn runs (an
            un-triggered group message).
        """
        self._start()
        dk = (inbound.platform, inbound.bot_id, inbound.message_id)
        if dk in self._seen:
            self.counts["duplicate"] += 1
            return {"status": "duplicate", "retry_after_s": None, "seq": None}
        if not getattr(inbound, "triggered", True):
            self._remember(dk)
            self.counts["ignored"] += 1
            return {"status": "accepted", "retry_after_s": None, "seq": None}
        key = inbound.session_key
        deadline = time.monotonic() + self.activation_wait_s
        async with self._order.turn(key):
            live = await self._settled(key)
            if live is None:
                grant = await self._admit(deadline)
                if grant is None:
                    return self._busy()
                live = self._bind_new(key, grant)
            if dk in self._seen:  # a duplicate arrived while we waited for a slot
                self.counts["duplicate"] += 1
                return {"status": "duplicate", "retry_after_s": None, "seq": None}
            if len(live.pending) >= self.mailbox:
                return self._busy()
            seq = live.next_seq
            live.next_seq += 1
        turn = TurnInput.from_inbound(inbound, seq)
        live.pending[seq] = turn
        live.last_used = live.since[seq] = time.monotonic()
        self._remember(dk)
        self.counts["accepted"] += 1
        self._recent.append(time.monotonic())
        self._spawn(self._dispatch(live, turn))
        return {"status": "accepted", "retry_after_s": None, "seq": seq}

    async def _settled(self, key: str) -> Live | None:
        """The live entry of ``key`` once no passivation of it is in flight (one actor per session:
        a message never binds a second actor while the first is being passivated)."""
        live = self._dir.get(key)
        while live is not None and live.passivating and live.passivation is not None:
            await live.passivation.wait()
            live = self._dir.get(key)
        return live

    def _busy(self) -> dict[str, Any]:
        self.counts["busy"] += 1
        return {"status": "busy", "retry_after_s": self.retry_after_s, "seq": None}

    def _remember(self, dk: tuple[str, str, str]) -> None:
        self._seen[dk] = None
        while len(self._seen) > self.dedup_window:
            self._seen.popitem(last=False)

    # ------------------------------------------------------------------ admission at the cap

    async def _admit(self, deadline: float) -> Grant | None:
        """A slot for one more live session: a free one at once when nobody waits, else queue
        (FIFO) until an LRU passivation or an ended session frees one; ``None`` at ``deadline``
        (``time.monotonic()``)."""
        grant = self._slots.try_take()
        if grant is not None:
            return grant
        asyncio.get_running_loop().call_soon(self._pump)  # runs once this waiter is queued
        return await self._slots.wait(deadline - time.monotonic())

    def _pump(self) -> None:
        """Start one LRU passivation per waiting new session not yet covered by one in flight.
        Victims are idle sessions, least recently used first, skipping those that refused within
        ``REFUSED_RETRY_S`` (retried by a timer when nothing else is idle)."""
        self._slots.offer()
        now = time.monotonic()
        while self._slots.waiting > self._evicting:
            idle = [s for s in self._dir.values() if s.idle and s.refused_until <= now]
            if not idle:
                break
            victim = min(idle, key=lambda s: s.last_used)
            self._evicting += 1
            self._begin_passivation(victim)
            self._spawn(self._evict(victim))
        if self._slots.waiting > self._evicting and self._retry is None:
            refused = [s.refused_until for s in self._dir.values() if s.idle and s.refused_until > now]
            if refused:
                self._retry = asyncio.get_running_loop().call_later(min(refused) - now, self._retry_pump)

    def _retry_pump(self) -> None:
        self._retry = None
        self._pump()

    async def _evict(self, victim: Live) -> None:
        try:
            await self._run_passivation(victim, "lru", False)
        except Exception:  # pragma: no cover - logged; the waiters fall back to their deadline
            log.exception("LRU passivation of %s failed", victim.key)
        finally:
            self._evicting -= 1
            self._pump()

    def _drop(self, live: Live) -> None:
        """Remove ``live`` from the directory (its actor is gone or blank); its slot frees."""
        if self._dir.get(live.key) is live:
            del self._dir[live.key]
            self._gauge()
            self._slots.offer()

    # ------------------------------------------------------------------ binding

    def _bind_new(self, key: str, grant: Grant) -> Live:
        live = Live(key=key)
        self._dir[key] = live
        self._slots.consume(grant)
        if grant.actor is not None:
            self.counts["handoffs"] += 1
        live.ready = asyncio.create_task(self._bind(live, 1, grant.actor))
        return live

    async def _bind(self, live: Live, next_seq: int, actor: Any = None) -> None:
        """Activate the session on ``actor`` (a blank actor handed over by an LRU passivation) or
        on one taken from the warm pool. Retries (with back-off, from the pool) for up to
        ``BIND_TIMEOUT_S``: a slow cold start or a dying actor does not lose the accepted
        messages waiting for this session.

        Raises:
            RuntimeError: no activation succeeded in time (the waiting entries then fail, logged).
        """
        pool = self._get_pool()
        deadline = time.monotonic() + BIND_TIMEOUT_S
        delay = 0.2
        while True:
            t0 = time.perf_counter()
            source = "warm"
            try:
                if actor is None:
                    actor, source = await pool.acquire.remote()
                info = await actor.activate.remote(live.key, next_seq)
            except Exception as exc:
                if actor is not None:
                    pool.report_dead.remote(actor)
                    actor = None
                if time.monotonic() + delay > deadline:
                    raise RuntimeError(f"could not activate {live.key}: {exc!r}") from exc
                log.warning("activation of %s failed (%r); retrying", live.key, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            live.actor, live.session_id = actor, info["session_id"]
            metrics.ACTIVATIONS.inc(source=source)
            metrics.ACTIVATION_LATENCY.observe(time.perf_counter() - t0, source=source)
            self.counts["activated"] += 1
            self._gauge()
            return

    def _gauge(self) -> None:
        metrics.LIVE_SESSIONS.set(sum(1 for s in self._dir.values() if not s.passivating))

    async def _dispatch(self, live: Live, turn: TurnInput) -> None:
        while True:
            assert live.ready is not None
            generation = live.generation
            try:
                await live.ready
                result: TurnResult = await live.actor.submit.remote(turn)
            except LOST as exc:
                if turn.attempt >= 1:
                    self._finish(live, turn, None, f"session actor died twice: {exc!r}")
                    return
                self._rebind(live, generation)
                turn = turn.model_copy(update={"attempt": 1})
                live.pending[turn.seq] = turn
                live.since[turn.seq] = time.monotonic()
                self.counts["retried"] += 1
                continue
            except Exception as exc:
                self._finish(live, turn, None, repr(exc))
                if live.ready.done() and live.ready.exception() is not None:
                    self._drop(live)  # activation failed: the next message tries a fresh bind
                return
            self._finish(live, turn, result, None)
            return

    def _rebind(self, live: Live, generation: int) -> None:
        """First caller after a crash re-binds the session; later callers wait on the same task."""
        if live.generation != generation:
            return
        live.generation += 1
        dead = live.actor
        if dead is not None:
            self._get_pool().report_dead.remote(dead)
        live.actor = None
        first = min(live.pending) if live.pending else live.next_seq
        live.ready = asyncio.create_task(self._bind(live, first))

    def _finish(self, live: Live, turn: TurnInput, result: TurnResult | None, error: str | None) -> None:
        live.pending.pop(turn.seq, None)
        live.since.pop(turn.seq, None)
        live.last_used = time.monotonic()
        live.turns += 1
        self.counts["turns"] += 1
        if error is not None or (result is not None and result.outcome == "error"):
            self.counts["errors"] += 1
            log.warning(
                "turn %s#%s failed: %s", live.key, turn.seq, error or (result.error if result else "")
            )
        if not live.pending and self._slots.waiting:
            self._pump()  # an idle session now: a victim for a waiting new session

    # ------------------------------------------------------------------ passivation

    async def _passivate(self, live: Live, reason: str, force: bool = False) -> bool:
        if live.passivating or (live.pending and not force):
            return False
        self._begin_passivation(live)
        return await self._run_passivation(live, reason, force)

    def _begin_passivation(self, live: Live) -> None:
        live.passivating = True
        live.passivation = asyncio.Event()

    async def _run_passivation(self, live: Live, reason: str, force: bool) -> bool:
        """Passivate ``live`` (already marked passivating). Its slot goes to the oldest waiting
        new session, with the now blank actor when the pool would keep it (``should_recycle``
        false): the waiter activates on it without a pool release/acquire round trip. Otherwise
        the actor goes back to the pool (awaited, so a waiter then finds it warm).
        Returns False when the actor refused (a control turn still runs; the session stays live).
        Whatever the outcome, a passivation that ends while new sessions wait runs :meth:`_pump`
        (an idle/admin passivation in flight hides its session from the waiters' victim search)."""
        assert live.passivation is not None
        try:
            if live.ready is not None:
                with contextlib.suppress(Exception):
                    await live.ready
            actor = live.actor
            if actor is None:
                self._drop(live)
                return True
            try:
                res = await actor.passivate.remote(force)
            except DEAD:
                self._get_pool().report_dead.remote(actor)
                res = None
            if res is not None and not res["ok"]:
                live.refused_until = time.monotonic() + REFUSED_RETRY_S
                return False  # a control turn still runs; keep it live
            if self._dir.get(live.key) is live:
                del self._dir[live.key]
            metrics.PASSIVATIONS.inc(reason=reason)
            self.counts["passivated"] += 1
            self.counts[f"passivated_{reason}"] = self.counts.get(f"passivated_{reason}", 0) + 1
            self._gauge()
            if res is not None:
                served, uss = res["sessions_served"], res["uss_mib"]
                keep = not should_recycle(served, uss, self.recycle_after_sessions, self.recycle_memory_mib)
                if not (keep and self._slots.waiting and self._slots.offer(actor)):
                    await self._get_pool().release.remote(actor, served, uss)
            self._slots.offer()
            return True
        finally:
            live.passivating = False
            live.passivation.set()
            if self._slots.waiting:
                # No lost wake-up: a waiter that queued while this passivation ran found no victim
                # (this one was marked passivating) and set no timer; a refused or failed
                # passivation frees no slot, so look for a victim again (or arm the retry timer).
                self._pump()

    async def _idle_loop(self) -> None:
        interval = max(0.05, min(self.idle_ttl_s / 4, self.hung_turn_s / 4, 1.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            self._check_hung(now)
            for live in list(self._dir.values()):
                if live.idle and now - live.last_used >= self.idle_ttl_s:
                    with contextlib.suppress(Exception):
                        await self._passivate(live, "idle")

    # ------------------------------------------------------------------ hung session actors

    def _check_hung(self, now: float) -> None:
        """Ping the ``turn`` group of each actor with a turn pending ``hung_turn_s`` or longer (at
        most once per ``hung_turn_s``). A long LLM call or tool still answers the ping (the group
        runs many calls at once); a group whose event loop stopped does not."""
        for live in list(self._dir.values()):
            if live.actor is None or not live.since or live.passivating:
                continue
            if (
                now - min(live.since.values()) >= self.hung_turn_s
                and now - live.probed_at >= self.hung_turn_s
            ):
                live.probed_at = now
                self._spawn(self._probe(live, live.actor))

    async def _probe(self, live: Live, actor: Any) -> None:
        """Kill ``actor`` (``ray.kill``, no restart) when its ``ping_turn`` does not answer within
        ``hung_ping_timeout_s``: its pending ``submit`` calls then fail like a crash, and the
        crash path re-binds the session to a fresh actor and retries each turn once."""
        try:
            await asyncio.wait_for(actor.ping_turn.remote(), self.hung_ping_timeout_s)
        except TimeoutError:
            if live.actor is not actor:
                return  # re-bound meanwhile
            self.counts["hung"] += 1
            log.warning(
                "session actor of %s did not answer ping_turn within %.1f s with a turn pending %.1f s; "
                "killing it (crash path: re-bind, retry once)",
                live.key,
                self.hung_ping_timeout_s,
                time.monotonic() - min(live.since.values(), default=time.monotonic()),
            )
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        except Exception:  # died meanwhile: the crash path handles it
            return

    async def passivate(self, session_key: str, reason: str = "admin") -> bool:
        """Passivate ``session_key`` now if it is idle; returns whether it was."""
        live = self._dir.get(session_key)
        return bool(live is not None and live.idle and await self._passivate(live, reason))

    async def shutdown(self) -> None:
        """Stop background work (the pool owns the session actors)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._retry is not None:
            self._retry.cancel()
        for t in list(self._tasks):
            t.cancel()

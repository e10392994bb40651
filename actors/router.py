"""``RouterActor``: one shard of the session directory (issue 8, items 2, 3 and 8).

``shard = crc32(session_key) % N`` (:func:`shard_of`; a stable hash, never Python's ``hash()``,
so every process agrees). Each shard, a named async actor ``sessionray-router-{i}`` in namespace
``sessionray``, owns for its keys:

* the **directory** session_key → live ``SessionActor`` (bound through the warm pool);
* **dedup** of redelivered events by ``(platform, bot_id, message_id)`` (a bounded LRU set;
  the ingress also stores each inbound transcript once in SQL);
* a **per-session bounded mailbox**: an accepted message stays *pending* until its turn handed
  the reply to delivery; with ``runtime.mailbox_size`` pending, :meth:`RouterActor.submit` answers
  ``busy`` (the ingress returns 503 + ``Retry-After``). An accepted message is never dropped;
* **sequence numbers**: each accepted message gets the session's next ``seq`` (Ray does not order
  calls to an async actor; the session's inbox does);
* **lifecycle**: activation from the warm pool on the first message; passivation after
  ``runtime.idle_ttl_s`` without activity; a cap of live sessions per shard
  (``ceil(max_live_sessions / N)``) enforced by passivating the least recently used *idle*
  session; when none is idle a new session waits up to ``runtime.activation_wait_s``, then
  ``busy``;
* **crash recovery** (item 8): a ``submit`` that fails because the session actor died makes the
  shard re-bind the session to a fresh actor (context reloaded from SQL, inbox resuming at the
  lowest pending seq) and send every interrupted message once more (``attempt=1``); a second
  failure of the same message is counted as an error and the message is dropped with a log line.
* routing of ``steer`` / ``follow_up`` (masters only, seed 002 #7: refusals are counted),
  ``abort`` and ``archive``; listing of live sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import ray

from actors.session_actor import SessionNotBoundError
from runtime import metrics
from runtime.turn import TurnInput, TurnResult

__all__ = ["ROUTER_PREFIX", "RouterActor", "router_name", "shard_of"]

log = logging.getLogger("sessionray.router")

ROUTER_PREFIX = "sessionray-router"
_DEAD = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
_LOST = (*_DEAD, SessionNotBoundError)
"""The session's actor died, or restarted blank (Ray raises the actor's exception type)."""
BIND_TIMEOUT_S = 180.0
"""How long the shard keeps trying to activate a session before its waiting entries fail."""


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


@dataclass
class _Live:
    """The shard's view of one live (or activating) session."""

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

    @property
    def idle(self) -> bool:
        return not self.pending and self.ready is not None and self.ready.done() and not self.passivating


def _knob(config: Any, name: str, default: Any) -> Any:
    return getattr(getattr(config, "runtime", None), name, default)


def _is_master(config: Any, platform: str, bot_id: str, sender_id: str) -> bool:
    for bot in getattr(config, "bots", []) or []:
        if getattr(bot, "platform", None) == platform and str(getattr(bot, "self_id", "")) == bot_id:
            return str(sender_id) in {str(m) for m in getattr(bot, "masters", []) or []}
    return False


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class RouterActor:
    """One router shard.

    Args:
        config: ``runtime.config.Config``.
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
        self.mailbox = int(_knob(config, "mailbox_size", 16))
        self.retry_after_s = float(_knob(config, "busy_retry_after_s", 1.0))
        self.cap = max(1, math.ceil(int(_knob(config, "max_live_sessions", 64)) / shards))
        self.idle_ttl_s = float(_knob(config, "idle_ttl_s", 600.0))
        self.activation_wait_s = float(_knob(config, "activation_wait_s", 10.0))
        self.dedup_window = int(_knob(config, "dedup_window", 10_000))
        self._dir: dict[str, _Live] = {}
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._freed: asyncio.Event | None = None
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
        }
        self._recent: list[float] = []

    # ------------------------------------------------------------------ plumbing

    def _start(self) -> None:
        if self._freed is None:
            self._freed = asyncio.Event()
            self._sweeper = asyncio.create_task(self._idle_loop())

    def _get_pool(self) -> Any:
        if self._pool is None:
            self._pool = ray.get_actor(self.pool_name, namespace="sessionray")
        return self._pool

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _signal_freed(self) -> None:
        if self._freed is not None:
            self._freed.set()

    # ------------------------------------------------------------------ inbound

    async def submit(self, inbound: Any) -> dict[str, Any]:
        """Route one :class:`runtime.platforms.base.InboundMessage`.

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
        live = await self._settled(key)
        if live is None:
            if not await self._admit(key):
                return self._busy()
            live = await self._settled(key)
            if live is None:
                live = self._bind_new(key)
        if dk in self._seen:  # a duplicate arrived while we waited for a slot
            self.counts["duplicate"] += 1
            return {"status": "duplicate", "retry_after_s": None, "seq": None}
        if len(live.pending) >= self.mailbox:
            return self._busy()
        seq = live.next_seq
        live.next_seq += 1
        turn = TurnInput.from_inbound(inbound, seq)
        live.pending[seq] = turn
        live.last_used = time.monotonic()
        self._remember(dk)
        self.counts["accepted"] += 1
        self._recent.append(time.monotonic())
        self._spawn(self._dispatch(live, turn))
        return {"status": "accepted", "retry_after_s": None, "seq": seq}

    async def _settled(self, key: str) -> _Live | None:
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

    async def _admit(self, key: str) -> bool:
        """Make room for one more live session: LRU-passivate an idle one, or wait (bounded)."""
        deadline = time.monotonic() + self.activation_wait_s
        while True:
            live_now = [s for s in self._dir.values() if not s.passivating]
            if key in self._dir and not self._dir[key].passivating:
                return True
            if len(live_now) < self.cap:
                return True
            idle = [s for s in live_now if s.idle]
            if idle:
                victim = min(idle, key=lambda s: s.last_used)
                await self._passivate(victim, "lru")
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            assert self._freed is not None
            self._freed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._freed.wait(), min(remaining, 0.5))

    # ------------------------------------------------------------------ binding

    def _bind_new(self, key: str) -> _Live:
        live = _Live(key=key)
        self._dir[key] = live
        live.ready = asyncio.create_task(self._bind(live, 1))
        return live

    async def _bind(self, live: _Live, next_seq: int) -> None:
        """Take an actor from the warm pool and activate the session on it. Retries (with back-off)
        for up to ``BIND_TIMEOUT_S``: a slow cold start or a dying actor does not lose the
        accepted messages waiting for this session.

        Raises:
            RuntimeError: no activation succeeded in time (the waiting entries then fail, logged).
        """
        pool = self._get_pool()
        deadline = time.monotonic() + BIND_TIMEOUT_S
        delay = 0.2
        while True:
            t0 = time.perf_counter()
            actor = None
            try:
                actor, source = await pool.acquire.remote()
                info = await actor.activate.remote(live.key, next_seq)
            except Exception as exc:
                if actor is not None:
                    pool.report_dead.remote(actor)
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

    async def _dispatch(self, live: _Live, turn: TurnInput) -> None:
        while True:
            assert live.ready is not None
            generation = live.generation
            try:
                await live.ready
                result: TurnResult = await live.actor.submit.remote(turn)
            except _LOST as exc:
                if turn.attempt >= 1:
                    self._finish(live, turn, None, f"session actor died twice: {exc!r}")
                    return
                self._rebind(live, generation)
                turn = turn.model_copy(update={"attempt": 1})
                live.pending[turn.seq] = turn
                self.counts["retried"] += 1
                continue
            except Exception as exc:
                self._finish(live, turn, None, repr(exc))
                if (
                    live.ready.done()
                    and live.ready.exception() is not None
                    and self._dir.get(live.key) is live
                ):
                    del self._dir[live.key]  # activation failed: the next message tries a fresh bind
                    self._gauge()
                return
            self._finish(live, turn, result, None)
            return

    def _rebind(self, live: _Live, generation: int) -> None:
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

    def _finish(self, live: _Live, turn: TurnInput, result: TurnResult | None, error: str | None) -> None:
        live.pending.pop(turn.seq, None)
        live.last_used = time.monotonic()
        live.turns += 1
        self.counts["turns"] += 1
        if error is not None or (result is not None and result.outcome == "error"):
            self.counts["errors"] += 1
            log.warning(
                "turn %s#%s failed: %s", live.key, turn.seq, error or (result.error if result else "")
            )
        if not live.pending:
            self._signal_freed()

    # ------------------------------------------------------------------ passivation

    async def _passivate(self, live: _Live, reason: str, force: bool = False) -> bool:
        if live.passivating or (live.pending and not force):
            return False
        live.passivating = True
        live.passivation = asyncio.Event()
        try:
            if live.ready is not None:
                with contextlib.suppress(Exception):
                    await live.ready
            actor = live.actor
            if actor is None:
                self._dir.pop(live.key, None)
                return True
            try:
                res = await actor.passivate.remote(force)
            except _DEAD:
                self._get_pool().report_dead.remote(actor)
                res = None
            if res is not None and not res["ok"]:
                return False  # a control turn still runs; keep it live
            if self._dir.get(live.key) is live:
                del self._dir[live.key]
            if res is not None:  # awaited: a session waiting for this slot then finds the actor warm
                await self._get_pool().release.remote(actor, res["sessions_served"], res["uss_mib"])
            metrics.PASSIVATIONS.inc(reason=reason)
            self.counts["passivated"] += 1
            self.counts[f"passivated_{reason}"] = self.counts.get(f"passivated_{reason}", 0) + 1
            self._gauge()
            self._signal_freed()
            return True
        finally:
            live.passivating = False
            live.passivation.set()

    async def _idle_loop(self) -> None:
        interval = max(0.05, min(self.idle_ttl_s / 4, 1.0))
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for live in list(self._dir.values()):
                if live.idle and now - live.last_used >= self.idle_ttl_s:
                    with contextlib.suppress(Exception):
                        await self._passivate(live, "idle")

    async def passivate(self, session_key: str, reason: str = "admin") -> bool:
        """Passivate ``session_key`` now if it is idle; returns whether it was."""
        live = self._dir.get(session_key)
        return bool(live is not None and live.idle and await self._passivate(live, reason))

    # ------------------------------------------------------------------ control

    async def control(
        self, kind: str, session_key: str, text: str = "", sender_id: str = ""
    ) -> dict[str, Any]:
        """Route ``steer`` / ``follow_up`` / ``abort`` / ``archive`` to the live session.

        ``steer`` and ``follow_up`` are for the bot's masters only (seed 002 #7); a refusal is
        counted in ``sessionray_control_total{kind, outcome="refused"}``.

        Returns:
            ``{"ok": True, "outcome": ...}`` or ``{"ok": False, "error": "not_master" |
            "unknown_session" | "bad_key", "message": str}``.
        """
        from runtime.memory.keys import SessionKeyError, parse_session_key

        try:
            key = parse_session_key(session_key)
        except SessionKeyError as exc:
            return {"ok": False, "error": "bad_key", "message": str(exc)}
        if kind in ("steer", "follow_up") and not _is_master(
            self.config, key.platform, key.bot_id, sender_id
        ):
            metrics.CONTROL.inc(kind=kind, outcome="refused")
            self.counts["refused"] += 1
            return {
                "ok": False,
                "error": "not_master",
                "message": f"{sender_id!r} is not a master of bot {key.platform}:{key.bot_id}; "
                f"only masters may {kind.replace('_', '-')}",
            }
        live = self._dir.get(session_key)
        if live is None or live.passivating:
            metrics.CONTROL.inc(kind=kind, outcome="unknown")
            return {
                "ok": False,
                "error": "unknown_session",
                "message": f"no live session {session_key!r} (never seen, or passivated)",
            }
        assert live.ready is not None
        await live.ready
        live.last_used = time.monotonic()
        try:
            if kind in ("steer", "follow_up"):
                method = live.actor.steer if kind == "steer" else live.actor.follow_up
                outcome: Any = await method.remote(session_key, text, sender_id)
            elif kind == "abort":
                outcome = await live.actor.abort.remote(session_key)
            elif kind == "archive":
                outcome = await live.actor.archive.remote(session_key)
                live.session_id = outcome
            else:
                raise ValueError(f"unknown control {kind!r}")
        except _LOST as exc:
            # The actor died or restarted blank: the next message re-activates the session.
            if not live.pending and self._dir.get(session_key) is live:
                del self._dir[session_key]
                self._get_pool().report_dead.remote(live.actor)
                self._gauge()
            metrics.CONTROL.inc(kind=kind, outcome="unknown")
            return {
                "ok": False,
                "error": "unknown_session",
                "message": f"session {session_key!r} was lost: {exc}",
            }
        metrics.CONTROL.inc(kind=kind, outcome=str(outcome) if kind in ("steer", "follow_up") else "ok")
        return {"ok": True, "outcome": outcome}

    # ------------------------------------------------------------------ introspection

    async def sessions(self) -> list[dict[str, Any]]:
        """Live sessions of this shard: ``session_key``, ``session_id``, ``shard``, ``pending``,
        ``turns``, ``idle_s``."""
        now = time.monotonic()
        return [
            {
                "session_key": s.key,
                "session_id": s.session_id,
                "shard": self.shard,
                "pending": len(s.pending),
                "turns": s.turns,
                "idle_s": round(now - s.last_used, 3),
            }
            for s in self._dir.values()
            if not s.passivating
        ]

    async def session(self, session_key: str) -> dict[str, Any] | None:
        """Details of one live session (router view plus the actor's ``status()``), or ``None``."""
        live = self._dir.get(session_key)
        if live is None:
            return None
        base = next(
            (s for s in await self.sessions() if s["session_key"] == session_key),
            {"session_key": session_key},
        )
        if live.actor is not None:
            with contextlib.suppress(Exception):
                base["actor"] = await live.actor.status.remote()
        return base

    async def context(self, session_key: str) -> list[dict[str, Any]]:
        """The live context of ``session_key`` as JSON dicts (empty when not live)."""
        live = self._dir.get(session_key)
        if live is None or live.ready is None:
            return []
        await live.ready
        return list(await live.actor.context_messages.remote(session_key))

    async def status(self) -> dict[str, Any]:
        """Counters of this shard plus ``live``, ``pending`` and ``throughput_msg_s`` (last 60 s)."""
        now = time.monotonic()
        self._recent = [t for t in self._recent if now - t <= 60.0]
        span = min(60.0, max(1.0, now - self._recent[0])) if self._recent else 60.0
        return {
            "shard": self.shard,
            "live": sum(1 for s in self._dir.values() if not s.passivating),
            "pending": sum(len(s.pending) for s in self._dir.values()),
            "cap": self.cap,
            "throughput_msg_s": round(len(self._recent) / span, 3),
            **self.counts,
        }

    async def shutdown(self) -> None:
        """Stop background work (the pool owns the session actors)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for t in list(self._tasks):
            t.cancel()

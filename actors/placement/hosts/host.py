"""``SessionHost``: one Ray actor process that hosts many live sessions
(docs/decisions.md#session-hosts).

Every live session is its own :class:`runtime.session.core.SessionCore` (ordered inbox, single
writer, turns, steer / follow-up queues) inside a host. Activation loads the context from SQL into
a new core (milliseconds, no process start); passivation closes and drops it (its state is all in
SQL). ``runtime.sessions_per_host: 1`` gives each live session its own process (strict isolation).

Threads: Ray concurrency groups ``turn`` (:meth:`SessionHost.submit`, held until the turn ended,
and :meth:`SessionHost.activate`, which may wait for room) and ``control`` (passivation, control,
status) each have a thread, so control never queues behind turns (docs/decisions.md#control-never-waits);
all cores live on **one** private uvloop thread that both forward to. LLM calls and tools are
coroutines there, so one session's slow call never delays another's; blocking tools use threads.

Each session keeps the router shard's placement ``epoch``: a message with another epoch (or for a key not
held) is answered ``moved`` (docs/decisions.md#session-direct-path). The host assigns the inbox ``seq``,
bounds the mailbox (``busy``) and drops redeliveries (``duplicate``: seen here, also on a retry; or, on a
first attempt only, recorded in the loaded context). At ``cap`` live sessions (or above
``runtime.host_memory_mib``) an activation passivates the least recently used *idle* session when allowed
(``evict``; with none idle it waits up to ``wait_s`` for a turn to end), else answers ``{"status":
"full"}`` — a value, not an exception (docs/decisions.md#session-lifecycle); idle sessions go after
``runtime.idle_ttl_s``; each passivation tells the router shard (``forget``). ``max_restarts=0``: a
dead host is replaced by the supervisor and callers re-send interrupted messages once
(docs/decisions.md#session-crash-recovery).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import ray

from actors.placement.hosts.state import (
    ROOM_RECHECK_S,
    HostFullError,
    LiveSession,
    RoomWaiters,
    SessionNotBoundError,
    answered,
    current_pid,
    evictable,
    host_row,
    recorded,
    session_rows,
    shielded,
)
from actors.placement.hosts.support import (
    new_loop,
    open_repository,
    process_uss_mib,
    release_free_heap,
    release_sql_connections,
    skip_httpx_cli,
    spawn_ray_task,
    warm_up,
)
from runtime import metrics, tracing

if TYPE_CHECKING:  # the session code is imported by a host, not by the supervisor that starts it
    from runtime.config import Config  # (docs/decisions.md#ops-lazy-exports)
    from runtime.delivery.job import DeliveryJob
    from runtime.session.control import ControlReply, ControlRequest
    from runtime.session.turn import SetupFactory, TurnInput, TurnResult

__all__ = ["HostFullError", "SessionHost", "SessionNotBoundError"]

T = TypeVar("T")
log = logging.getLogger("sessionray.host")

TURN_GROUP_SIZE = 1_000_000
"""Concurrent ``submit`` / ``activate`` calls a host takes (held until the turn ended / room found)."""
CONTROL_GROUP_SIZE = 64
PREPARE_WAIT_S = 10.0  # how long ``ping`` waits for a new host's warm-up, in seconds
TOOL_THREADS = 64
"""Worker threads for blocking work of one host's sessions (plain-function tools, ``asyncio.to_thread``):
more than Python's default (CPUs + 4), since a blocking tool mostly waits on I/O."""
SWEEP_S, USS_EVERY = 0.5, 10
"""Sweep period in s (beat, idle passivation); the USS is read every 10th sweep."""


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0,
    max_restarts=0,
    max_task_retries=0,
    concurrency_groups={"turn": TURN_GROUP_SIZE, "control": CONTROL_GROUP_SIZE},
)
class SessionHost:
    """Hosts up to ``cap`` live :class:`~runtime.session.core.SessionCore` s.

    Args:
        config: ``runtime.config.Config`` (``database.url``; ``runtime``: ``mailbox_size``,
            ``max_concurrent_turns``, ``idle_ttl_s``, ``dedup_window``, ``host_memory_mib``).
        setup_factory: ``(session_key) -> SessionSetup`` called at each activation.
        delivery: A ``DeliveryPool`` (``notify(session_key)``, ``size``) or anything with
            ``pick(key).notify``: told, without waiting, of each reply a turn queued in the ledger.
        cap: Live sessions this host holds at most (``actors.placement.hosts.supervisor.host_capacity``).
        index: The supervisor's slot number of this host (a bounded metric label).
        incarnation: The starting host supervisor's incarnation id, part of this host's ledger
            owner id (``runtime.delivery.owners.host_owner``; ``solo``: a host without one).
    """

    def __init__(
        self,
        config: Config,
        setup_factory: SetupFactory,
        delivery: Any,
        cap: int,
        index: int = 0,
        *,
        incarnation: str = "solo",
    ) -> None:
        skip_httpx_cli()
        with contextlib.suppress(Exception):
            from actors.raylife.metrics import install_ray_metrics

            install_ray_metrics()
        tracing.configure(getattr(config, "tracing", None), "host")
        rt = config.runtime
        self._config, self._factory, self._delivery = config, setup_factory, delivery
        self.cap, self.index = cap, index
        self._incarnation = incarnation
        self._rt = rt
        self._live: dict[str, LiveSession] = {}
        self._opening = 0
        """Activations in progress (each holds a slot from its first await on)."""
        self._room = RoomWaiters()  # activations waiting for a session to turn idle
        self._in_host = self._host_sender() if rt.deliver_in_host else None
        """The chats' head replies this host sends itself (docs/decisions.md#delivery-in-host)."""
        self._seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._routers: dict[str, Any] = {}
        self._repo: Any = None
        self._uss = 0.0
        self._beat = time.monotonic()  # last sweep of the sessions' loop (read by ping_turn)
        self.stats = {"activated": 0, "passivated": 0, "accepted": 0, "busy": 0, "duplicate": 0, "moved": 0}
        self._loop = new_loop()
        # plain-function tools run on the loop's default executor: room for many at once
        self._loop.set_default_executor(
            concurrent.futures.ThreadPoolExecutor(TOOL_THREADS, thread_name_prefix="host-tool")
        )
        threading.Thread(target=self._loop.run_forever, name="host-loop", daemon=True).start()
        self._prepared: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._prepared.set_running_or_notify_cancel()
        threading.Thread(target=self._prepare, name="host-prepare", daemon=True).start()

    def _prepare(self) -> None:
        """Warm-up in a background thread: open the repository, import the session core, run the
        key-independent part of an activation (:func:`actors.placement.hosts.support.warm_up`), then start the
        sweep. A failed repository open is kept and retried by the first activation."""
        try:
            repo = open_repository(self._config)
            import runtime.session.core  # noqa: F401  (warm the import for the first activation)
        except BaseException as exc:
            self._prepared.set_exception(exc)
            return
        try:
            warm_up(repo, self._factory, self._loop)
        except Exception:  # pragma: no cover - logged; the activation repeats the step and raises
            log.warning("session host warm-up failed; the first activation pays it", exc_info=True)
        release_free_heap()
        self._uss = process_uss_mib()
        # the first metric recorded imports Ray's metrics module: now, not in the first activation
        metrics.HOST_MEMORY.set(self._uss * 1024 * 1024, host=str(self.index))
        self._prepared.set_result(repo)
        asyncio.run_coroutine_threadsafe(self._sweep(), self._loop)

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    # ------------------------------------------------------------------ probes (both groups)

    @ray.method(concurrency_group="control")
    async def ping(self) -> int:
        """This host's process id, once the warm-up ended (or ``PREPARE_WAIT_S`` passed)."""
        if not self._prepared.done():
            await asyncio.wait({asyncio.wrap_future(self._prepared)}, timeout=PREPARE_WAIT_S)
        return os.getpid()

    @ray.method(concurrency_group="turn")
    async def ping_turn(self) -> int:
        """Liveness of the ``turn`` group's event loop (see :mod:`actors.raylife.compat`) and of the
        sessions' loop: answers at once while the sessions' loop beat within the last
        ``runtime.hung_ping_timeout_s`` (a loop that is merely busy still beats; a blocked or
        stopped one does not), else waits for its next beat."""
        if time.monotonic() - self._beat < self._rt.hung_ping_timeout_s:
            return os.getpid()
        return await self._on_loop(current_pid())

    # ------------------------------------------------------------------ activation (turn group)

    @ray.method(concurrency_group="turn")  # may wait for room: never in the bounded control group
    async def activate(
        self, session_key: str, epoch: int, router: str, evict: bool = False, wait_s: float = 0.0
    ) -> dict[str, Any]:
        """Load ``session_key`` from SQL into a new core (idempotent for the same epoch).

        Args:
            epoch: The router shard's placement epoch of this activation.
            router: Name of the session's router shard (told when the host passivates it).
            evict: At capacity, passivate the least recently used idle session for it.
            wait_s: With ``evict``, how long to wait for a session to turn idle when none is, in
                seconds (each session whose turn ends wakes one waiting activation, oldest first).

        Returns:
            ``{"status": "activated", "session_id", "messages", "live", "load_ms", "pid", "evicted"}``,
            or at capacity ``{"status": "full", "live", "cap", "reason"}`` (module docstring).

        Raises:
            SessionKeyError / database errors from the repository.
        """
        t0 = time.perf_counter()
        try:
            info = await self._on_loop(self._activate(session_key, epoch, router, evict, wait_s))
        except HostFullError as exc:
            return {"status": "full", "live": len(self._live), "cap": self.cap, "reason": str(exc)}
        info["load_ms"] = (time.perf_counter() - t0) * 1000
        metrics.ACTIVATION_LATENCY.observe(info["load_ms"] / 1000, source="host")
        return info

    async def _activate(
        self, key: str, epoch: int, router: str, evict: bool, wait_s: float
    ) -> dict[str, Any]:
        live = self._live.get(key)
        if live is not None:
            live.epoch, live.router = epoch, router  # the shard re-placed it here (it lost its entry)
            return self._info(live, None)
        self._opening += 1  # reserved before the first await: concurrent activations see it
        try:
            evicted = await self._make_room(evict, time.monotonic() + wait_s)
            return await self._open(key, epoch, router, evicted)
        finally:
            self._opening -= 1

    async def _make_room(self, evict: bool, deadline: float) -> str | None:
        """Passivate least recently used idle sessions while this host is over ``cap`` (counting
        activations in progress), and one when its USS is above ``runtime.host_memory_mib``;
        with ``evict`` and no idle session, wait for one until ``deadline`` (monotonic seconds).
        Returns the last evicted key.

        Raises:
            HostFullError: room is needed and ``evict`` is false or no session turned idle in time.
        """
        evicted = None
        memory = self._uss > self._rt.host_memory_mib and bool(self._live)
        while len(self._live) + self._opening > self.cap or memory:
            victims = evictable(self._live, time.monotonic())
            if evict and not victims and (left := deadline - time.monotonic()) > 0:
                self._opening -= 1  # a waiting activation holds no slot (others' room counts)
                try:
                    await self._room.wait(min(left, ROOM_RECHECK_S))
                finally:
                    self._opening += 1
                continue
            if not evict or not victims:
                raise HostFullError(
                    f"host {self.index} holds {len(self._live)}/{self.cap} sessions, {self._uss:.0f} MiB"
                )
            evicted = min(victims)[2]
            await self._passivate(evicted, "memory" if memory else "lru")
            memory = False
        return evicted

    async def _open(self, key: str, epoch: int, router: str, evicted: str | None) -> dict[str, Any]:
        from runtime.session.core import SessionCore
        from runtime.session.turn import SessionSetup

        if self._repo is None:
            try:
                self._repo = await asyncio.wrap_future(self._prepared)
            except Exception:  # the warm-up failed (e.g. database down at start): try again now
                self._repo = open_repository(self._config)
        setup = self._factory(key)
        if asyncio.iscoroutine(setup):
            setup = await setup
        assert isinstance(setup, SessionSetup)
        core = await SessionCore.open(
            key,
            self._repo,
            setup,
            self._deliver,
            max_concurrent_turns=self._config.runtime.max_concurrent_turns,
            spawn=spawn_ray_task,
            delivery_partitions=self._partitions(),
        )
        if key in self._live:  # a concurrent activation of the same key won (same epoch rules)
            await core.close()
            return self._info(self._live[key], evicted)
        live = self._live[key] = LiveSession(core=core, epoch=epoch, router=router)
        self.stats["activated"] += 1
        metrics.ACTIVATIONS.inc(source="host")
        return self._info(live, evicted)

    def _info(self, live: LiveSession, evicted: str | None) -> dict[str, Any]:
        return {
            "status": "activated",
            "session_id": live.core.session_id,
            "messages": len(live.core.writer),
            "live": len(self._live),
            "pid": os.getpid(),
            "evicted": evicted,
        }

    @ray.method(concurrency_group="control")
    async def passivate(self, session_key: str, reason: str = "admin", force: bool = False) -> bool:
        """Passivate ``session_key`` (its state is all in SQL); False when it is busy and ``force``
        is false, or not held here. Tells the session's router shard."""
        return await self._on_loop(self._passivate(session_key, reason, force))

    async def _passivate(self, key: str, reason: str, force: bool = False) -> bool:
        live = self._live.get(key)
        if live is None or (not live.idle and not force):
            return False
        del self._live[key]  # from here a message for it is answered "moved"
        self._room.wake_one()
        await live.core.close()
        self.stats["passivated"] += 1
        metrics.PASSIVATIONS.inc(reason=reason)
        router = self._router(live.router)
        if router is not None:
            router.forget.remote(key, live.epoch)
        if not self._live:
            await release_sql_connections(self._repo)
        return True

    def _router(self, name: str) -> Any:
        if name not in self._routers:
            try:
                self._routers[name] = ray.get_actor(name, namespace="sessionray")
            except Exception:  # a router that is gone re-learns from its own failed lookups
                return None
        return self._routers[name]

    async def _sweep(self) -> None:
        """Every ``SWEEP_S``: beat (``ping_turn``), passivate sessions idle for ``idle_ttl_s``;
        every ``USS_EVERY`` sweeps read this process's USS (``smaps_rollup`` costs milliseconds
        in a large process, so not every second)."""
        sweeps = 0
        while True:
            await asyncio.sleep(SWEEP_S)
            self._beat = time.monotonic()
            sweeps += 1
            try:
                if sweeps % USS_EVERY == 0:
                    self._uss = process_uss_mib()
                    metrics.HOST_MEMORY.set(self._uss * 1024 * 1024, host=str(self.index))
                metrics.HOST_LIVE_SESSIONS.set(len(self._live), host=str(self.index))
                now = time.monotonic()
                for key, live in list(self._live.items()):
                    if (
                        live.idle
                        and now - max(live.last_used, live.core.last_activity) >= self._rt.idle_ttl_s
                    ):
                        await self._passivate(key, "idle")
            except Exception:  # pragma: no cover - logged; the sweep keeps running
                log.exception("host sweep failed")

    # ------------------------------------------------------------------ messages (turn group)

    @ray.method(concurrency_group="turn", num_returns="streaming")
    async def submit(self, inbound: Any, epoch: int, attempt: int = 0) -> AsyncIterator[Any]:
        """Accept one inbound message for a live session, then run its turn.

        Yields (a Ray streaming generator: the caller answers the webhook after the first item):

        1. ``{"status": "accepted" | "duplicate" | "busy" | "moved", "seq": int | None}`` (with
           ``retry_after_s`` when busy, ``done`` when duplicate: its reply is recorded) —
           ``moved``: this host does not hold the session at ``epoch`` (ask the router shard);
           ``busy``: ``runtime.mailbox_size`` messages of the session are pending.
        2. only when accepted: the :class:`~runtime.session.turn.TurnResult` once the turn queued
           its reply in the delivery ledger (not waiting for the platform), or ended otherwise.
        """
        fut = asyncio.run_coroutine_threadsafe(self._accept(inbound, epoch, attempt), self._loop)
        answer, task = await asyncio.wrap_future(fut)
        yield answer
        if task is not None:  # the turn runs whether or not the caller still listens
            yield await self._on_loop(shielded(task))

    async def _accept(
        self, inbound: Any, epoch: int, attempt: int
    ) -> tuple[dict[str, Any], asyncio.Task[TurnResult] | None]:
        live = self._live.get(inbound.session_key)
        if live is None or live.epoch != epoch:
            self.stats["moved"] += 1
            return {"status": "moved", "seq": None}, None
        dk = (inbound.platform, inbound.bot_id, inbound.message_id)
        if dk in self._seen or (attempt == 0 and recorded(live, inbound.message_id)):
            self.stats["duplicate"] += 1
            return {"status": "duplicate", "seq": None, "done": answered(live, inbound.message_id)}, None
        if live.pending >= self._rt.mailbox_size:
            self.stats["busy"] += 1
            return {"status": "busy", "seq": None, "retry_after_s": self._rt.busy_retry_after_s}, None
        self._seen[dk] = None
        while len(self._seen) > self._rt.dedup_window:
            self._seen.popitem(last=False)
        seq, live.next_seq, live.fresh = live.next_seq, live.next_seq + 1, False
        live.pending += 1
        live.last_used = time.monotonic()
        self.stats["accepted"] += 1
        parent = getattr(inbound, "traceparent", None)
        with tracing.span("host.accept", parent=parent, seq=seq, attempt=attempt) as step:
            from runtime.session.turn import TurnInput

            update = {"attempt": attempt, "traceparent": step.traceparent() or parent}
            turn = TurnInput.from_inbound(inbound, seq).model_copy(update=update)
        return {"status": "accepted", "seq": seq}, asyncio.ensure_future(self._run(live, turn))

    async def _run(self, live: LiveSession, turn: TurnInput) -> TurnResult:
        try:
            result: TurnResult = await live.core.submit(turn)
            if result.outcome == "error":  # not handled: a replay from the inbox must not be a duplicate
                self._seen.pop((turn.platform, turn.bot_id, turn.message_id), None)
            return result
        finally:
            live.pending -= 1
            live.turns += 1
            live.last_used = time.monotonic()
            if live.pending == 0:
                self._room.wake_one()

    async def _deliver(self, job: DeliveryJob) -> None:
        # On the sessions' loop, after the turn queued the reply in the ledger: send it here when
        # it is its chat's head (docs/decisions.md#delivery-in-host), else tell the chat's
        # delivery actor and do not wait (docs/decisions.md#delivery-outbox).
        # A job that is its chat's head goes with the notice: sent without a read of the queue.
        if self._in_host is not None:
            self._in_host.hand_over(job)
        else:
            self._notify(job.session_key, job if job.head_at is not None else None)

    def _notify(self, session_key: str, head: DeliveryJob | None) -> None:
        if hasattr(self._delivery, "notify"):  # DeliveryPool
            self._delivery.notify(session_key, head)
        else:
            self._delivery.pick(session_key).notify.remote(session_key, head)

    def _host_sender(self) -> Any:
        """The :class:`runtime.delivery.in_host.HostSender` of this host: its sender opens on the
        first head reply, on the host's database, as owner
        ``host:<supervisor incarnation>:<this actor's id>``."""
        from runtime.delivery.in_host import HostSender, host_owner, open_sender

        actor_id = ray.get_runtime_context().get_actor_id() or f"local-{os.getpid()}"
        owner = host_owner(self._incarnation, actor_id)
        return HostSender(
            lambda: open_sender(self._config, self._repo.db, owner), self._notify, self._partitions()
        )

    def _partitions(self) -> int:
        """Delivery actors in the pool: a chat's ledger ``partition`` is ``crc32(key) % this``."""
        return int(getattr(self._delivery, "size", None) or self._rt.delivery_actors)

    # ------------------------------------------------------------------ control (control group)

    @ray.method(concurrency_group="control")
    async def control(self, request: ControlRequest) -> ControlReply:
        """Carry out ``request`` on a live session (:func:`runtime.session.control.run_control`);
        the router shard checked the sender of the master-only kinds.

        Raises:
            SessionNotBoundError: the session is not live on this host.
        """

        from runtime.session.control import run_control

        async def run() -> ControlReply:
            live = self._require(request.session_key)
            live.last_used = time.monotonic()
            reply = await run_control(live.core, request)
            if request.kind.master_only and reply.result == "started":
                live.turns += 1
            return reply

        return await self._on_loop(run())

    def _require(self, key: str) -> LiveSession:
        live = self._live.get(key)
        if live is None:
            raise SessionNotBoundError(f"session {key!r} is not live on host {self.index}")
        return live

    @ray.method(concurrency_group="control")
    async def sessions(self, keys: list[str] | None = None) -> list[dict[str, Any]]:
        """Per live session (all, or those of ``keys``): :func:`actors.placement.hosts.state.session_rows`."""

        async def run() -> list[dict[str, Any]]:
            return session_rows(self._live, keys, time.monotonic())

        return await self._on_loop(run())

    @ray.method(concurrency_group="control")
    async def status(self, session_key: str | None = None) -> dict[str, Any]:
        """With ``session_key``: that core's ``status()`` plus ``pid`` and ``host``. Without: the
        host's :func:`actors.placement.hosts.state.host_row`.

        Raises:
            SessionNotBoundError: ``session_key`` is not live here.
        """

        if session_key is None:  # plain reads, answered even while the sessions' loop is busy
            return host_row(self.index, self.cap, self._uss, self._live, self.stats)

        async def run() -> dict[str, Any]:
            return {**self._require(session_key).core.status(), "pid": os.getpid(), "host": self.index}

        return await self._on_loop(run())

    @ray.method(concurrency_group="control")
    async def context_messages(self, session_key: str) -> list[dict[str, Any]]:
        """The live context of ``session_key`` as JSON dicts (admin/debug and tests)."""

        async def run() -> list[dict[str, Any]]:
            return [m.model_dump(mode="json") for m in self._require(session_key).core.writer.snapshot()]

        return await self._on_loop(run())

    @ray.method(concurrency_group="control")
    async def shutdown(self, timeout_s: float = 5.0) -> int:
        """Close every live session at once — running turns are aborted, each close waits at most
        ``timeout_s`` — without telling the router shards (they stop too); returns how many were
        live. Their state is all in SQL."""

        async def run() -> int:
            lives = list(self._live.values())
            self._live.clear()
            closing = (s.core.close(timeout_s, "the shutdown") for s in lives)
            await asyncio.gather(*closing, return_exceptions=True)
            if self._in_host is not None:  # the head replies it sends: what is left, the sweep sends
                await self._in_host.close(min(timeout_s, 2.0))
            return len(lives)

        return await asyncio.wait_for(self._on_loop(run()), timeout_s + 5.0)

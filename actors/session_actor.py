"""``SessionActor``: one Ray actor per *live* session
(docs/decisions.md#session-warm-pool).

A blank actor waits in the warm pool (``actors/pool.py``); :meth:`SessionActor.activate` binds
it to a session key (loads the context from SQL), :meth:`SessionActor.passivate` resets it for
the next session. All session logic lives in :class:`runtime.session.core.SessionCore`; this
class only hosts it.

Threads and loops (why it looks like this):

* Two Ray concurrency groups: ``turn`` (``submit``, one pending call per inbox entry) and
  ``control`` (``activate``, ``passivate``, ``control`` — steer, follow-up, abort, archive as one
  :class:`~runtime.session.control.ControlRequest` — ``status``, ``context_messages``, ``ping``).
  Each group has its own Ray thread, so a control call is never queued behind turns
  (docs/decisions.md#control-never-waits; measured 2.5–9 ms while a 3 s turn runs).
* The :class:`SessionCore` itself lives on **one** private asyncio loop thread (uvloop when
  available) started in ``__init__``; both groups forward to it with
  ``run_coroutine_threadsafe``. One loop means one writer and no cross-loop asyncio objects.

Crash safety (item 8): created with ``max_restarts=-1`` (a killed process restarts blank) and
``max_task_retries=0`` (Ray never re-runs a call: a send is not idempotent by accident). The
router sees the failed ``submit`` and re-activates the session on a fresh actor; see
``actors/router.py``.

Models inside actors: providers and faux scripts are process-local, so the actor builds its
:class:`~runtime.session.turn.SessionSetup` itself by calling the picklable ``setup_factory`` it was
created with (tests pass a factory that registers a faux model whose replies are functions of
the context; see tests/actors/session_scripts.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import logging
import os
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import ray

from actors.ray_compat import install_group_loop_fix
from runtime.config import Config
from runtime.delivery.job import DeliveryJob
from runtime.session.control import ControlReply, ControlRequest, run_control
from runtime.session.turn import SessionSetup, SetupFactory, TurnInput, TurnResult

__all__ = ["SessionActor", "SessionNotBoundError", "process_uss_mib"]

T = TypeVar("T")
log = logging.getLogger("sessionray.session_actor")

# Ray imports this module in a SessionActor's worker before it builds the actor's concurrency-group
# event loops; the fix must be in place by then (see actors/ray_compat.py).
install_group_loop_fix()

TURN_GROUP_SIZE = 256
"""Concurrent ``submit`` calls one actor accepts (≥ the router's mailbox bound)."""
CONTROL_GROUP_SIZE = 32
SQLITE_BUSY_TIMEOUT_MS = 15_000
"""SQLite only: how long a session's write waits for the file lock, in ms. Under load dozens of
processes share one SQLite file and the default 5 s made turns fail with "database is locked"
(the runtime benchmark, 100 sessions); the ingress already waits 15 s."""
SQL_THREADS = 1
"""SQL threads (and pooled connections) of a session actor's database. One is enough: a session's
appends are serialized by its writer anyway, and each extra thread and connection is private
memory (stack, SQLite page cache) in every live session — and a PostgreSQL connection each.
The pool has no overflow (docs/decisions.md#memory-connection-budget): every SQL call of the actor
runs on this one thread and holds the connection only for its own transaction (none nests
another), so a live session holds at most one connection and a blank (pooled) actor none."""
WARM_UP_SESSION_KEY = "sessionray:0:private:warm-up"
"""A well-formed session key no platform uses: the warm-up runs the activation's *read* queries
for it (never a write), so SQLAlchemy builds its mappers and statement caches in the pool."""
WARM_UP_TIMEOUT_S = 30.0
"""Bound on the warm-up's SQL reads, in seconds."""
PREPARE_WAIT_S = 10.0
"""How long ``ping`` waits for a new actor's warm-up, in seconds (below every pool ping timeout)."""


class SessionNotBoundError(RuntimeError):
    """A call for a session reached an actor that does not hold it — typically the blank
    incarnation Ray restarted after the process died. The router re-binds the session."""


def process_uss_mib(pid: int | str = "self") -> float:
    """Unique set size of process ``pid`` (default: this one) in MiB — what the process really
    costs: Private_Clean + Private_Dirty of Linux's ``/proc/<pid>/smaps_rollup``; 0.0 where that
    file cannot be read (then memory-based recycling never triggers)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    kib = sum(
        int(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("Private_Clean:", "Private_Dirty:"))
    )
    return kib / 1024


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0,
    max_restarts=-1,
    max_task_retries=0,
    concurrency_groups={"turn": TURN_GROUP_SIZE, "control": CONTROL_GROUP_SIZE},
)
class SessionActor:
    """Hosts one live :class:`~runtime.session.core.SessionCore` at a time.

    Args:
        config: The loaded ``runtime.config.Config`` (``database.url``;
            ``runtime.max_concurrent_turns``).
        setup_factory: ``(session_key) -> SessionSetup`` called at each activation.
        delivery: An object with ``pick(session_key) -> actor handle`` whose ``deliver`` method
            takes a ``DeliveryJob`` (EDGE's ``actors.delivery.DeliveryPool``).
    """

    def __init__(self, config: Config, setup_factory: SetupFactory, delivery: Any) -> None:
        _skip_httpx_cli()
        with contextlib.suppress(Exception):
            from actors.ray_metrics import install_ray_metrics

            install_ray_metrics()
        self._config = config
        self._factory = setup_factory
        self._delivery = delivery
        self._core: Any = None
        self._repo: Any = None
        self._sessions_served = 0
        self._warm_ms = 0.0
        self._loop = _new_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="session-loop", daemon=True)
        self._thread.start()
        # Warm-up while the actor waits in the pool: importing the SQL stack (sqlalchemy/sqlmodel,
        # ≈ 0.2–0.8 s on this machine) and opening the database must not be paid by the first
        # activation (warm activation ≥ 50× faster than a cold actor:
        # docs/decisions.md#session-warm-pool).
        self._prepared: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._prepared.set_running_or_notify_cancel()  # an awaiting caller's cancellation never cancels it
        threading.Thread(target=self._prepare, name="session-prepare", daemon=True).start()

    def _prepare(self) -> None:
        """Warm-up while the actor waits in the pool (background thread of ``__init__``): open the
        repository, import the session core, then everything of an activation that does not
        depend on the session key (see :func:`_warm_up`). A failure to open the repository is kept
        and retried by the first activation, which then raises it; a failed warm-up step is only
        logged (the activation does the same work again and raises its error)."""
        t0 = time.perf_counter()
        try:
            repo = _open_repository(self._config)
            import runtime.session.core  # noqa: F401  (warm the import for the first activation)
        except BaseException as exc:
            self._prepared.set_exception(exc)
            return
        try:
            _warm_up(repo, self._factory, self._loop)
        except Exception:  # pragma: no cover - logged; the activation repeats the step and raises
            log.warning("session actor warm-up failed; the first activation pays it", exc_info=True)
        self._warm_ms = (time.perf_counter() - t0) * 1000
        _release_free_heap()
        self._prepared.set_result(repo)

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    # ------------------------------------------------------------------ lifecycle (control group)

    @ray.method(concurrency_group="control")
    async def ping(self) -> int:
        """Liveness probe; returns this actor's process id once the warm-up (SQL stack import,
        database open) ended or ``PREPARE_WAIT_S`` passed — so a pooled actor is really warm. A
        failed warm-up does not fail the ping (the first activation retries it)."""
        if not self._prepared.done():
            await asyncio.wait({asyncio.wrap_future(self._prepared)}, timeout=PREPARE_WAIT_S)
        return os.getpid()

    @ray.method(concurrency_group="turn")
    async def ping_turn(self) -> int:
        """Liveness probe of the ``turn`` concurrency group; returns this actor's process id.

        Ray starts one event-loop thread per concurrency group; a race in Ray 2.60 can make such a
        thread die at start-up ("this event loop is already running") while the actor lives on,
        and every call of that group would then hang (cause and fix: :mod:`actors.ray_compat`).
        The pool calls this (and :meth:`ping`, the ``control`` group) before it counts an actor
        as warm, as a second line of defence."""
        return os.getpid()

    @ray.method(concurrency_group="control")
    async def activate(self, session_key: str, next_seq: int = 1) -> dict[str, Any]:
        """Bind this blank actor to ``session_key``: build its setup, load its context from SQL.

        Args:
            session_key: ``platform:bot_id:scope:scene_id``.
            next_seq: First inbox ``seq`` to expect (the router's lowest pending seq).

        Returns:
            ``{"session_id", "messages" (loaded context length), "pid", "load_ms"}``.

        Raises:
            RuntimeError: the actor is already bound to another session.
            SessionKeyError / database errors from the repository.
        """
        t0 = time.perf_counter()
        info = await self._on_loop(self._activate(session_key, next_seq))
        info["load_ms"] = (time.perf_counter() - t0) * 1000
        return info

    async def _activate(self, session_key: str, next_seq: int) -> dict[str, Any]:
        from runtime.session.core import SessionCore

        if self._core is not None:
            if self._core.session_key == session_key:
                return {
                    "session_id": self._core.session_id,
                    "messages": len(self._core.writer),
                    "pid": os.getpid(),
                }
            raise RuntimeError(f"actor already bound to {self._core.session_key}")
        if self._repo is None:
            try:
                self._repo = await asyncio.wrap_future(self._prepared)
            except Exception:  # the warm-up failed (e.g. database down at start): try again now
                self._repo = _open_repository(self._config)
        setup = self._factory(session_key)
        if asyncio.iscoroutine(setup):
            setup = await setup
        assert isinstance(setup, SessionSetup)
        self._core = await SessionCore.open(
            session_key,
            self._repo,
            setup,
            self._deliver,
            next_seq=next_seq,
            max_concurrent_turns=self._config.runtime.max_concurrent_turns,
            spawn=_spawn_ray_task,
        )
        return {"session_id": self._core.session_id, "messages": len(self._core.writer), "pid": os.getpid()}

    @ray.method(concurrency_group="control")
    async def passivate(self, force: bool = False) -> dict[str, Any]:
        """Unbind the session (its state is all in SQL) and reset for reuse.

        Args:
            force: Abort running turns instead of refusing.

        Returns:
            ``{"ok": bool, "session_key", "sessions_served", "uss_mib"}``; ``ok`` is False when the
            session is busy and ``force`` is False (nothing changed).
        """
        return await self._on_loop(self._passivate(force))

    async def _passivate(self, force: bool) -> dict[str, Any]:
        core = self._core
        key = core.session_key if core is not None else None
        if core is not None:
            if not core.idle and not force:
                return {
                    "ok": False,
                    "session_key": key,
                    "sessions_served": self._sessions_served,
                    "uss_mib": 0.0,
                }
            await core.close()
            self._core = None
            self._sessions_served += 1
            await _release_sql_connections(self._repo)
            _release_free_heap()
        return {
            "ok": True,
            "session_key": key,
            "sessions_served": self._sessions_served,
            "uss_mib": process_uss_mib(),
        }

    # ------------------------------------------------------------------ turns (turn group)

    @ray.method(concurrency_group="turn")
    async def submit(self, turn: TurnInput) -> TurnResult:
        """Queue one inbox entry; returns when its turn ended (reply handed to delivery).

        Raises:
            SessionNotBoundError: the actor is not bound to ``turn.session_key``.
            ValueError: the seq was already submitted to this activation.
        """
        return await self._on_loop(self._submit(turn))

    async def _submit(self, turn: TurnInput) -> TurnResult:
        core = self._require(turn.session_key)
        return await core.submit(turn)

    def _require(self, session_key: str) -> Any:
        if self._core is None or self._core.session_key != session_key:
            bound = self._core.session_key if self._core is not None else None
            raise SessionNotBoundError(f"session {session_key} is not bound to this actor (bound: {bound})")
        return self._core

    async def _deliver(self, job: DeliveryJob) -> None:
        # Runs on the session loop; returns once the delivery actor accepted the job.
        if hasattr(self._delivery, "deliver"):  # DeliveryPool: also survives a delivery actor restart
            await self._delivery.deliver(job)
        else:
            await self._delivery.pick(job.session_key).deliver.remote(job)

    # ------------------------------------------------------------------ control (control group)

    @ray.method(concurrency_group="control")
    async def control(self, request: ControlRequest) -> ControlReply:
        """Carry out a control request on the bound session (:func:`runtime.session.control.run_control`:
        steer, follow-up, abort, archive). The router checked the sender of the master-only kinds.

        Raises:
            SessionNotBoundError: the actor is not bound to ``request.session_key``.
        """

        async def run() -> ControlReply:
            return await run_control(self._require(request.session_key), request)

        return await self._on_loop(run())

    @ray.method(concurrency_group="control")
    async def status(self) -> dict[str, Any]:
        """``SessionCore.status()`` plus ``pid``, ``sessions_served``, ``warm_up_ms`` (how long the
        pool warm-up took; 0.0 until it ended) and ``modules`` (``len(sys.modules)``: an
        activation of a warmed actor imports nothing) — ``session_key`` None when blank."""

        async def run() -> dict[str, Any]:
            base = self._core.status() if self._core is not None else {"session_key": None}
            return {
                **base,
                "pid": os.getpid(),
                "sessions_served": self._sessions_served,
                "warm_up_ms": round(self._warm_ms, 2),
                "modules": len(sys.modules),
            }

        return await self._on_loop(run())

    @ray.method(concurrency_group="control")
    async def context_messages(self, session_key: str) -> list[dict[str, Any]]:
        """The live context as JSON dicts (admin/debug and tests)."""

        async def run() -> list[dict[str, Any]]:
            return [m.model_dump(mode="json") for m in self._require(session_key).writer.snapshot()]

        return await self._on_loop(run())


@ray.remote(num_cpus=0, max_retries=0)
def _deferred_task(fn: Any, args: dict[str, Any]) -> str:
    """A deferred task's function, run as a Ray task (``run_deferred_task``,
    docs/decisions.md#session-extra-tools)."""
    return str(fn(args))


async def _spawn_ray_task(fn: Any, args: dict[str, Any]) -> str:
    """``SpawnFn`` of session actors: delegate the work to a Ray task, await its text."""
    return str(await _deferred_task.remote(fn, args))


def _open_repository(config: Any) -> Any:
    from runtime.memory.db import Database
    from runtime.memory.repository import ContextRepository

    url = getattr(getattr(config, "database", None), "url", None)
    db = Database(url, threads=SQL_THREADS, busy_timeout_ms=SQLITE_BUSY_TIMEOUT_MS, max_overflow=0)
    db.create_tables()
    return ContextRepository(db)


def _warm_up(repo: Any, factory: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Do, before any session is bound, the work of an activation that does not depend on the
    session key (warm activation ≥ 50× faster than a cold actor:
    docs/decisions.md#session-warm-pool):

    * ``factory.prepare(database=repo.db)`` when the setup factory has it (optional hook of a
      :data:`~runtime.session.turn.SetupFactory`: imports, provider registration, model and tool building;
      ``database`` is the actor's :class:`~runtime.memory.db.Database`, which the factory may
      share instead of opening its own);
    * the activation's SQL reads for :data:`WARM_UP_SESSION_KEY` (``list_sessions`` and
      ``load_context``; no row is written), on the session loop, so SQLAlchemy configures its
      mappers and compiles the statements now — ≈ 20–30 ms otherwise paid by the first activation;
    * the sender-block check's look-alike tables (:mod:`runtime.reply.textnorm`, built on first use:
      60–200 ms that would otherwise stall the first turn's loop).

    Afterwards (also when a step failed) a PostgreSQL connection the warm-up opened is closed:
    a blank actor in the pool holds none (docs/decisions.md#memory-connection-budget).

    Raises:
        Whatever ``factory.prepare`` or the repository raise; TimeoutError after
        ``WARM_UP_TIMEOUT_S`` seconds.
    """
    from runtime.keys import make_session_id

    async def reads() -> None:
        await repo.list_sessions(WARM_UP_SESSION_KEY)
        await repo.load_context(make_session_id(WARM_UP_SESSION_KEY, 1))

    prepare = getattr(factory, "prepare", None)
    try:
        if callable(prepare):
            prepare(database=repo.db)
        from runtime.memory.sender import strip_forged_prefix

        strip_forged_prefix("[sender:id=0] warm-up")
        asyncio.run_coroutine_threadsafe(reads(), loop).result(WARM_UP_TIMEOUT_S)
    finally:  # queued behind the reads on the SQL thread, so their connection is back in the pool
        asyncio.run_coroutine_threadsafe(_release_sql_connections(repo), loop).result(WARM_UP_TIMEOUT_S)


async def _release_sql_connections(repo: Any) -> None:
    """PostgreSQL: close the idle pooled connection of ``repo.db`` after the SQL already queued on
    its thread (a passivated or blank session actor holds no PostgreSQL connection;
    docs/decisions.md#memory-connection-budget). The
    next activation opens a new one (a few ms). SQLite keeps its connection (no server slot).
    A failure is logged, never raised: the session's state is all in SQL already."""
    db = getattr(repo, "db", None)
    if db is None or db.is_sqlite:
        return
    try:
        await db.run(db.release_connections)
    except Exception:  # pragma: no cover - closing sockets; logged
        log.warning("could not close the session actor's PostgreSQL connections", exc_info=True)


def _skip_httpx_cli() -> None:
    """Keep httpx's command-line client out of this (session actor) process: ``import httpx``
    tries ``from httpx._main import main``, which imports click and pygments when they are
    installed (≈ 1.6 MiB USS, 19 modules, measured) — per live session, for a CLI no actor runs.
    A ``None`` entry in ``sys.modules`` makes that import fail, and httpx then defines a stub
    ``main`` (its documented fallback when the ``cli`` extra is missing). Call before anything
    imports httpx; a no-op once httpx is imported."""
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


def _release_free_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim(0)``) after the warm-up and
    after a passivation, so freed import/parse garbage does not stay in the process's USS (the
    figure ``recycle_memory_mib`` and the benchmark read). A no-op without glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)

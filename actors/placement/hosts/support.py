"""Process-level helpers of a :class:`actors.placement.hosts.host.SessionHost` (one Ray worker process hosting
many sessions): the SQL repository it opens, the warm-up before its first activation, memory
figures and trimming, the event loop its sessions run on, and deferred tasks as Ray tasks
(docs/decisions.md#session-hosts)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import sys
from pathlib import Path
from typing import Any

import ray

from actors.raylife.compat import install_group_loop_fix

__all__ = [
    "SQLITE_BUSY_TIMEOUT_MS",
    "WARM_UP_SESSION_KEY",
    "new_loop",
    "open_repository",
    "process_uss_mib",
    "release_free_heap",
    "release_sql_connections",
    "skip_httpx_cli",
    "spawn_ray_task",
    "warm_up",
]

log = logging.getLogger("sessionray.host")

# Ray unpickles a SessionHost in its worker by value, importing only the modules its code refers
# to (this one, not actors.placement.hosts.host), and only then builds the concurrency-group loops: the guard
# against their start-up race must be installed here (actors/raylife/compat.py).
install_group_loop_fix()

SQLITE_BUSY_TIMEOUT_MS = 15_000
"""SQLite only: how long a host's write waits for the file lock, in ms. Under load several
processes share one SQLite file and the default 5 s made turns fail with "database is locked"
(the runtime benchmark, 100 sessions); the ingress already waits 15 s."""
WARM_UP_SESSION_KEY = "sessionray:0:private:warm-up"
"""A well-formed session key no platform uses: the warm-up runs the activation's *read* queries
for it (never a write), so SQLAlchemy builds its mappers and statement caches before the first
real activation."""
WARM_UP_TIMEOUT_S = 30.0
"""Bound on the warm-up's SQL reads, in seconds."""


def process_uss_mib(pid: int | str = "self") -> float:
    """Unique set size of process ``pid`` (default: this one) in MiB — what the process really
    costs: Private_Clean + Private_Dirty of Linux's ``/proc/<pid>/smaps_rollup``; 0.0 where that
    file cannot be read (then ``runtime.host_memory_mib`` never triggers)."""
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


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()


@ray.remote(num_cpus=0, max_retries=0)
def _deferred_task(fn: Any, args: dict[str, Any]) -> str:
    """A deferred task's function, run as a Ray task (``run_deferred_task``,
    docs/decisions.md#session-extra-tools)."""
    return str(fn(args))


async def spawn_ray_task(fn: Any, args: dict[str, Any]) -> str:
    """``SpawnFn`` of session hosts: delegate the work to a Ray task, await its text."""
    return str(await _deferred_task.remote(fn, args))


def open_repository(config: Any) -> Any:
    """The host's :class:`~runtime.memory.repository.ContextRepository` on ``database.url``, after
    creating the tables a host writes that do not exist yet (memory, the delivery ledger, the usage
    ledger: their wings register them when imported, so they are imported here, not at the top of
    this module, which the supervisor imports too; docs/decisions.md#ops-lazy-exports).

    Raises:
        sqlalchemy.exc.OperationalError: the database is unreachable.
    """
    from runtime.delivery.tables import DeliveryLedgerRow, DeliveryUncertainRow
    from runtime.memory.connection_budget import HOST_SQL_THREADS
    from runtime.memory.db import Database
    from runtime.memory.repository import ContextRepository
    from runtime.memory.tables import register_tables
    from runtime.spend.ledger import UsageLedgerRow

    register_tables(DeliveryLedgerRow, DeliveryUncertainRow, UsageLedgerRow)  # the ones a host writes
    url = getattr(getattr(config, "database", None), "url", None)
    db = Database(url, threads=HOST_SQL_THREADS, busy_timeout_ms=SQLITE_BUSY_TIMEOUT_MS, max_overflow=0)
    db.create_tables()
    return ContextRepository(db)


def warm_up(repo: Any, factory: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Do, before any session is bound, the work of an activation that does not depend on the
    session key, so the first activation costs milliseconds (docs/decisions.md#session-hosts):

    * ``factory.prepare(database=repo.db)`` when the setup factory has it (optional hook of a
      :data:`~runtime.session.turn.SetupFactory`: imports, provider registration, model and tool building;
      ``database`` is the host's :class:`~runtime.memory.db.Database`, which the factory may
      share instead of opening its own);
    * the activation's SQL reads for :data:`WARM_UP_SESSION_KEY` (``list_sessions`` and
      ``load_context``; no row is written), on the session loop, so SQLAlchemy configures its
      mappers and compiles the statements now — ≈ 20–30 ms otherwise paid by the first activation;
    * the sender-block check's look-alike tables (:mod:`runtime.reply.textnorm`, built on first use:
      60–200 ms that would otherwise stall the first turn's loop).

    Afterwards (also when a step failed) a PostgreSQL connection the warm-up opened is closed:
    a host holds none while it has no live session (docs/decisions.md#memory-connection-budget).

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
        from runtime.reply.sender import strip_forged_prefix

        strip_forged_prefix("[sender:id=0] warm-up")
        asyncio.run_coroutine_threadsafe(reads(), loop).result(WARM_UP_TIMEOUT_S)
    finally:  # queued behind the reads on the SQL thread, so their connection is back in the pool
        asyncio.run_coroutine_threadsafe(release_sql_connections(repo), loop).result(WARM_UP_TIMEOUT_S)


async def release_sql_connections(repo: Any) -> None:
    """PostgreSQL: close the idle pooled connection of ``repo.db`` after the SQL already queued on
    its thread (a host without live sessions holds no PostgreSQL connection;
    docs/decisions.md#memory-connection-budget). The
    next activation opens a new one (a few ms). SQLite keeps its connection (no server slot).
    A failure is logged, never raised: the session's state is all in SQL already."""
    db = getattr(repo, "db", None)
    if db is None or db.is_sqlite:
        return
    try:
        await db.run(db.release_connections)
    except Exception:  # pragma: no cover - closing sockets; logged
        log.warning("could not close the session host's PostgreSQL connections", exc_info=True)


def skip_httpx_cli() -> None:
    """Keep httpx's command-line client out of this (session host) process: ``import httpx``
    tries ``from httpx._main import main``, which imports click and pygments when they are
    installed (≈ 1.6 MiB USS, 19 modules, measured) — per host, for a CLI no host runs.
    A ``None`` entry in ``sys.modules`` makes that import fail, and httpx then defines a stub
    ``main`` (its documented fallback when the ``cli`` extra is missing). Call before anything
    imports httpx; a no-op once httpx is imported."""
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]


def release_free_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim(0)``) after the warm-up and
    after a passivation, so freed import/parse garbage does not stay in the process's USS (the
    figure ``runtime.host_memory_mib`` and the benchmark read). A no-op without glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)

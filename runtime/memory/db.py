"""The SQL engine behind session memory: one :class:`Database` per process
(docs/decisions.md#memory-sql-truth).

URLs (SQLAlchemy form):

* default ``sqlite:///./data/sessionray.db`` — the parent directory is created, every
  connection runs ``PRAGMA journal_mode=WAL``, ``PRAGMA busy_timeout`` (``busy_timeout_ms``,
  default 5000 ms) and ``PRAGMA foreign_keys=ON``; write transactions start with
  ``BEGIN IMMEDIATE`` so two writers queue on the busy timeout instead of failing with
  "database is locked" when a read lock would have to be upgraded.
* ``postgresql+psycopg://user:password@host:5432/dbname`` — psycopg 3. A bare
  ``postgresql://`` or ``postgres://`` URL is rewritten to the psycopg 3 driver.

Start-up (:meth:`Database.create_tables`) only creates the memory tables that are missing; it
never drops, alters or rewrites an existing table (docs/decisions.md#memory-create-only).

All blocking SQL runs on the database's own thread pool through :meth:`Database.run`, so a
session host's event loop never waits on SQL — except a short SQLite write of the message path
(:meth:`Database.run_write` with ``inline=True``) while the writer lock is free: it runs at once
in the calling thread, which is cheaper than the hop (docs/decisions.md#memory-sql-off-loop).

Writers (docs/decisions.md#memory-write-path; the mechanics live in
:mod:`runtime.memory.write_path`):

* **Node-wide writer lock (SQLite)**: a write transaction (:meth:`Database.session` /
  :meth:`Database.connection` with ``write=True``) takes the process-wide re-entrant lock and the
  ``flock`` of ``<db file>.writer.lock`` once its pooled connection is checked out, and releases
  both right after commit or rollback; the wait is bounded by ``busy_timeout_ms``, then "database
  is locked" (retried by :meth:`Database.run_write`). ``BEGIN IMMEDIATE`` and ``busy_timeout``
  stay as the second line for tools that write the file without the lock. PostgreSQL: no lock.
* **Transient write errors are retried** by :meth:`Database.run_write` (SQLite "database is
  locked"/"busy"; PostgreSQL ``40001``, ``40P01`` and connection errors raised before commit)
  with capped exponential back-off and jitter for up to ``write_retry_s`` seconds, so a busy
  database never turns an accepted message into a lost turn.

Connections (docs/decisions.md#memory-connection-budget): the pool holds at most ``threads`` +
``max_overflow`` connections, on SQLite one more, kept for the writer lock's holder writing inline
(:attr:`Database.max_connections`; docs/decisions.md#memory-sql-off-loop). Every SQL call holds
one connection and runs through :meth:`Database.run` / :meth:`Database.run_write` (or
:meth:`Database.write_here`), never two at once: that is what keeps the bound and the reserve
true. :meth:`Database.release_connections`
closes the idle ones (a session host without live sessions keeps no PostgreSQL connection).

Stable names other modules rely on: :meth:`Database.session` (``write=True`` for writers),
:meth:`Database.connection` (SQLAlchemy Core, same ``write=``), :meth:`Database.run`,
:meth:`Database.run_write`, :meth:`Database.writer_lock`, :meth:`Database.insert`,
:func:`is_transient_write_error`, :attr:`Database.is_sqlite`, :attr:`Database.dialect` (``sqlite`` |
``postgresql``), :attr:`Database.engine`, and the connection execution option
``sessionray_sqlite_immediate=True`` (a transaction begun on such a SQLite connection is
``BEGIN IMMEDIATE``; :mod:`runtime.delivery.ledger` uses it).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from sqlalchemy import Table, event
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import QueuePool
from sqlmodel import Session, SQLModel, create_engine

from runtime.memory.write_path import (
    WriterLock,
    commit_failed,
    commit_marked,
    is_transient_write_error,
    retry_transient,
    writer_lock_for,
)

__all__ = [
    "DEFAULT_DATABASE_URL",
    "DEFAULT_SQL_THREADS",
    "Database",
    "DatabaseUrlError",
    "is_transient_write_error",
    "normalize_url",
]

DEFAULT_DATABASE_URL = "sqlite:///./data/sessionray.db"
"""Where sessionray keeps its memory when ``database.url`` is not configured."""

DEFAULT_SQL_THREADS = 8
"""SQL threads (and pooled connections) of a :class:`Database` built without ``threads=``."""

T = TypeVar("T")
H = TypeVar("H")

_PASSWORD = re.compile(r"(?<=://)([^:/@]*):[^@/]*@")


class DatabaseUrlError(ValueError):
    """The database URL cannot be parsed or names an unsupported backend."""


def normalize_url(url: str | None) -> URL:
    """Parse ``url`` (``None``: :data:`DEFAULT_DATABASE_URL`) into a SQLAlchemy URL.

    ``postgresql://`` / ``postgres://`` / ``postgresql+psycopg2://`` become
    ``postgresql+psycopg://`` (psycopg 3 is the installed driver).

    Raises:
        DatabaseUrlError: unparsable URL, a backend other than SQLite/PostgreSQL, or an
            in-memory SQLite URL (each pooled connection would see its own empty database).
            The message shows the URL with its password replaced by ``***``.
    """
    raw = url or DEFAULT_DATABASE_URL
    if raw.startswith("postgres://"):
        raw = "postgresql://" + raw.removeprefix("postgres://")
    shown = _PASSWORD.sub(r"\1:***@", raw)  # error texts end up in logs: never the password
    try:
        parsed = make_url(raw)
    except Exception:  # sqlalchemy raises ArgumentError for garbage (its text repeats the URL)
        raise DatabaseUrlError(f"cannot parse database URL {shown!r}") from None
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        if parsed.drivername != "postgresql+psycopg":
            parsed = parsed.set(drivername="postgresql+psycopg")
    elif backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise DatabaseUrlError(
                f"in-memory SQLite ({shown!r}) is not supported: use a file, e.g. {DEFAULT_DATABASE_URL}"
            )
    else:
        raise DatabaseUrlError(
            f"unsupported database backend {backend!r} in {shown!r}: use sqlite:///path.db or "
            "postgresql+psycopg://user@host/db"
        )
    return parsed


class Database:
    """An engine plus a thread pool for blocking SQL.

    Args:
        url: SQLAlchemy URL (see module docstring); ``None`` uses :data:`DEFAULT_DATABASE_URL`.
        busy_timeout_ms: SQLite only: how long a writer waits for the lock, in ms.
        threads: Size of the thread pool that runs SQL (and of the connection pool).
        echo: Log every statement (debugging).
        write_retry_s: How long :meth:`run_write` keeps retrying a transient write error, in
            seconds (default 60 s).
        max_overflow: Connections the pool may open beyond ``threads`` (``None``: ``threads``).
            Every SQL call of :meth:`run` holds one connection on one pool thread, so only
            callers outside the pool (start-up ``create_tables``, tests) ever use the overflow;
            ``0`` makes ``threads`` a hard bound (a session host: four PostgreSQL connections at
            most). SQLite keeps one connection more in the pool (``threads`` + 1), for the
            writer lock's holder writing inline (:meth:`run_write`).

    Raises:
        DatabaseUrlError: see :func:`normalize_url`.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        busy_timeout_ms: int = 5000,
        threads: int = DEFAULT_SQL_THREADS,
        echo: bool = False,
        write_retry_s: float = 60.0,
        max_overflow: int | None = None,
    ) -> None:
        self.url = normalize_url(url)
        self.dialect = self.url.get_backend_name()
        self.write_retry_s = float(write_retry_s)
        self.closed = False
        """Set by :meth:`dispose`: no SQL may run on this database any more."""
        self._busy_timeout_s = busy_timeout_ms / 1000
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sessionray-sql")
        self._writer: WriterLock | None = None
        self._here = threading.local()  # write_here's shorter wait for the writer lock
        overflow = threads if max_overflow is None else max_overflow
        # SQLite: one pooled connection more than threads, for the writer lock's holder writing
        # inline (run_write); pooled, not overflow, so it is not opened and closed again and again
        kept = threads + 1 if self.dialect == "sqlite" else threads
        self.max_connections = kept + overflow
        """Most connections this database's pool ever holds open at once."""
        kwargs: dict[str, Any] = {"echo": echo, "pool_size": kept, "max_overflow": overflow}
        if self.dialect == "sqlite":
            db_path = Path(str(self.url.database))
            db_path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = writer_lock_for(db_path)
            # Pooled connections move between the pool's threads (never used by two at once).
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": busy_timeout_ms / 1000}
        else:
            kwargs["pool_pre_ping"] = True
        self.engine: Engine = create_engine(self.url, **kwargs)
        if self.dialect == "sqlite":
            _install_sqlite_hooks(self.engine, busy_timeout_ms)

    @property
    def is_sqlite(self) -> bool:
        """True when the backend is SQLite (single node only)."""
        return self.dialect == "sqlite"

    def create_tables(self) -> None:
        """Create the memory tables, and those other wings registered
        (:func:`runtime.memory.tables.created_tables`: the delivery tables, the usage ledger), that
        do not exist yet, in one ``create_all``; never drop or alter (docs/decisions.md#memory-create-only).

        Raises:
            sqlalchemy.exc.OperationalError: the database is unreachable.
        """
        from runtime.memory.tables import created_tables

        tables = [SQLModel.metadata.tables[str(t.__tablename__)] for t in created_tables()]
        SQLModel.metadata.create_all(self.engine, tables=tables, checkfirst=True)

    @contextmanager
    def writer_lock(self) -> Iterator[None]:
        """Hold the node-wide SQLite writer lock for the block (module docstring); a no-op on
        PostgreSQL. Re-entrant within a thread. Blocking (at most ``busy_timeout_ms``, then
        "database is locked", which :meth:`run_write` retries): call it on the SQL thread pool."""
        lock = self._writer
        if lock is None:
            yield
            return
        lock.acquire(getattr(self._here, "lock_wait_s", self._busy_timeout_s))
        try:
            yield
        finally:
            lock.release()

    @contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """A transaction-scoped sqlmodel ``Session`` (blocking; call from :meth:`run`).

        Commits when the block ends normally, rolls back on an exception.

        Args:
            write: Start the transaction as a writer: SQLite ``BEGIN IMMEDIATE`` under the
                node-wide writer lock, held until commit or rollback.
        """
        with self._checkout(write) as conn, Session(bind=conn, expire_on_commit=False) as s:
            yield from _transaction(s, s.rollback, s.commit)

    @contextmanager
    def connection(self, *, write: bool = False) -> Iterator[Connection]:
        """A SQLAlchemy Core ``Connection`` inside one transaction (blocking; call from
        :meth:`run` / :meth:`run_write`). Cheaper than :meth:`session` for plain statements.

        Commits when the block ends normally, rolls back on an exception. An exception raised
        by COMMIT itself is marked so :func:`is_transient_write_error` never re-runs it.

        Args:
            write: As for :meth:`session` (``BEGIN IMMEDIATE`` under the writer lock on SQLite;
                the lock is taken only once the pooled connection is checked out).
        """
        with self._checkout(write) as conn:
            trans = conn.begin()
            yield from _transaction(conn, trans.rollback, trans.commit)

    @contextmanager
    def _checkout(self, write: bool) -> Iterator[Connection]:
        """A pooled connection; for a writer also ``BEGIN IMMEDIATE`` (SQLite) and the writer lock,
        taken once the connection is checked out and held until the block ends. A connection
        whose COMMIT failed is discarded, not pooled again: SQLite leaves its transaction open
        after a failed COMMIT (a deferred constraint, a busy database), and the next ``BEGIN`` on
        it would fail with "cannot start a transaction within a transaction"."""
        with self.engine.connect() as conn:
            if not write:
                with _discarded_on_failed_commit(conn):
                    yield conn
                return
            if self.is_sqlite:
                conn.execution_options(sessionray_sqlite_immediate=True)
            with self.writer_lock(), _discarded_on_failed_commit(conn):  # closed before the lock goes
                yield conn

    def insert(self, table: Table) -> PgInsert | SqliteInsert:
        """The dialect's ``INSERT`` construct for ``table`` (it has ``on_conflict_do_nothing``)."""
        return pg_insert(table) if self.dialect == "postgresql" else sqlite_insert(table)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run blocking ``fn()`` on the SQL thread pool and await its result.

        Raises:
            Whatever ``fn`` raises.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    async def run_write(self, fn: Callable[[], T], *, inline: bool = False) -> T:
        """:meth:`run` for a write transaction: re-run ``fn`` while it fails with a transient
        error (:func:`is_transient_write_error`), with exponential back-off from 5 ms doubling
        to a 1 s cap, full jitter in [½, 1]×, for up to ``write_retry_s`` seconds in all.

        ``fn`` must be one whole transaction (it opens and closes its own write session), so a
        failed attempt left nothing behind. Each retry is counted in
        ``sessionray_sql_retries_total{dialect}``; one warning is logged per call that retried.

        Args:
            inline: ``fn`` is one short write of the message path (a few rows): on SQLite it runs
                at once in the calling thread when the node-wide writer lock is free (no wait for
                it), else on the pool as without; PostgreSQL always uses the pool. The hop to the
                pool and back costs more CPU than such a write (docs/decisions.md#memory-sql-off-loop).
                A write done inline does not yield to the event loop.

        Raises:
            Whatever ``fn`` raises that is not transient; the last transient error once
            ``write_retry_s`` is used up.
        """
        writer = self._writer
        if inline and writer is not None and self._inline_ready(writer) and writer.try_acquire():
            try:  # the transaction's own take of the lock re-enters it
                return fn()
            except Exception as exc:
                if not is_transient_write_error(exc):
                    raise
            finally:
                writer.release()
        return await retry_transient(lambda: self.run(fn), budget_s=self.write_retry_s, dialect=self.dialect)

    def _inline_ready(self, writer: WriterLock) -> bool:
        """An inline write may be tried: SQLite with a working lock file (else other processes'
        writers would make it wait on ``busy_timeout``), the database open, and a pooled
        connection free. The pool keeps one connection beyond its threads for the lock's holder
        (``__init__``), so the lock is never held while waiting for a connection that a pool
        thread waiting for the lock holds (each pool thread holds one at most); this check
        guards against SQL run outside the pool."""
        return (
            writer.spans_processes
            and not self.closed
            and cast(QueuePool, self.engine.pool).checkedout() < self.max_connections
        )

    def write_here(self, fn: Callable[[], T], *, lock_wait_s: float) -> T:
        """Run the write transaction ``fn`` in the calling thread (blocking) — for the one write
        that must be followed at once by an action of this thread, with no hop to the SQL thread
        pool in between (the delivery's on-the-wire mark: docs/decisions.md#delivery-uncertain).
        Waits at most ``lock_wait_s`` seconds for the SQLite writer lock.

        Raises:
            Whatever ``fn`` raises; a transient "database is locked"
            (:func:`is_transient_write_error`) when the lock stayed taken: retry through
            :meth:`run_write`.
        """
        self._here.lock_wait_s = lock_wait_s
        try:
            return fn()
        finally:
            del self._here.lock_wait_s

    def release_connections(self) -> None:
        """Close every idle pooled connection now (blocking); the next SQL call opens a new one
        (PostgreSQL: a few ms). A connection in use at that moment is not closed (it stays with
        the discarded pool until that is garbage-collected), so call it through :meth:`run`: the
        SQL already queued on the pool runs first and every connection is back. A session host
        without live sessions holds no PostgreSQL connection
        (docs/decisions.md#memory-connection-budget)."""
        self.engine.dispose(close=True)

    def dispose(self) -> None:
        """Close pooled connections and stop the thread pool (idempotent)."""
        self.closed = True
        self._executor.shutdown(wait=True)
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({self.url.render_as_string(hide_password=True)!r})"


def _transaction(handle: H, rollback: Callable[[], None], commit: Callable[[], None]) -> Iterator[H]:
    """Yield ``handle`` inside one transaction: ``rollback()`` on an exception, else
    ``commit()`` (marked by :func:`commit_marked` when it raises)."""
    try:
        yield handle
    except BaseException:
        rollback()
        raise
    commit_marked(commit)


@contextmanager
def _discarded_on_failed_commit(conn: Connection) -> Iterator[None]:
    """Invalidate ``conn`` (its DBAPI connection is closed, which ends any transaction left open)
    when the block raises an error of a COMMIT (:func:`runtime.memory.write_path.commit_failed`)."""
    try:
        yield
    except BaseException as exc:
        if commit_failed(exc):
            conn.invalidate()
        raise


def _install_sqlite_hooks(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" hook issue BEGIN itself (pysqlite's implicit BEGIN is
        # always DEFERRED).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get("sessionray_sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

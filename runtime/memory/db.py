"""The SQL engine behind session memory: one :class:`Database` per process (seed 002, D4).

URLs (SQLAlchemy form):

* default ``sqlite:///./data/sessionray.db`` — the parent directory is created, every
  connection runs ``PRAGMA journal_mode=WAL``, ``PRAGMA busy_timeout`` (``busy_timeout_ms``,
  default 5000 ms) and ``PRAGMA foreign_keys=ON``; write transactions start with
  ``BEGIN IMMEDIATE`` so two writers queue on the busy timeout instead of failing with
  "database is locked" when a read lock would have to be upgraded.
* ``postgresql+psycopg://user:password@host:5432/dbname`` — psycopg 3. A bare
  ``postgresql://`` or ``postgres://`` URL is rewritten to the psycopg 3 driver.

Start-up (:meth:`Database.create_tables`) only creates the memory tables that are missing; it
never drops, alters or rewrites an existing table (seed 002, decision 9).

All blocking SQL runs on the database's own thread pool through :meth:`Database.run`, so a
session actor's event loop never waits on SQL.

Writers (issue #8, SQL write path):

* **Node-wide writer lock (SQLite)**: a write transaction (:meth:`Database.session` /
  :meth:`Database.connection` with ``write=True``) first takes a process-wide re-entrant lock and
  an ``fcntl.flock(LOCK_EX)`` on the sidecar file ``<db file>.writer.lock`` (created if missing),
  and releases both right after commit or rollback. The lock file is polled non-blocking with
  pauses of at most 2 ms, so writers of every process on the node queue closely instead of
  sleeping in SQLite's busy handler (1, 2, 5 … 100 ms steps); the wait is bounded by
  ``busy_timeout_ms``, then "database is locked" (retried by :meth:`Database.run_write`).
  ``BEGIN IMMEDIATE`` and ``busy_timeout`` stay as
  the second line for tools that write the file without the lock. Where :mod:`fcntl` does not
  exist only the in-process lock is taken (cross-process writers queue on the busy timeout).
  PostgreSQL: no lock.
* **Transient write errors are retried** by :meth:`Database.run_write` (SQLite "database is
  locked"/"busy"; PostgreSQL serialization failure ``40001``, deadlock ``40P01``, and connection
  errors raised before commit) with capped exponential back-off and jitter for up to
  ``write_retry_s`` seconds, so a busy database never turns an accepted message into a lost turn.

Stable names other modules rely on: :meth:`Database.session` (``write=True`` for writers),
:meth:`Database.connection` (SQLAlchemy Core, same ``write=``), :meth:`Database.run`,
:meth:`Database.run_write`, :meth:`Database.writer_lock`, :meth:`Database.insert`,
:func:`is_transient_write_error`, :attr:`Database.is_sqlite`, :attr:`Database.dialect` (``sqlite`` |
``postgresql``), :attr:`Database.engine`, and the connection execution option
``sessionray_sqlite_immediate=True`` (a transaction begun on such a SQLite connection is
``BEGIN IMMEDIATE``; :mod:`runtime.delivery_ledger` uses it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Table, event
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlmodel import Session, SQLModel, create_engine

from runtime import metrics

try:  # POSIX only; elsewhere the writer lock is in-process only
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_DATABASE_URL",
    "Database",
    "DatabaseUrlError",
    "is_transient_write_error",
    "normalize_url",
]

log = logging.getLogger("sessionray.sql")

DEFAULT_DATABASE_URL = "sqlite:///./data/sessionray.db"
"""Where sessionray keeps its memory when ``database.url`` is not configured."""

T = TypeVar("T")

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


_RETRY_BASE_S = 0.005
"""First back-off of :meth:`Database.run_write`, in seconds (doubles per retry)."""
_RETRY_MAX_S = 1.0
"""Cap of one back-off of :meth:`Database.run_write`, in seconds."""
_PG_RETRY_SQLSTATES = frozenset({"40001", "40P01"})
"""PostgreSQL serialization_failure and deadlock_detected: the server rolled the transaction back."""
_COMMIT_FAILED = "sessionray_commit_failed"
"""Attribute set on an exception raised by COMMIT itself (its outcome is unknown to us)."""


def is_transient_write_error(exc: BaseException) -> bool:
    """True when a write transaction that raised ``exc`` did not commit and may simply be re-run.

    Transient: SQLite ``OperationalError`` "database is locked" / "… busy"; PostgreSQL
    serialization failure (SQLSTATE ``40001``) or deadlock (``40P01``) — the server rolled the
    transaction back; a PostgreSQL connection error (SQLSTATE class ``08``, no SQLSTATE, or an
    invalidated connection) raised *before* COMMIT. A connection error raised by COMMIT itself is
    not transient: the transaction may have committed, and re-running it could write twice.
    """
    orig: BaseException | None = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(orig, sqlite3.OperationalError):
        text = str(orig).lower()
        return "locked" in text or "busy" in text
    if not isinstance(exc, DBAPIError):
        return False
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in _PG_RETRY_SQLSTATES:
        return True
    if getattr(exc, _COMMIT_FAILED, False):
        return False
    if exc.connection_invalidated:
        return True
    if sqlstate is not None:
        return str(sqlstate).startswith("08")
    # psycopg reports a dropped/refused connection as OperationalError without a SQLSTATE.
    return type(orig).__name__ == "OperationalError" and type(orig).__module__.startswith("psycopg")


class _WriterLock:
    """The node-wide writer lock of one SQLite file: a process-wide re-entrant lock plus
    ``flock(LOCK_EX)`` on ``<db file>.writer.lock`` while the outermost holder holds it.

    Re-entrant within a thread (nested write sessions do not deadlock); the pool's other threads
    wait on the in-process lock, other processes on the kernel flock (woken on release). The
    sidecar is opened by the outermost acquire and closed by the outermost release (a few µs), so
    no descriptor stays open between transactions and a forked child inherits none.
    """

    def __init__(self, sidecar: Path) -> None:
        self.sidecar = sidecar
        self._lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None
        self._flock_ok = fcntl is not None

    def _flock(self, deadline: float) -> None:
        if not self._flock_ok:
            return
        try:
            fd = os.open(self.sidecar, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:  # e.g. a read-only directory: in-process lock only
            log.warning(
                "SQLite writer lock file %s unusable (%s): writers of other processes queue on busy_timeout",
                self.sidecar,
                exc,
            )
            self._flock_ok = False
            return
        delay = 0.0002
        try:
            while True:  # polled, so the wait is bounded (a blocking flock cannot time out)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise _lock_timeout(self.sidecar) from None
                    time.sleep(delay)
                    delay = min(delay * 2, _FLOCK_POLL_MAX_S)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def acquire(self, timeout_s: float) -> None:
        """Take the lock (re-entrant in the holding thread), waiting at most ``timeout_s``.

        Raises:
            sqlalchemy.exc.OperationalError: "database is locked" (a transient write error,
                :func:`is_transient_write_error`) when the lock stayed taken ``timeout_s``.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        if not self._lock.acquire(timeout=max(0.0, timeout_s)):
            raise _lock_timeout(self.sidecar)
        if self._depth == 0:
            try:
                self._flock(deadline)
            except BaseException:
                self._lock.release()
                raise
        self._depth += 1

    def release(self) -> None:
        """Release one level; the flock goes with the outermost level."""
        try:
            self._depth -= 1
            if self._depth == 0 and self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    fcntl.flock(fd, fcntl.LOCK_UN)  # explicit: a forked copy of fd must not keep it
                finally:
                    os.close(fd)
        finally:
            self._lock.release()

    def reset_after_fork(self) -> None:
        """In a forked child: forget the parent's holders (an inherited fd is the parent's to unlock)."""
        self._lock = threading.RLock()
        self._depth = 0
        self._fd = None


_WRITER_LOCKS: weakref.WeakValueDictionary[str, _WriterLock] = weakref.WeakValueDictionary()
"""One lock per SQLite file in this process, alive while a :class:`Database` on it is."""
_WRITER_LOCKS_GUARD = threading.Lock()


_FLOCK_POLL_MAX_S = 0.002
"""Longest pause between two tries of the writer lock file, in seconds."""


def _lock_timeout(sidecar: Path) -> OperationalError:
    return OperationalError(
        "writer lock", None, sqlite3.OperationalError(f"database is locked (writer lock {sidecar} busy)")
    )


def _writer_lock_for(db_path: Path) -> _WriterLock:
    """The one :class:`_WriterLock` of this process for the SQLite file ``db_path`` (every
    :class:`Database` on that file shares it, so two of them in one thread cannot deadlock)."""
    key = os.path.realpath(db_path)
    with _WRITER_LOCKS_GUARD:
        lock = _WRITER_LOCKS.get(key)
        if lock is None:
            lock = _WriterLock(Path(key + ".writer.lock"))
            _WRITER_LOCKS[key] = lock
        return lock


def _reset_writer_locks() -> None:
    global _WRITER_LOCKS_GUARD
    _WRITER_LOCKS_GUARD = threading.Lock()
    for lock in list(_WRITER_LOCKS.values()):
        lock.reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_writer_locks)


class Database:
    """An engine plus a thread pool for blocking SQL.

    Args:
        url: SQLAlchemy URL (see module docstring); ``None`` uses :data:`DEFAULT_DATABASE_URL`.
        busy_timeout_ms: SQLite only: how long a writer waits for the lock, in ms.
        threads: Size of the thread pool that runs SQL (and of the connection pool).
        echo: Log every statement (debugging).
        write_retry_s: How long :meth:`run_write` keeps retrying a transient write error, in
            seconds (default 60 s).

    Raises:
        DatabaseUrlError: see :func:`normalize_url`.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        busy_timeout_ms: int = 5000,
        threads: int = 8,
        echo: bool = False,
        write_retry_s: float = 60.0,
    ) -> None:
        self.url = normalize_url(url)
        self.dialect = self.url.get_backend_name()
        self.write_retry_s = float(write_retry_s)
        self._busy_timeout_s = busy_timeout_ms / 1000
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sessionray-sql")
        self._writer: _WriterLock | None = None
        kwargs: dict[str, Any] = {"echo": echo}
        if self.dialect == "sqlite":
            db_path = Path(str(self.url.database))
            db_path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = _writer_lock_for(db_path)
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": busy_timeout_ms / 1000}
            # Pooled connections move between the pool's threads (never used by two at once).
            kwargs["pool_size"] = threads
            kwargs["max_overflow"] = threads
        else:
            kwargs["pool_size"] = threads
            kwargs["max_overflow"] = threads
            kwargs["pool_pre_ping"] = True
        self.engine: Engine = create_engine(self.url, **kwargs)
        if self.dialect == "sqlite":
            _install_sqlite_hooks(self.engine, busy_timeout_ms)

    @property
    def is_sqlite(self) -> bool:
        """True when the backend is SQLite (single node only)."""
        return self.dialect == "sqlite"

    def create_tables(self) -> None:
        """Create the memory tables that do not exist yet; never drop or alter (seed 002 #9).

        Raises:
            sqlalchemy.exc.OperationalError: the database is unreachable.
        """
        from runtime.memory.tables import MEMORY_TABLES

        tables = [SQLModel.metadata.tables[str(t.__tablename__)] for t in MEMORY_TABLES]
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
        lock.acquire(self._busy_timeout_s)
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
            yield from _session_transaction(s)

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
            yield from _core_transaction(conn)

    @contextmanager
    def _checkout(self, write: bool) -> Iterator[Connection]:
        """A pooled connection; for a writer also ``BEGIN IMMEDIATE`` (SQLite) and the writer lock,
        taken once the connection is checked out and held until the block ends."""
        with self.engine.connect() as conn:
            if not write:
                yield conn
                return
            if self.is_sqlite:
                conn.execution_options(sessionray_sqlite_immediate=True)
            with self.writer_lock():
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

    async def run_write(self, fn: Callable[[], T]) -> T:
        """:meth:`run` for a write transaction: re-run ``fn`` while it fails with a transient
        error (:func:`is_transient_write_error`), with exponential back-off from 5 ms doubling
        to a 1 s cap, full jitter in [½, 1]×, for up to ``write_retry_s`` seconds in all.

        ``fn`` must be one whole transaction (it opens and closes its own write session), so a
        failed attempt left nothing behind. Each retry is counted in
        ``sessionray_sql_retries_total{dialect}``; one warning is logged per call that retried.

        Raises:
            Whatever ``fn`` raises that is not transient; the last transient error once
            ``write_retry_s`` is used up.
        """
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                return await self.run(fn)
            except Exception as exc:
                if not is_transient_write_error(exc):
                    raise
                attempt += 1
                delay = min(_RETRY_MAX_S, _RETRY_BASE_S * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
                waited = time.monotonic() - started
                if waited + delay > self.write_retry_s:
                    log.error(
                        "SQL write still failing after %d attempt(s) in %.1f s, giving up: %s",
                        attempt, waited, _short(exc),
                    )  # fmt: skip
                    raise
                metrics.SQL_RETRIES.inc(dialect=self.dialect)
                if attempt == 1:
                    log.warning(
                        "transient SQL write error, retrying for up to %.0f s: %s",
                        self.write_retry_s,
                        _short(exc),
                    )
                await asyncio.sleep(delay)

    def dispose(self) -> None:
        """Close pooled connections and stop the thread pool (idempotent)."""
        self._executor.shutdown(wait=True)
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({self.url.render_as_string(hide_password=True)!r})"


def _short(exc: BaseException) -> str:
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    return f"{type(orig).__name__}: {str(orig).splitlines()[0] if str(orig) else ''}"


def _session_transaction(s: Session) -> Iterator[Session]:
    try:
        yield s
    except BaseException:
        s.rollback()
        raise
    try:
        s.commit()
    except BaseException as exc:
        setattr(exc, _COMMIT_FAILED, True)
        raise


def _core_transaction(conn: Connection) -> Iterator[Connection]:
    trans = conn.begin()
    try:
        yield conn
    except BaseException:
        trans.rollback()
        raise
    try:
        trans.commit()
    except BaseException as exc:
        setattr(exc, _COMMIT_FAILED, True)
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

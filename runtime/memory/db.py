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

Stable names other modules rely on: :meth:`Database.session` (``write=True`` for writers),
:meth:`Database.run`, :attr:`Database.is_sqlite`, :attr:`Database.dialect` (``sqlite`` |
``postgresql``), :attr:`Database.engine`, and the connection execution option
``sessionray_sqlite_immediate=True`` (a transaction begun on such a SQLite connection is
``BEGIN IMMEDIATE``; :mod:`runtime.delivery_ledger` uses it).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlmodel import Session, SQLModel, create_engine

__all__ = ["DEFAULT_DATABASE_URL", "Database", "DatabaseUrlError", "normalize_url"]

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


class Database:
    """An engine plus a thread pool for blocking SQL.

    Args:
        url: SQLAlchemy URL (see module docstring); ``None`` uses :data:`DEFAULT_DATABASE_URL`.
        busy_timeout_ms: SQLite only: how long a writer waits for the lock, in ms.
        threads: Size of the thread pool that runs SQL (and of the connection pool).
        echo: Log every statement (debugging).

    Raises:
        DatabaseUrlError: see :func:`normalize_url`.
    """

    def __init__(
        self, url: str | None = None, *, busy_timeout_ms: int = 5000, threads: int = 8, echo: bool = False
    ) -> None:
        self.url = normalize_url(url)
        self.dialect = self.url.get_backend_name()
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sessionray-sql")
        kwargs: dict[str, Any] = {"echo": echo}
        if self.dialect == "sqlite":
            db_path = Path(str(self.url.database))
            db_path.parent.mkdir(parents=True, exist_ok=True)
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
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """A transaction-scoped sqlmodel ``Session`` (blocking; call from :meth:`run`).

        Commits when the block ends normally, rolls back on an exception.

        Args:
            write: Start the transaction as a writer (SQLite ``BEGIN IMMEDIATE``).
        """
        with self.engine.connect() as conn:
            if write and self.is_sqlite:
                conn.execution_options(sessionray_sqlite_immediate=True)
            with Session(bind=conn, expire_on_commit=False) as s:
                try:
                    yield s
                    s.commit()
                except BaseException:
                    s.rollback()
                    raise

    async def run(self, fn: Callable[[], T]) -> T:
        """Run blocking ``fn()`` on the SQL thread pool and await its result.

        Raises:
            Whatever ``fn`` raises.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn)

    def dispose(self) -> None:
        """Close pooled connections and stop the thread pool (idempotent)."""
        self._executor.shutdown(wait=True)
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({self.url.render_as_string(hide_password=True)!r})"


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

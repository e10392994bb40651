"""The write path (docs/decisions.md#memory-write-path) moved out of runtime/memory/db.py
(runtime/memory/write_path.py) keeps every name importable where it was, marks COMMIT failures,
retries only transient errors; and a one-thread :class:`Database` without overflow holds exactly one
PostgreSQL connection under concurrent reads and writes, and none after
:meth:`Database.release_connections`."""

from __future__ import annotations

import asyncio
import sqlite3

import psycopg
import pytest
from sqlalchemy.exc import DBAPIError, OperationalError

import runtime.memory
from runtime.llm.types import UserMessage
from runtime.memory import ContextRepository, write_path
from runtime.memory import db as db_module
from runtime.memory.db import Database
from tests.memory.pg_activity import settled_connections, tagged
from tests.memory.pg_schema import create_schema, drop_schema

KEY = "onebot11:1:private:42"


def test_public_names_stay_importable_from_runtime_memory_db() -> None:
    names = {
        "DEFAULT_DATABASE_URL",
        "Database",
        "DatabaseUrlError",
        "is_transient_write_error",
        "normalize_url",
    }
    assert names <= set(db_module.__all__) and all(hasattr(db_module, n) for n in db_module.__all__)
    assert db_module.is_transient_write_error is write_path.is_transient_write_error
    assert (runtime.memory.Database, runtime.memory.DatabaseUrlError) == (
        db_module.Database,
        db_module.DatabaseUrlError,
    )


def _dropped_connection() -> DBAPIError:
    return DBAPIError("COMMIT", None, psycopg.OperationalError("server closed the connection unexpectedly"))


def test_an_error_raised_by_commit_is_never_transient() -> None:
    before_commit = _dropped_connection()
    assert write_path.is_transient_write_error(before_commit) is True

    def commit() -> None:
        raise _dropped_connection()

    with pytest.raises(DBAPIError) as raised:
        write_path.commit_marked(commit)
    assert write_path.is_transient_write_error(raised.value) is False
    write_path.commit_marked(lambda: None)  # a successful commit just returns


def _locked() -> OperationalError:
    return OperationalError("INSERT", None, sqlite3.OperationalError("database is locked"))


async def test_retry_transient_reruns_until_success_and_stops_on_other_errors() -> None:
    calls: list[str] = []

    async def flaky() -> str:
        calls.append("try")
        if len(calls) < 3:
            raise _locked()
        return "done"

    assert await write_path.retry_transient(flaky, budget_s=10.0, dialect="sqlite") == "done"
    assert calls == ["try", "try", "try"]

    async def broken() -> str:
        calls.append("broken")
        raise ValueError("not SQL")

    with pytest.raises(ValueError, match="not SQL"):
        await write_path.retry_transient(broken, budget_s=10.0, dialect="sqlite")
    assert calls.count("broken") == 1

    async def always_locked() -> str:
        calls.append("locked")
        raise _locked()

    with pytest.raises(OperationalError, match="database is locked"):
        await write_path.retry_transient(always_locked, budget_s=0.0, dialect="sqlite")
    assert calls.count("locked") == 1  # no budget left for a retry


def test_pool_bound_is_threads_plus_overflow(tmp_path: object) -> None:
    """On SQLite one connection more, for the writer lock's holder writing inline
    (docs/decisions.md#memory-sql-off-loop)."""
    url = f"sqlite:///{tmp_path}/bound.db"
    dbs = [Database(url, threads=1, max_overflow=0), Database(url, threads=2), Database(url)]
    try:
        assert [d.max_connections for d in dbs] == [2, 5, 17]
        assert [(d.engine.pool.size(), d.engine.pool._max_overflow) for d in dbs] == [  # type: ignore[attr-defined]
            (2, 0),
            (3, 2),
            (9, 8),
        ]
    finally:
        for d in dbs:
            d.dispose()


async def _busy_session(repo: ContextRepository, n: int) -> list[str]:
    """``n`` concurrent appends and reads on one session; returns the stored texts in order."""
    sid = await repo.get_or_create_active(KEY, model="m")
    writes = [repo.append_messages(sid, [UserMessage(content=f"m{i}")]) for i in range(n)]
    reads = [repo.load_context(sid) for _ in range(n)]
    await asyncio.wait_for(asyncio.gather(*writes, *reads), timeout=60)
    stored = (await repo.load_context(sid)).messages
    return sorted(str(m.content) if isinstance(m, UserMessage) else repr(m) for m in stored)


async def test_one_thread_without_overflow_serves_concurrent_reads_and_writes(db_url: str) -> None:
    db = Database(db_url, threads=1, max_overflow=0)
    db.create_tables()
    try:
        assert await _busy_session(ContextRepository(db), 20) == sorted(f"m{i}" for i in range(20))
    finally:
        db.dispose()


async def test_release_connections_leaves_no_postgresql_connection(pg_url: str) -> None:
    schema_url, schema = create_schema(pg_url)
    url, name = tagged(schema_url)
    db = Database(url, threads=1, max_overflow=0)
    try:
        db.create_tables()
        repo = ContextRepository(db)
        await _busy_session(repo, 20)
        assert await asyncio.to_thread(settled_connections, pg_url, name, 1) == 1
        await db.run(db.release_connections)
        assert await asyncio.to_thread(settled_connections, pg_url, name, 0) == 0
        assert len(await repo.list_sessions(KEY)) == 1  # the next call simply reconnects
        assert await asyncio.to_thread(settled_connections, pg_url, name, 1) == 1
    finally:
        db.dispose()
        drop_schema(pg_url, schema)


def test_a_connection_whose_commit_failed_is_not_pooled_again(tmp_path: object) -> None:
    # SQLite keeps the transaction open after a failed COMMIT (here a deferred foreign key); with
    # one pooled connection, the next transaction would get it and fail on BEGIN
    from sqlalchemy import text
    from sqlalchemy.exc import IntegrityError

    db = Database(f"sqlite:///{tmp_path}/commit.db", threads=1, max_overflow=0)
    try:
        with db.connection(write=True) as conn:
            conn.execute(text("CREATE TABLE p (id INTEGER PRIMARY KEY)"))
            fk = "p INTEGER REFERENCES p(id) DEFERRABLE INITIALLY DEFERRED"
            conn.execute(text(f"CREATE TABLE t (v TEXT, {fk})"))
        with pytest.raises(IntegrityError) as failed, db.connection(write=True) as conn:
            conn.execute(text("INSERT INTO t VALUES ('orphan', 9)"))
        assert write_path.commit_failed(failed.value)
        with db.connection(write=True) as conn:
            conn.execute(text("INSERT INTO p VALUES (9)"))
            conn.execute(text("INSERT INTO t VALUES ('kept', 9)"))
        with db.connection() as conn:
            assert [r[0] for r in conn.execute(text("SELECT v FROM t"))] == ["kept"]
    finally:
        db.dispose()

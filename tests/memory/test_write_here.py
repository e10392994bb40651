"""``Database.write_here`` (docs/decisions.md#delivery-uncertain): a write transaction run in the
calling thread, waiting at most ``lock_wait_s`` for the node-wide SQLite writer lock — and only
that call: the database's other writes keep their ``busy_timeout``; and ``run_write(inline=True)``
(docs/decisions.md#memory-sql-off-loop), which tries the lock once and writes here or on the pool.
Real SQLite files."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from runtime.memory import Database
from runtime.memory.db import is_transient_write_error


def _insert(db: Database, value: str) -> str:
    with db.connection(write=True) as conn:
        conn.execute(text("INSERT INTO t (v) VALUES (:v)"), {"v": value})
    return threading.current_thread().name


def _rows(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute("SELECT v FROM t ORDER BY v")]


@pytest.fixture
def db(tmp_path: Path) -> Database:
    path = tmp_path / "w.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (v TEXT)")
    return Database(f"sqlite:///{path}", busy_timeout_ms=5_000, threads=1, max_overflow=1)


def test_it_commits_in_the_calling_thread(db: Database, tmp_path: Path) -> None:
    ran_in = db.write_here(lambda: _insert(db, "a"), lock_wait_s=0.5)
    assert ran_in == threading.current_thread().name
    assert _rows(tmp_path / "w.db") == ["a"]
    db.dispose()


def test_a_held_writer_lock_fails_it_fast_as_transient_and_writes_nothing(
    db: Database, tmp_path: Path
) -> None:
    fd = os.open(str(tmp_path / "w.db") + ".writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process's writer holds the node-wide lock
    try:
        with pytest.raises(OperationalError, match="database is locked") as caught:
            db.write_here(lambda: _insert(db, "b"), lock_wait_s=0.05)
        assert is_transient_write_error(caught.value)  # the caller goes on through run_write
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert _rows(tmp_path / "w.db") == []
    # the shorter wait was for that call only: this one waits for the lock as usual
    fcntl.flock(fd2 := os.open(str(tmp_path / "w.db") + ".writer.lock", os.O_RDWR), fcntl.LOCK_EX)
    released = threading.Timer(0.3, lambda: (fcntl.flock(fd2, fcntl.LOCK_UN), os.close(fd2)))
    released.start()
    _insert(db, "c")
    released.join()
    assert _rows(tmp_path / "w.db") == ["c"]
    db.dispose()


async def test_an_inline_write_commits_in_the_calling_thread_when_the_lock_is_free(
    db: Database, tmp_path: Path
) -> None:
    """``run_write(fn, inline=True)`` (docs/decisions.md#memory-sql-off-loop): no hop to the pool."""
    ran_in = await db.run_write(lambda: _insert(db, "a"), inline=True)
    assert ran_in == threading.current_thread().name
    assert _rows(tmp_path / "w.db") == ["a"]
    db.dispose()


async def test_an_inline_write_goes_to_the_pool_when_another_process_holds_the_lock(
    db: Database, tmp_path: Path
) -> None:
    """The lock is tried once, never waited for on the calling thread: the write then waits on a
    pool thread and commits there once the other writer is done."""
    import asyncio

    fd = os.open(str(tmp_path / "w.db") + ".writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process's writer holds the node-wide lock
    write = asyncio.ensure_future(db.run_write(lambda: _insert(db, "b"), inline=True))
    try:
        await asyncio.sleep(0)  # the write's first step ran: it found the lock taken
        assert not write.done()
        assert _rows(tmp_path / "w.db") == []
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    ran_in = await write
    assert ran_in.startswith("sessionray-sql")
    assert _rows(tmp_path / "w.db") == ["b"]
    # a failed try leaves the lock free for the next writer of this process
    assert await db.run_write(lambda: _insert(db, "c"), inline=True) == threading.current_thread().name
    db.dispose()


async def test_an_inline_write_that_fails_for_good_raises_and_is_not_retried(db: Database) -> None:
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        with db.connection(write=True) as conn:
            conn.execute(text("INSERT INTO missing_table (v) VALUES (1)"))

    with pytest.raises(OperationalError, match="no such table"):
        await db.run_write(broken, inline=True)
    assert calls == [1]
    assert await db.run_write(lambda: _insert(db, "d"), inline=True) == threading.current_thread().name
    db.dispose()

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


def _lock_free(tmp_path: Path) -> bool:
    """The node-wide writer lock is free, as another process sees it (a lock of its own file
    description; the holder's re-entrant in-process lock would let the holder's thread in)."""
    fd = os.open(str(tmp_path / "w.db") + ".writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the lock if it was taken
    return True


async def test_an_inline_write_commits_in_the_calling_thread_when_the_lock_is_free(
    db: Database, tmp_path: Path
) -> None:
    """``run_write(fn, inline=True)`` (docs/decisions.md#memory-sql-off-loop): no hop to the pool,
    and the lock is free again after it."""
    ran_in = await db.run_write(lambda: _insert(db, "a"), inline=True)
    assert ran_in == threading.current_thread().name
    assert _rows(tmp_path / "w.db") == ["a"]
    assert _lock_free(tmp_path)
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
    assert _lock_free(tmp_path)
    assert await db.run_write(lambda: _insert(db, "c"), inline=True) == threading.current_thread().name
    db.dispose()


class _Stop(BaseException):
    pass


async def test_an_inline_write_that_fails_releases_the_lock_and_is_not_retried(
    db: Database, tmp_path: Path
) -> None:
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        with db.connection(write=True) as conn:
            conn.execute(text("INSERT INTO missing_table (v) VALUES (1)"))

    def stopped() -> None:
        with db.connection(write=True) as conn:
            conn.execute(text("INSERT INTO t (v) VALUES ('never')"))
            raise _Stop

    with pytest.raises(OperationalError, match="no such table"):
        await db.run_write(broken, inline=True)
    assert (calls, _lock_free(tmp_path)) == ([1], True)
    with pytest.raises(_Stop):
        await db.run_write(stopped, inline=True)
    assert (_rows(tmp_path / "w.db"), _lock_free(tmp_path)) == ([], True)
    db.dispose()


async def test_an_inline_write_with_a_transient_error_is_retried_on_the_pool(
    db: Database, tmp_path: Path
) -> None:
    """As a write on the pool would be (``run_write``'s retry of transient errors)."""
    threads: list[str] = []

    def busy_once() -> str:
        threads.append(threading.current_thread().name)
        if len(threads) == 1:
            raise OperationalError("BEGIN IMMEDIATE", {}, sqlite3.OperationalError("database is locked"))
        return _insert(db, "e")

    assert (await db.run_write(busy_once, inline=True)).startswith("sessionray-sql")
    assert threads[0] == threading.current_thread().name
    assert (_rows(tmp_path / "w.db"), _lock_free(tmp_path)) == (["e"], True)
    db.dispose()


async def test_an_inline_write_never_waits_for_a_pooled_connection(db: Database, tmp_path: Path) -> None:
    """Every connection of the pool checked out (``threads=1`` + ``max_overflow=1`` + the one kept
    for the inline writer): the write goes to the pool's queue instead of blocking this thread,
    and commits once a connection comes back."""
    import asyncio

    held = [db.engine.connect() for _ in range(db.max_connections)]
    write = asyncio.ensure_future(db.run_write(lambda: _insert(db, "f"), inline=True))
    try:
        await asyncio.sleep(0)
        assert not write.done()
        assert _lock_free(tmp_path)  # no lock held while waiting for a connection
    finally:
        for conn in held:
            conn.close()
    assert (await write).startswith("sessionray-sql")
    assert _rows(tmp_path / "w.db") == ["f"]
    db.dispose()


def test_a_lock_file_that_cannot_be_opened_is_never_taken_for_an_inline_write(tmp_path: Path) -> None:
    """Without the lock file the lock orders only this process's writers: an inline write would
    wait on ``busy_timeout`` behind another process's, so the try is refused, the first one too."""
    from runtime.memory.write_path import WriterLock

    lock = WriterLock(tmp_path / "missing-dir" / "w.db.writer.lock")
    assert (lock.try_acquire(), lock.spans_processes) == (False, False)
    lock.acquire(0.1)  # the pool's writers still take the in-process lock
    lock.release()
    assert lock.try_acquire() is False

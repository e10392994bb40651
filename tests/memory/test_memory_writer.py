"""The SQL write path (docs/decisions.md#memory-write-path): the node-wide SQLite writer lock,
:meth:`Database.run_write` retrying transient errors (a real "database is locked", a real PostgreSQL
connection killed before commit), and the transient-error classification. Real SQLite files and the
test PostgreSQL server."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError

from runtime.llm.types import UserMessage
from runtime.memory import ContextRepository, Database, TranscriptStore
from runtime.memory.db import is_transient_write_error
from runtime.memory.repository import StoredMessage, UnknownSessionError
from tests.memory.pg_schema import create_schema, drop_schema

KEY = "onebot11:1:private:42"
DEADLINE_S = 60.0
"""Upper bound of every wait below (a hang fails the test instead of blocking the suite)."""


def _retries(dialect: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value("sessionray_sql_retries_total", {"dialect": dialect})
    return value or 0.0


class _RetryWarnings(logging.Handler):
    """Sets :attr:`seen` when run_write logs its retry warning."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if record.getMessage().startswith("transient SQL write error"):
            self.seen.set()


@pytest.fixture
def retry_log() -> Iterator[_RetryWarnings]:
    handler = _RetryWarnings()
    logger = logging.getLogger("sessionray.sql")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "w" / "sessionray.db"


_OTHER_ROW = (
    "INSERT INTO im_transcripts (message_id, platform, bot_id, scene_id, scene_type, sender_id, "
    "sender_name, sender_role, direction, body, media_json, time) "
    "VALUES ('other', 'p', 'b', 's', 'group', 'u', '', '', 'inbound', 'held', NULL, 1)"
)


def _hold_immediate(path: Path, holding: threading.Event, release: threading.Event) -> None:
    """Another writer that does not know the writer lock: plain sqlite3, BEGIN IMMEDIATE."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_OTHER_ROW)
        holding.set()
        assert release.wait(DEADLINE_S)
        conn.execute("COMMIT")
    finally:
        conn.close()


async def test_a_locked_sqlite_file_is_retried_until_the_lock_is_released(
    sqlite_path: Path, retry_log: _RetryWarnings
) -> None:
    """A real "database is locked" (another connection holds BEGIN IMMEDIATE, our busy timeout is
    1 ms): run_write retries with back-off, the write succeeds once the lock is released, nothing
    is lost or doubled, the retry is counted and logged once."""
    db = Database(f"sqlite:///{sqlite_path}", busy_timeout_ms=1)
    db.create_tables()
    repo, store = ContextRepository(db), TranscriptStore(db)
    sid = await repo.get_or_create_active(KEY)
    holding, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_immediate, args=(sqlite_path, holding, release))
    holder.start()
    try:
        assert holding.wait(DEADLINE_S)
        before = _retries("sqlite")
        # The lock is released only after run_write has seen "database is locked" at least once.

        def release_after_first_retry() -> None:
            retry_log.seen.wait(DEADLINE_S)
            release.set()

        threading.Thread(target=release_after_first_retry).start()
        msg = UserMessage(content="survives the lock", timestamp=5)
        ids = await repo.append_messages(sid, [msg])
        retry_log.seen.clear()
        outcome = await store.record_inbound(
            message_id="m1", platform="p", bot_id="b", scene_id="s", scene_type="group",
            sender_id="u", text="also stored",
        )  # fmt: skip
    finally:
        release.set()
        holder.join(DEADLINE_S)
    assert retry_log.seen.is_set() is False  # the second write found the file free
    assert outcome == "stored"
    assert await repo.load_stored(sid) == [StoredMessage(ids[0], msg)]
    assert _retries("sqlite") - before >= 1
    # One warning for the call, however many retries it took.
    assert retry_log.messages == [
        "transient SQL write error, retrying for up to 60 s: OperationalError: database is locked"
    ]
    with sqlite3.connect(sqlite_path) as conn:
        rows = conn.execute("SELECT message_id, body FROM im_transcripts ORDER BY id").fetchall()
    assert rows == [("other", "held"), ("m1", "also stored")]
    db.dispose()


async def test_retrying_gives_up_after_write_retry_s_with_the_error_and_stores_nothing(
    sqlite_path: Path,
) -> None:
    db = Database(f"sqlite:///{sqlite_path}", busy_timeout_ms=1, write_retry_s=0.05)
    db.create_tables()
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    holding, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_immediate, args=(sqlite_path, holding, release))
    holder.start()
    try:
        assert holding.wait(DEADLINE_S)
        with pytest.raises(OperationalError) as err:
            await repo.append_messages(sid, [UserMessage(content="x", timestamp=1)])
    finally:
        release.set()
        holder.join(DEADLINE_S)
    assert "database is locked" in str(err.value)
    assert await repo.count_messages(sid) == 0
    db.dispose()


async def test_a_non_transient_error_is_not_retried(sqlite_path: Path) -> None:
    db = Database(f"sqlite:///{sqlite_path}")
    db.create_tables()
    calls: list[int] = []

    def fail() -> None:
        calls.append(1)
        raise UnknownSessionError("no agent session 'x'")

    with pytest.raises(UnknownSessionError, match="no agent session 'x'"):
        await db.run_write(fail)
    assert calls == [1]
    db.dispose()


def test_writer_lock_is_reentrant_in_a_thread_and_shared_by_databases_on_one_file(sqlite_path: Path) -> None:
    """Nested write sessions in one thread (also through a second Database on the same file) do
    not deadlock; the sidecar ``<db>.writer.lock`` exists and is flocked only while held."""
    db = Database(f"sqlite:///{sqlite_path}")
    other = Database(f"sqlite:///{sqlite_path}")
    db.create_tables()
    sidecar = Path(str(sqlite_path) + ".writer.lock")

    def flocked() -> bool:
        fd = os.open(sidecar, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def nested() -> list[bool]:
        seen = []
        with db.writer_lock():
            seen.append(flocked())
            with other.writer_lock(), db.writer_lock():
                seen.append(flocked())
            seen.append(flocked())
            with other.session(write=True) as s:
                s.connection().execute(text("INSERT INTO agent_summaries (session_id, summary, created_at) "
                                            "SELECT 'none', 'x', 1 WHERE 0"))  # fmt: skip
                seen.append(flocked())
        seen.append(flocked())
        return seen

    result: list[list[bool]] = []
    worker = threading.Thread(target=lambda: result.append(nested()))
    worker.start()
    worker.join(DEADLINE_S)
    assert not worker.is_alive(), "nested writer locks deadlocked"
    assert result == [[True, True, True, True, False]]
    assert sidecar.is_file()
    db.dispose()
    other.dispose()


_CHILD = """
import sys
from sqlalchemy import text
from runtime.memory.db import Database
db = Database(sys.argv[1])
with db.session(write=True) as s:
    s.connection().execute(text("INSERT INTO im_transcripts (message_id, platform, bot_id, scene_id, "
        "scene_type, sender_id, sender_name, sender_role, direction, body, media_json, time) VALUES "
        "('child', 'p', 'b', 's', 'group', 'u', '', '', 'inbound', 'first', NULL, 1)"))
    print("holding", flush=True)
    sys.stdin.readline()
print("done", flush=True)
"""


async def test_writers_of_two_processes_queue_on_the_writer_lock_and_write_after(sqlite_path: Path) -> None:
    """A child process holds a write transaction under the writer lock. Our writer waits for the
    lock (at most its 50 ms busy timeout per try, then "database is locked", retried and counted)
    and writes right after the child commits: nothing fails, nothing is lost."""
    url = f"sqlite:///{sqlite_path}"
    db = Database(url, busy_timeout_ms=50, write_retry_s=DEADLINE_S)
    db.create_tables()
    before = _retries("sqlite")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "holding\n"
        store = TranscriptStore(db)
        write = asyncio.ensure_future(
            store.record_inbound(
                message_id="parent", platform="p", bot_id="b", scene_id="s", scene_type="group",
                sender_id="u", text="second",
            )
        )  # fmt: skip
        deadline = time.monotonic() + DEADLINE_S
        while _retries("sqlite") == before:  # our writer found the lock taken and retries
            assert time.monotonic() < deadline, "our writer never waited for the writer lock"
            assert not write.done(), write
            await asyncio.sleep(0.005)
        child.stdin.write("\n")
        child.stdin.flush()
        assert await asyncio.wait_for(write, DEADLINE_S) == "stored"
        assert child.stdout.readline() == "done\n"
    finally:
        child.kill() if child.poll() is None else None
        child.wait(DEADLINE_S)
    with sqlite3.connect(sqlite_path) as conn:
        rows = conn.execute("SELECT message_id, body FROM im_transcripts ORDER BY id").fetchall()
    assert rows == [("child", "first"), ("parent", "second")]
    db.dispose()


async def test_a_writer_lock_held_elsewhere_bounds_the_wait(sqlite_path: Path) -> None:
    """Someone holds the writer lock file and never lets go: run_write gives up with "database is
    locked" after its retries (write_retry_s), it never hangs; nothing is written."""
    url = f"sqlite:///{sqlite_path}"
    db = Database(url, busy_timeout_ms=20, write_retry_s=0.3)
    db.create_tables()
    fd = os.open(str(sqlite_path) + ".writer.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        store = TranscriptStore(db)
        started = time.monotonic()
        with pytest.raises(OperationalError, match="database is locked"):
            await asyncio.wait_for(
                store.record_inbound(
                    message_id="m", platform="p", bot_id="b", scene_id="s", scene_type="group",
                    sender_id="u", text="never",
                ),
                DEADLINE_S,
            )  # fmt: skip
        assert time.monotonic() - started < 10
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    with sqlite3.connect(sqlite_path) as conn:
        assert conn.execute("SELECT count(*) FROM im_transcripts").fetchone() == (0,)
    db.dispose()


async def test_postgres_connection_killed_before_commit_is_retried(pg_url: str) -> None:
    """A real PostgreSQL connection error raised before COMMIT (the server terminates our backend
    mid-transaction) is transient: run_write re-runs the whole transaction once and it commits."""
    url, schema = create_schema(pg_url)
    db = Database(url)
    try:
        db.create_tables()
        repo = ContextRepository(db)
        sid = await repo.get_or_create_active(KEY)
        attempts: list[int] = []
        before = _retries("postgresql")

        def work() -> int:
            with db.connection(write=True) as conn:
                attempts.append(1)
                pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
                conn.execute(
                    text("INSERT INTO agent_summaries (session_id, summary, created_at) VALUES (:s, 'x', 1)"),
                    {"s": sid},
                )
                if len(attempts) == 1:
                    with psycopg.connect(
                        pg_url.replace("postgresql+psycopg", "postgresql"), autocommit=True
                    ) as k:
                        k.execute("SELECT pg_terminate_backend(%s)", (pid,))
                return int(conn.execute(text("SELECT count(*) FROM agent_summaries")).scalar_one())

        assert await db.run_write(work) == 1
        assert attempts == [1, 1]
        assert _retries("postgresql") - before == 1
    finally:
        db.dispose()
        drop_schema(pg_url, schema)


def _dbapi(orig: BaseException, *, invalidated: bool = False) -> DBAPIError:
    err = DBAPIError.instance("COMMIT", None, orig, Exception, connection_invalidated=invalidated)
    assert isinstance(err, DBAPIError)
    return err


def test_transient_error_classification() -> None:
    """Which errors :meth:`Database.run_write` re-runs (module docstring of runtime.memory.db)."""
    commit_lost = _dbapi(psycopg.OperationalError("server closed the connection unexpectedly"))
    commit_lost.sessionray_commit_failed = True  # type: ignore[attr-defined]
    cases = {
        "sqlite locked": (_dbapi(sqlite3.OperationalError("database is locked")), True),
        "sqlite busy": (_dbapi(sqlite3.OperationalError("database schema is busy")), True),
        "sqlite no table": (_dbapi(sqlite3.OperationalError("no such table: x")), False),
        "sqlite integrity": (_dbapi(sqlite3.IntegrityError("UNIQUE constraint failed")), False),
        "pg serialization": (_dbapi(psycopg.errors.SerializationFailure("x")), True),
        "pg deadlock": (_dbapi(psycopg.errors.DeadlockDetected("x")), True),
        "pg unique": (_dbapi(psycopg.errors.UniqueViolation("x")), False),
        "pg lost before commit": (_dbapi(psycopg.OperationalError("server closed the connection")), True),
        "pg invalidated": (_dbapi(psycopg.errors.AdminShutdown("x"), invalidated=True), True),
        "pg lost during commit": (commit_lost, False),
        "plain error": (ValueError("x"), False),
    }
    assert {name: is_transient_write_error(exc) for name, (exc, _) in cases.items()} == {
        name: want for name, (_, want) in cases.items()
    }


async def test_concurrent_writers_of_one_process_never_see_a_busy_file(sqlite_path: Path) -> None:
    """Two Databases on one file, 8 pool threads each, 80 concurrent writes without retries: the
    writer lock serializes them (one lock per file in the process), so none fails "database is
    locked"."""
    url = f"sqlite:///{sqlite_path}"
    dbs = [Database(url, busy_timeout_ms=5000, write_retry_s=0) for _ in range(2)]
    dbs[0].create_tables()
    stores = [TranscriptStore(d) for d in dbs]
    try:
        outcomes = await asyncio.gather(
            *(
                stores[i % 2].record_inbound(
                    message_id=f"m{i}",
                    platform="p",
                    bot_id="b",
                    scene_id="s",
                    scene_type="group",
                    sender_id="u",
                    text=f"text {i}",
                )
                for i in range(80)
            )
        )
    finally:
        for d in dbs:
            d.dispose()
    assert outcomes == ["stored"] * 80
    with sqlite3.connect(sqlite_path) as conn:
        rows = conn.execute("SELECT message_id FROM im_transcripts").fetchall()
    assert sorted(r[0] for r in rows) == sorted(f"m{i}" for i in range(80))

"""The SQL write path of :class:`runtime.memory.db.Database` (docs/decisions.md#memory-write-path):
who may write, and what happens when a write fails for a reason that goes away by itself.

* **Node-wide writer lock (SQLite)** — :func:`writer_lock_for` gives the one :class:`WriterLock` of
  this process for a SQLite file: a process-wide re-entrant lock plus ``fcntl.flock(LOCK_EX)`` on
  the sidecar file ``<db file>.writer.lock`` (created if missing), held from the start of a write
  transaction until its commit or rollback. The lock file is polled non-blocking with pauses of
  at most 2 ms, so writers of every process on the node queue closely instead of sleeping in
  SQLite's busy handler (1, 2, 5 … 100 ms steps); the wait is bounded by the database's
  ``busy_timeout_ms``, then "database is locked" (a transient error, below). Where :mod:`fcntl`
  does not exist only the in-process lock is taken (cross-process writers queue on the busy
  timeout). PostgreSQL takes no lock.
* **Transient write errors are retried** — :func:`is_transient_write_error` classifies an error
  (SQLite "database is locked"/"busy"; PostgreSQL serialization failure ``40001``, deadlock
  ``40P01``, and connection errors raised before commit) and :func:`retry_transient` re-runs a
  whole write transaction on one with capped exponential back-off and jitter for up to a budget
  of seconds, so a busy database never turns an accepted message into a lost turn.
* **Commit outcome** — :func:`commit_marked` runs a COMMIT and marks an exception it raises, so a
  transaction whose commit may have succeeded is never re-run (it could write twice).

Every name here is re-exported by :mod:`runtime.memory.db` where other modules used to find it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

from runtime import metrics

try:  # POSIX only; elsewhere the writer lock is in-process only
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "WriterLock",
    "commit_failed",
    "commit_marked",
    "is_transient_write_error",
    "retry_transient",
    "writer_lock_for",
]

log = logging.getLogger("sessionray.sql")

T = TypeVar("T")

RETRY_BASE_S = 0.005
"""First back-off of :func:`retry_transient`, in seconds (doubles per retry)."""
RETRY_MAX_S = 1.0
"""Cap of one back-off of :func:`retry_transient`, in seconds."""
FLOCK_POLL_MAX_S = 0.002
"""Longest pause between two tries of the writer lock file, in seconds."""
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
    not transient (:func:`commit_marked`): the transaction may have committed, and re-running it
    could write twice.
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


def commit_failed(exc: BaseException) -> bool:
    """True when ``exc`` was raised by a COMMIT (:func:`commit_marked`): the transaction may have
    been written, so it must not run again."""
    return bool(getattr(exc, _COMMIT_FAILED, False))


def commit_marked(commit: Callable[[], None]) -> None:
    """Run ``commit()``; an exception it raises is marked as a COMMIT failure (its outcome is
    unknown), so :func:`is_transient_write_error` never lets :func:`retry_transient` re-run it.

    Raises:
        Whatever ``commit`` raises (marked).
    """
    try:
        commit()
    except BaseException as exc:
        setattr(exc, _COMMIT_FAILED, True)
        raise


async def retry_transient(attempt_once: Callable[[], Awaitable[T]], *, budget_s: float, dialect: str) -> T:
    """Await ``attempt_once()`` and re-run it while it fails with a transient error
    (:func:`is_transient_write_error`), with exponential back-off from 5 ms doubling to a 1 s cap,
    full jitter in [½, 1]×, for up to ``budget_s`` seconds in all.

    ``attempt_once`` must run one whole transaction (it opens and closes its own write session),
    so a failed attempt left nothing behind. Each retry is counted in
    ``sessionray_sql_retries_total{dialect}``; one warning is logged per call that retried.

    Raises:
        Whatever ``attempt_once`` raises that is not transient; the last transient error once
        ``budget_s`` is used up (logged as an error).
    """
    started = time.monotonic()
    attempt = 0
    while True:
        try:
            return await attempt_once()
        except Exception as exc:
            if not is_transient_write_error(exc):
                raise
            attempt += 1
            delay = min(RETRY_MAX_S, RETRY_BASE_S * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
            waited = time.monotonic() - started
            if waited + delay > budget_s:
                log.error(
                    "SQL write still failing after %d attempt(s) in %.1f s, giving up: %s",
                    attempt, waited, _short(exc),
                )  # fmt: skip
                raise
            metrics.SQL_RETRIES.inc(dialect=dialect)
            if attempt == 1:
                log.warning("transient SQL write error, retrying for up to %.0f s: %s", budget_s, _short(exc))
            await asyncio.sleep(delay)


def _short(exc: BaseException) -> str:
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    return f"{type(orig).__name__}: {str(orig).splitlines()[0] if str(orig) else ''}"


class WriterLock:
    """The node-wide writer lock of one SQLite file: a process-wide re-entrant lock plus
    ``flock(LOCK_EX)`` on ``<db file>.writer.lock`` while the outermost holder holds it.

    Re-entrant within a thread (nested write sessions do not deadlock); the pool's other threads
    wait on the in-process lock, other processes on the kernel flock (woken on release). The
    sidecar is opened by the outermost acquire and closed by the outermost release (a few µs), so
    no descriptor stays open between transactions and a forked child inherits none. Get it from
    :func:`writer_lock_for` (one per file and process).

    Args:
        sidecar: Path of the lock file (created if missing).
    """

    def __init__(self, sidecar: Path) -> None:
        self.sidecar = sidecar
        self._lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None
        self._flock_ok = fcntl is not None

    def _flock(self, deadline: float) -> bool:
        """Take the lock file, polling until ``deadline`` (monotonic s); False: still taken then."""
        if not self._flock_ok:
            return True
        try:
            fd = os.open(self.sidecar, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:  # e.g. a read-only directory: in-process lock only
            log.warning(
                "SQLite writer lock file %s unusable (%s): writers of other processes queue on busy_timeout",
                self.sidecar,
                exc,
            )
            self._flock_ok = False
            return True
        delay = 0.0002
        taken = False
        try:
            while True:  # polled, so the wait is bounded (a blocking flock cannot time out)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    taken = True
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(delay)
                    delay = min(delay * 2, FLOCK_POLL_MAX_S)
        finally:
            if taken:
                self._fd = fd
            else:
                os.close(fd)
        return taken

    def acquire(self, timeout_s: float) -> None:
        """Take the lock (re-entrant in the holding thread), waiting at most ``timeout_s`` seconds.

        Raises:
            sqlalchemy.exc.OperationalError: "database is locked" (a transient write error,
                :func:`is_transient_write_error`) when the lock stayed taken ``timeout_s``.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        if not self._lock.acquire(timeout=max(0.0, timeout_s)):
            raise _lock_timeout(self.sidecar)
        if self._depth == 0:
            try:
                taken = self._flock(deadline)
            except BaseException:
                self._lock.release()
                raise
            if not taken:
                self._lock.release()
                raise _lock_timeout(self.sidecar)
        self._depth += 1

    @property
    def spans_processes(self) -> bool:
        """The lock file works (``flock``): the lock also orders the writers of other processes.
        False off POSIX or when the sidecar cannot be opened: in-process lock only."""
        return self._flock_ok

    def try_acquire(self) -> bool:
        """Take the lock only if it is free at once (one try of the lock file, no wait);
        re-entrant like :meth:`acquire`. True: taken (release it with :meth:`release`); False
        also when the lock file cannot be locked (an ``OSError``: :meth:`acquire` reports it)."""
        if not self._lock.acquire(blocking=False):
            return False
        taken = True
        if self._depth == 0:
            try:  # a lock file found unusable just now orders no other process: not taken
                taken = self._flock(time.monotonic()) and self._flock_ok
            except OSError:
                taken = False
            except BaseException:
                self._lock.release()
                raise
        if not taken:
            self._lock.release()
            return False
        self._depth += 1
        return True

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


_WRITER_LOCKS: weakref.WeakValueDictionary[str, WriterLock] = weakref.WeakValueDictionary()
"""One lock per SQLite file in this process, alive while a :class:`Database` on it is."""
_WRITER_LOCKS_GUARD = threading.Lock()


def _lock_timeout(sidecar: Path) -> OperationalError:
    return OperationalError(
        "writer lock", None, sqlite3.OperationalError(f"database is locked (writer lock {sidecar} busy)")
    )


def writer_lock_for(db_path: Path) -> WriterLock:
    """The one :class:`WriterLock` of this process for the SQLite file ``db_path`` (every
    :class:`~runtime.memory.db.Database` on that file shares it, so two of them in one thread
    cannot deadlock). Its sidecar is ``<real path of db_path>.writer.lock``."""
    key = os.path.realpath(db_path)
    with _WRITER_LOCKS_GUARD:
        lock = _WRITER_LOCKS.get(key)
        if lock is None:
            lock = WriterLock(Path(key + ".writer.lock"))
            _WRITER_LOCKS[key] = lock
        return lock


def _reset_writer_locks() -> None:
    global _WRITER_LOCKS_GUARD
    _WRITER_LOCKS_GUARD = threading.Lock()
    for lock in list(_WRITER_LOCKS.values()):
        lock.reset_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_writer_locks)

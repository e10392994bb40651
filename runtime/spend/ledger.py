"""The usage ledger: one SQL row per LLM call, with its owner, tokens and cost
(docs/decisions.md#spend-ledger).

``llm_usage`` columns: ``ts`` (Unix ms when the call ended), ``bot_id``, ``session_key`` (the chat),
``user_id`` (the sender whose message started the turn), ``model`` (``provider/id`` as configured),
``api``, ``session_id``, ``turn_id`` (the inbound message id), ``reason`` (``turn`` | ``correction``
| ``probe`` | ``compaction`` | ``sub-agent`` | ``image``), ``input_tokens``, ``output_tokens``,
``cache_read_tokens``, ``cache_write_tokens``, ``cost_usd`` (USD) and ``master``. Empty strings
mean "not known" (a probe at start-up has no chat). Indexes ``(user_id, ts)``,
``(session_key, ts)``, ``(bot_id, ts)`` and ``(ts)`` serve the quota sums and the reports.

The table is created by the start-up ``Database.create_tables`` with the memory tables: importing
this module registers it (:func:`runtime.memory.tables.register_tables`), and
:mod:`runtime.session` imports it, so every process that runs sessions (and the runtime that
creates the tables before the hosts start) knows it. It is create-only like them
(docs/decisions.md#memory-create-only).

:func:`install_ledger` makes a process record every call of :mod:`runtime.llm` in one database: a
usage observer (:mod:`runtime.llm.usage`) that inserts the row through :meth:`Database.run_write`
(inline on SQLite while the writer lock is free, else on the SQL thread pool, retried while the
database is busy; docs/decisions.md#memory-sql-off-loop)
and returns once it is committed — the call's end is seen only after that. A call of a turn's own
(:data:`CARRIED_REASONS`) made inside :func:`carried_usage` has its row staged instead
(:class:`UsageCarrier`): the turn's next write transaction inserts it (docs/decisions.md#spend-ledger).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from sqlalchemy import BigInteger, Boolean, Column, Connection, Float, Index, Integer, Text, insert
from sqlmodel import Field, SQLModel

from runtime import metrics
from runtime.llm.usage import CallUsage, add_usage_observer, remove_usage_observer
from runtime.memory.db import Database
from runtime.memory.tables import register_tables

__all__ = [
    "CARRIED_REASONS",
    "USAGE_TABLE",
    "UsageCarrier",
    "UsageLedger",
    "UsageLedgerRow",
    "carried_usage",
    "insert_usage",
    "install_ledger",
    "ledger_row",
    "write_usage",
]

log = logging.getLogger("sessionray.spend")

_ID = BigInteger().with_variant(Integer(), "sqlite")


def _text() -> Any:
    return Column(Text, nullable=False, default="")


def _count() -> Any:
    return Column(BigInteger, nullable=False, default=0)


class UsageLedgerRow(SQLModel, table=True):
    """One LLM call (see the module docstring). Rows are only ever inserted."""

    __tablename__ = "llm_usage"
    __table_args__ = (
        Index("ix_llm_usage_user_ts", "user_id", "ts"),
        Index("ix_llm_usage_chat_ts", "session_key", "ts"),
        Index("ix_llm_usage_bot_ts", "bot_id", "ts"),
        Index("ix_llm_usage_ts", "ts"),
    )

    id: int | None = Field(default=None, sa_column=Column(_ID, primary_key=True, autoincrement=True))
    ts: int = Field(sa_column=Column(BigInteger, nullable=False))
    """Unix ms when the call ended."""
    bot_id: str = Field(default="", sa_column=_text())
    session_key: str = Field(default="", sa_column=_text())
    user_id: str = Field(default="", sa_column=_text())
    model: str = Field(default="", sa_column=_text())
    api: str = Field(default="", sa_column=_text())
    session_id: str = Field(default="", sa_column=_text())
    turn_id: str = Field(default="", sa_column=_text())
    reason: str = Field(default="turn", sa_column=_text())
    input_tokens: int = Field(default=0, sa_column=_count())
    output_tokens: int = Field(default=0, sa_column=_count())
    cache_read_tokens: int = Field(default=0, sa_column=_count())
    cache_write_tokens: int = Field(default=0, sa_column=_count())
    cost_usd: float = Field(default=0.0, sa_column=Column(Float(precision=53), nullable=False, default=0.0))
    """USD (double precision)."""
    master: bool = Field(default=False, sa_column=Column(Boolean, nullable=False, default=False))


USAGE_TABLE: Any = UsageLedgerRow.__table__  # type: ignore[attr-defined]
_INSERT_USAGE = insert(USAGE_TABLE)
"""Built once (docs/decisions.md#memory-write-path): building and keying a statement per call
cost more than its execution."""
register_tables(UsageLedgerRow)


def ledger_row(call: CallUsage) -> dict[str, Any]:
    """The ``llm_usage`` row of ``call`` (column → value)."""
    a = call.attribution
    u = call.usage
    return {
        "ts": call.ts_ms,
        "bot_id": a.bot_id if a else "",
        "session_key": a.session_key if a else "",
        "user_id": a.user_id if a else "",
        "model": call.model,
        "api": call.api,
        "session_id": a.session_id if a else "",
        "turn_id": a.turn_id if a else "",
        "reason": a.reason if a else "turn",
        "input_tokens": u.input,
        "output_tokens": u.output,
        "cache_read_tokens": u.cache_read,
        "cache_write_tokens": u.cache_write,
        "cost_usd": call.cost_usd,
        "master": a.master if a else False,
    }


def write_usage(db: Database, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` (:func:`ledger_row`) in one write transaction. Blocking: call through
    ``db.run_write``."""
    with db.connection(write=True) as conn:
        insert_usage(conn, rows)


def insert_usage(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` (:func:`ledger_row`) inside the caller's write transaction ``conn``."""
    conn.execute(_INSERT_USAGE, rows[0] if len(rows) == 1 else rows)


CARRIED_REASONS = frozenset({"turn", "correction"})
"""Attribution reasons of the calls whose row a turn's next write carries (the turn's own model
calls); every other call (a sub-agent's, a compaction's, a probe's) writes its row at once."""


class UsageCarrier:
    """A turn's hold on the usage rows of its own calls: each goes into the turn's next write
    transaction, ``stage(write)`` (the session writer's ``stage_write``), instead of a transaction
    of its own (docs/decisions.md#spend-ledger). Open from :func:`carried_usage` until the turn
    ends; a call that ends afterwards writes its row at once.

    Args:
        db: The database the turn writes to (a ledger on another one does not stage).
        stage: Takes ``write(conn)`` for the turn's next write transaction.

    Raises:
        RuntimeError: built outside a running event loop (it stages for the turn's loop only).
    """

    def __init__(self, db: Database, stage: Callable[[Callable[[Connection], None]], None]) -> None:
        self.db = db
        self._stage = stage
        self._loop = asyncio.get_running_loop()
        self.open = True

    def take(self, db: Database, call: CallUsage, rows: list[dict[str, Any]]) -> bool:
        """Stage ``rows`` of ``call`` for the turn's next write; False (nothing staged) when the
        turn ended, ``db`` is another database, the call is not one of the turn's own
        (:data:`CARRIED_REASONS`) or it ended on another event loop than the turn's (a tool's
        worker thread: the writer belongs to the turn's loop)."""
        reason = call.attribution.reason if call.attribution is not None else None
        if not self.open or db is not self.db or reason not in CARRIED_REASONS or not self._on_loop():
            return False
        self._stage(functools.partial(_insert_carried, rows=rows))
        return True

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False


def _insert_carried(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """A staged insert, in a savepoint of the turn's write: a row that cannot be written is
    logged, counted and rolled back alone, and the turn's write goes on — accounting never breaks
    a turn (docs/decisions.md#spend-ledger). The savepoint's three statements go to the driver's
    connection itself (sqlite3 and psycopg both take them so): SQLAlchemy's ``begin_nested`` cost
    about 0.2 ms of CPU a turn on SQLite, four times the insert it guards; this costs 0.01 ms."""
    raw: Any = conn.connection.driver_connection
    raw.execute("SAVEPOINT usage_rows")
    try:
        insert_usage(conn, rows)
    except Exception:
        raw.execute("ROLLBACK TO SAVEPOINT usage_rows")
        metrics.USAGE_LEDGER_FAILURES.inc()
        log.exception("usage of a call of %s not recorded", rows[0].get("model"))
    raw.execute("RELEASE SAVEPOINT usage_rows")


_CARRIER: ContextVar[UsageCarrier | None] = ContextVar("sessionray_usage_carrier", default=None)


@contextlib.contextmanager
def carried_usage(carrier: UsageCarrier) -> Iterator[UsageCarrier]:
    """Within the block (and the tasks it starts), the turn's own calls' rows go to
    ``carrier``; it is closed when the block ends."""
    token = _CARRIER.set(carrier)
    try:
        yield carrier
    finally:
        carrier.open = False
        _CARRIER.reset(token)


class UsageLedger:
    """The usage observer that writes each call's row into ``db`` (held weakly: once the database
    is gone or disposed the observer records nothing). Never raises: a failed write is logged and counted in
    ``sessionray_usage_ledger_failures_total``."""

    def __init__(self, db: Database) -> None:
        self._db = weakref.ref(db)

    @property
    def db(self) -> Database | None:
        """The database written to (``None`` once it was garbage-collected)."""
        return self._db()

    async def __call__(self, call: CallUsage) -> None:
        db = self._db()
        if db is None or db.closed:  # the process is shutting its database down
            return
        rows = [ledger_row(call)]
        if (carrier := _CARRIER.get()) is not None and carrier.take(db, call, rows):
            return  # committed with the turn's next write (docs/decisions.md#spend-ledger)
        try:
            await db.run_write(lambda: write_usage(db, rows), inline=True)
        except Exception:
            metrics.USAGE_LEDGER_FAILURES.inc()
            log.exception("usage of a call of %s not recorded", call.model)


_installed: UsageLedger | None = None


def install_ledger(db: Database) -> UsageLedger:
    """Record every LLM call of this process in ``db`` from now on (one ledger per process: a
    later call with another database replaces the earlier one; the same database: a no-op).
    ``db``'s tables must exist (``Database.create_tables``)."""
    global _installed
    if _installed is not None and _installed.db is db:
        return _installed
    if _installed is not None:
        remove_usage_observer(_installed)
    _installed = UsageLedger(db)
    add_usage_observer(_installed)
    return _installed

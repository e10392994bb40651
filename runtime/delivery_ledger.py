"""The delivery idempotency ledger: one SQL row per reply, keyed by the reply's id (issue #8, item 4).

A reply is rendered into N platform API calls ("steps"). The ledger records, per reply:

* the whole delivery job (``job_json``), so any delivery actor can finish it;
* who owns it (``owner`` = ``"{partition}:{incarnation}"`` of a DeliveryActor) and until when
  (``lease_until``, Unix ms);
* how many steps are confirmed (``steps_done``) and which step is on the wire (``in_flight``,
  ``-1`` when none), plus the platform's message ids of the confirmed steps.

Rules that make a retried or replayed send never reach the platform twice:

1. A reply whose row says ``sent`` or ``failed`` is not sent again (the caller gets the recorded
   result, outcome ``duplicate``).
2. A step is marked ``in_flight`` *before* its HTTP call and ``done`` after the platform confirms.
   A new owner that finds ``in_flight == steps_done`` cannot know whether the platform received
   that call (its owner died mid-send), so it **skips** that step (at-most-once for the one
   uncertain call; it is logged and counted with outcome ``uncertain``) and continues with the next.
3. Ownership moves only when the lease expired, or when the claimer is the restarted incarnation
   of the same partition (Ray runs at most one incarnation of a named actor at a time, so the old
   one is dead). Each write checks the owner, so a stale owner cannot write over a new one.

The table shares ``SQLModel.metadata`` with the memory tables (runtime/memory/tables.py) and is
created, if missing, by :func:`create_ledger_table` (never dropped or altered; seed 002 #9).
Every function here is blocking: call it through :meth:`runtime.memory.db.Database.run`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import BigInteger, Column, Integer, Text, or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, col, select

from runtime.memory.db import Database
from runtime.types import now_ms

__all__ = [
    "ClaimOutcome",
    "DeliveryLedgerRow",
    "LedgerEntry",
    "LostLeaseError",
    "begin_step",
    "claim",
    "create_ledger_table",
    "finish",
    "finish_step",
    "get_entry",
    "resumable",
    "skip_uncertain_step",
]

LedgerStatus = Literal["pending", "sent", "failed"]


class LostLeaseError(RuntimeError):
    """Another delivery actor took over this reply (our lease expired); stop sending it."""


class DeliveryLedgerRow(SQLModel, table=True):
    """One reply's delivery state (see module docstring)."""

    __tablename__ = "delivery_ledger"

    reply_id: str = Field(sa_column=Column(Text, primary_key=True))
    """The idempotency key: the reply's id (stable across retries and replays of one turn)."""
    session_key: str = Field(sa_column=Column(Text, nullable=False, index=True))
    platform: str = Field(sa_column=Column(Text, nullable=False))
    bot_id: str = Field(sa_column=Column(Text, nullable=False))
    partition: int = Field(sa_column=Column(Integer, nullable=False))
    """Index of the delivery actor this reply hashes to."""
    job_json: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(sa_column=Column(Text, nullable=False, index=True))
    """``pending`` | ``sent`` | ``failed``."""
    owner: str = Field(sa_column=Column(Text, nullable=False))
    lease_until: int = Field(sa_column=Column(BigInteger, nullable=False))
    steps_total: int = Field(default=-1, sa_column=Column(Integer, nullable=False))
    """Number of API calls the reply renders to (``-1`` until rendered)."""
    steps_done: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    in_flight: int = Field(default=-1, sa_column=Column(Integer, nullable=False))
    message_ids: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    """JSON list of the platform's message ids of the confirmed steps (``null`` for a skipped one)."""
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: int = Field(sa_column=Column(BigInteger, nullable=False))
    updated_at: int = Field(sa_column=Column(BigInteger, nullable=False))


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A copy of one ledger row (times in Unix ms)."""

    reply_id: str
    session_key: str
    platform: str
    bot_id: str
    partition: int
    job_json: str
    status: LedgerStatus
    owner: str
    lease_until: int
    steps_total: int
    steps_done: int
    in_flight: int
    message_ids: list[str | None]
    error: str | None

    @classmethod
    def of(cls, row: DeliveryLedgerRow) -> LedgerEntry:
        """Copy ``row`` (detached from any SQL session)."""
        return cls(
            reply_id=row.reply_id,
            session_key=row.session_key,
            platform=row.platform,
            bot_id=row.bot_id,
            partition=row.partition,
            job_json=row.job_json,
            status=row.status,  # type: ignore[arg-type]
            owner=row.owner,
            lease_until=row.lease_until,
            steps_total=row.steps_total,
            steps_done=row.steps_done,
            in_flight=row.in_flight,
            message_ids=json.loads(row.message_ids),
            error=row.error,
        )


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """Result of :func:`claim`: ``state`` is ``claimed`` (you own it now), ``done`` (already sent
    or failed: do not send) or ``busy`` (a live owner holds the lease)."""

    state: Literal["claimed", "done", "busy"]
    entry: LedgerEntry


def create_ledger_table(db: Database) -> None:
    """Create ``delivery_ledger`` and the memory tables if missing (never drops or alters; seed 002 #9).

    Runs in one writer transaction (SQLite ``BEGIN IMMEDIATE``), so several delivery actors
    starting at once on one SQLite file queue on the busy timeout instead of failing with
    "database is locked" (a deferred transaction cannot be upgraded to a writer while another
    process writes).
    """
    from runtime.memory.tables import MEMORY_TABLES

    tables = [t.__table__ for t in (*MEMORY_TABLES, DeliveryLedgerRow)]  # type: ignore[attr-defined]
    with db.engine.connect() as conn:
        if db.is_sqlite:
            conn = conn.execution_options(sessionray_sqlite_immediate=True)
        with conn.begin():
            SQLModel.metadata.create_all(conn, tables=tables, checkfirst=True)


def _locked(s: Session, db: Database, reply_id: str) -> DeliveryLedgerRow | None:
    stmt = select(DeliveryLedgerRow).where(DeliveryLedgerRow.reply_id == reply_id)
    if not db.is_sqlite:  # SQLite: the BEGIN IMMEDIATE of a write session already serializes writers
        stmt = stmt.with_for_update()
    return s.exec(stmt).first()


def _may_take_over(row: DeliveryLedgerRow, owner: str, now: int) -> bool:
    if row.owner == owner or row.lease_until <= now:
        return True
    partition, _, _ = owner.partition(":")
    return row.owner.split(":", 1)[0] == partition  # our own partition's dead previous incarnation


def claim(
    db: Database,
    *,
    reply_id: str,
    session_key: str,
    platform: str,
    bot_id: str,
    partition: int,
    job_json: str,
    owner: str,
    lease_ms: int,
) -> ClaimOutcome:
    """Insert the reply's row (status ``pending``, owned by ``owner``) or take it over.

    Args:
        lease_ms: How long the claim holds without a write (each step write renews it), in ms.

    Returns:
        ``claimed`` when ``owner`` may send now (fresh row, own row, expired lease, or the dead
        previous incarnation of the same partition); ``done`` for a ``sent``/``failed`` row;
        ``busy`` when another live owner holds the lease.
    """
    now = now_ms()
    for _ in range(2):  # a concurrent insert of the same reply_id makes the first try fail
        try:
            with db.session(write=True) as s:
                row = _locked(s, db, reply_id)
                if row is None:
                    row = DeliveryLedgerRow(
                        reply_id=reply_id,
                        session_key=session_key,
                        platform=platform,
                        bot_id=bot_id,
                        partition=partition,
                        job_json=job_json,
                        status="pending",
                        owner=owner,
                        lease_until=now + lease_ms,
                        created_at=now,
                        updated_at=now,
                    )
                    s.add(row)
                    s.flush()
                    return ClaimOutcome("claimed", LedgerEntry.of(row))
                if row.status != "pending":
                    return ClaimOutcome("done", LedgerEntry.of(row))
                if not _may_take_over(row, owner, now):
                    return ClaimOutcome("busy", LedgerEntry.of(row))
                row.owner, row.lease_until, row.updated_at = owner, now + lease_ms, now
                s.add(row)
                s.flush()
                return ClaimOutcome("claimed", LedgerEntry.of(row))
        except IntegrityError:
            continue
    raise RuntimeError(f"could not claim delivery {reply_id!r}")  # pragma: no cover - needs two races


def _owned(s: Session, db: Database, reply_id: str, owner: str) -> DeliveryLedgerRow:
    row = _locked(s, db, reply_id)
    if row is None or row.owner != owner or row.status != "pending":
        raise LostLeaseError(f"delivery {reply_id!r} is no longer owned by {owner!r}")
    return row


def begin_step(db: Database, reply_id: str, owner: str, step: int, steps_total: int, lease_ms: int) -> None:
    """Mark step ``step`` (0-based) of ``steps_total`` as on the wire; renews the lease.

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    now = now_ms()
    with db.session(write=True) as s:
        row = _owned(s, db, reply_id, owner)
        row.in_flight, row.steps_total = step, steps_total
        row.lease_until, row.updated_at = now + lease_ms, now
        s.add(row)


def finish_step(
    db: Database, reply_id: str, owner: str, step: int, message_id: str | None, *, last: bool = False
) -> None:
    """Record that the platform confirmed step ``step`` (with its message id, if any); with
    ``last`` the reply is closed as ``sent`` in the same transaction (one SQLite write fewer).

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    with db.session(write=True) as s:
        row = _owned(s, db, reply_id, owner)
        ids = json.loads(row.message_ids)
        ids.append(message_id)
        row.message_ids, row.steps_done, row.in_flight = json.dumps(ids), step + 1, -1
        if last:
            row.status, row.error = "sent", None
        row.updated_at = now_ms()
        s.add(row)


def skip_uncertain_step(db: Database, reply_id: str, owner: str) -> int:
    """Skip the step a dead owner left on the wire (rule 2); returns its index.

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    with db.session(write=True) as s:
        row = _owned(s, db, reply_id, owner)
        step = row.in_flight
        ids = json.loads(row.message_ids)
        ids.append(None)
        row.message_ids, row.steps_done, row.in_flight = json.dumps(ids), step + 1, -1
        row.updated_at = now_ms()
        s.add(row)
        return step


def finish(
    db: Database, reply_id: str, owner: str, status: Literal["sent", "failed"], error: str | None
) -> LedgerEntry:
    """Close the reply as ``sent`` or ``failed`` (terminal: never sent again).

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    with db.session(write=True) as s:
        row = _owned(s, db, reply_id, owner)
        row.status, row.error, row.in_flight, row.updated_at = status, error, -1, now_ms()
        s.add(row)
        s.flush()
        return LedgerEntry.of(row)


def get_entry(db: Database, reply_id: str) -> LedgerEntry | None:
    """The reply's ledger row, or None."""
    with db.session() as s:
        row = s.exec(select(DeliveryLedgerRow).where(DeliveryLedgerRow.reply_id == reply_id)).first()
        return LedgerEntry.of(row) if row else None


def resumable(db: Database, partition: int, owner: str, limit: int = 100) -> list[LedgerEntry]:
    """Pending replies that ``owner`` may take over: those of its own partition owned by another
    (dead) incarnation, and any whose lease expired. Oldest first."""
    now = now_ms()
    with db.session() as s:
        stmt = (
            select(DeliveryLedgerRow)
            .where(DeliveryLedgerRow.status == "pending")
            .where(DeliveryLedgerRow.owner != owner)
            .where(
                or_(col(DeliveryLedgerRow.partition) == partition, col(DeliveryLedgerRow.lease_until) <= now)
            )
            .order_by(DeliveryLedgerRow.created_at)  # type: ignore[arg-type]
            .limit(limit)
        )
        return [LedgerEntry.of(r) for r in s.exec(stmt).all()]

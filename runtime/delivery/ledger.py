"""The delivery idempotency ledger: one SQL row per reply, keyed by the reply's id
(docs/decisions.md#delivery-ledger).

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

Rule 2 in one transaction: :func:`claim_and_begin` inserts a fresh row with step 0 already
marked in flight (or claims an existing one and, when its next step is 0 and nothing is on the
wire, marks step 0 in the same write), so the first send of a reply costs one ledger write
instead of two.

The table shares ``SQLModel.metadata`` with the memory tables (runtime/memory/tables.py) and is
created, if missing, by :func:`create_ledger_table` (never dropped or altered;
docs/decisions.md#memory-create-only). The writes are SQLAlchemy Core statements built once (a write
transaction costs a few statements, not an ORM flush per object:
docs/decisions.md#memory-write-path); each is one whole transaction, so a caller may re-run it on a
transient error. Every function here is blocking: call the writers through
:meth:`runtime.memory.db.Database.run_write`, the readers through
:meth:`~runtime.memory.db.Database.run`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from typing import Any, Literal, TypedDict, Unpack

from sqlalchemy import BigInteger, Column, Connection, Integer, Table, Text, bindparam, or_, update
from sqlalchemy import select as core_select
from sqlmodel import Field, SQLModel, col, select

from runtime.llm.types import now_ms
from runtime.memory.db import Database

__all__ = [
    "ClaimFields",
    "ClaimOutcome",
    "DeliveryLedgerRow",
    "LedgerEntry",
    "LostLeaseError",
    "begin_step",
    "claim",
    "claim_and_begin",
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
    def of(cls, row: Any) -> LedgerEntry:
        """Copy ``row`` (a :class:`DeliveryLedgerRow`, or a Core result row of the table)."""
        copied = {f.name: getattr(row, f.name) for f in dataclass_fields(cls) if f.name != "message_ids"}
        return cls(**copied, message_ids=json.loads(row.message_ids))


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """Result of :func:`claim`: ``state`` is ``claimed`` (you own it now), ``done`` (already sent
    or failed: do not send) or ``busy`` (a live owner holds the lease). ``begun`` is True when
    :func:`claim_and_begin` also marked step 0 in flight (then do not call :func:`begin_step`
    for step 0)."""

    state: Literal["claimed", "done", "busy"]
    entry: LedgerEntry
    begun: bool = False


def create_ledger_table(db: Database) -> None:
    """Create ``delivery_ledger`` and the memory tables if missing (never drops or alters;
    docs/decisions.md#memory-create-only).

    Runs in one writer transaction (SQLite: under the node-wide writer lock, ``BEGIN IMMEDIATE``),
    so several delivery actors starting at once on one SQLite file queue instead of failing with
    "database is locked" (a deferred transaction cannot be upgraded to a writer while another
    process writes).
    """
    from runtime.memory.tables import MEMORY_TABLES

    tables = [t.__table__ for t in (*MEMORY_TABLES, DeliveryLedgerRow)]  # type: ignore[attr-defined]
    with db.connection(write=True) as conn:
        SQLModel.metadata.create_all(conn, tables=tables, checkfirst=True)


_T: Table = DeliveryLedgerRow.__table__  # type: ignore[attr-defined]
_OWNED = (_T.c.reply_id == bindparam("r")) & (_T.c.owner == bindparam("o")) & (_T.c.status == "pending")
"""The row is ours: it exists, ``owner`` holds it and it is still ``pending``."""
_SELECT = core_select(_T).where(_T.c.reply_id == bindparam("r"))
_SELECT_FOR_UPDATE = _SELECT.with_for_update()
_SELECT_OWNED_IDS = core_select(_T.c.message_ids, _T.c.in_flight).where(_OWNED)
_SELECT_OWNED_IDS_FOR_UPDATE = _SELECT_OWNED_IDS.with_for_update()
_TAKE_OVER = (
    update(_T)
    .where(_T.c.reply_id == bindparam("r"))
    .values(owner=bindparam("o"), lease_until=bindparam("lease"), updated_at=bindparam("now"))
)
_TAKE_OVER_AND_BEGIN = _TAKE_OVER.values(in_flight=0, steps_total=bindparam("total"))
_BEGIN = (
    update(_T)
    .where(_OWNED)
    .values(
        in_flight=bindparam("step"),
        steps_total=bindparam("total"),
        lease_until=bindparam("lease"),
        updated_at=bindparam("now"),
    )
)
_STEP_DONE = (
    update(_T)
    .where(_OWNED)
    .values(
        message_ids=bindparam("ids"), steps_done=bindparam("done"), in_flight=-1, updated_at=bindparam("now")
    )
)
_STEP_DONE_LAST = _STEP_DONE.values(status="sent", error=None)
_FINISH = (
    update(_T)
    .where(_OWNED)
    .values(status=bindparam("st"), error=bindparam("err"), in_flight=-1, updated_at=bindparam("now"))
    .returning(*_T.c)
)


_INSERT: dict[str, Any] = {}
"""The fresh-row ``INSERT … ON CONFLICT DO NOTHING RETURNING`` per dialect (built once)."""


def _locked(conn: Connection, db: Database, reply_id: str) -> Any:
    # SQLite: the writer lock and BEGIN IMMEDIATE of a write transaction already serialize writers.
    return conn.execute(_SELECT if db.is_sqlite else _SELECT_FOR_UPDATE, {"r": reply_id}).first()


def _may_take_over(row: Any, owner: str, now: int) -> bool:
    if row.owner == owner or row.lease_until <= now:
        return True
    partition, _, _ = owner.partition(":")
    return bool(row.owner.split(":", 1)[0] == partition)  # our own partition's dead previous incarnation


def _lost(reply_id: str, owner: str) -> LostLeaseError:
    return LostLeaseError(f"delivery {reply_id!r} is no longer owned by {owner!r}")


class ClaimFields(TypedDict):
    """The keyword arguments of :func:`claim` and :func:`claim_and_begin`: the reply's identity,
    its whole delivery job, and the claimer."""

    reply_id: str
    """The idempotency key (the reply's id)."""
    owner: str
    """``"{partition}:{incarnation}"`` of the claiming delivery actor."""
    lease_ms: int
    """How long the claim holds without a write (each step write renews it), in ms."""
    session_key: str
    platform: str
    bot_id: str
    partition: int
    """Index of the delivery actor the reply hashes to."""
    job_json: str
    """The whole ``DeliveryJob`` as JSON (any delivery actor can finish it)."""


def claim(db: Database, **fields: Unpack[ClaimFields]) -> ClaimOutcome:
    """Insert the reply's row (status ``pending``, owned by ``owner``) or take it over.

    Args:
        fields: :class:`ClaimFields`, all required, by keyword.

    Returns:
        ``claimed`` when ``owner`` may send now (fresh row, own row, expired lease, or the dead
        previous incarnation of the same partition); ``done`` for a ``sent``/``failed`` row;
        ``busy`` when another live owner holds the lease.

    Raises:
        TypeError: a field of :class:`ClaimFields` is missing or an unknown one is given.
    """
    return _claim(db, fields, None)


def claim_and_begin(db: Database, *, steps_total: int, **fields: Unpack[ClaimFields]) -> ClaimOutcome:
    """:func:`claim`, and in the same transaction :func:`begin_step` of step 0 of ``steps_total``
    when the claimed row's next step is 0 and nothing is on the wire (a fresh row, or one whose
    owner died before its first send). Then ``begun`` is True and the caller sends step 0
    without another ledger write. A row with confirmed steps or an uncertain step 0 (rule 2) is
    claimed exactly as :func:`claim` does (``begun`` False).

    Args:
        steps_total: Number of API calls the reply renders to (>= 1).
        fields: :class:`ClaimFields`, as for :func:`claim`.

    Raises:
        ValueError: ``steps_total`` < 1.
        TypeError: as for :func:`claim`.
    """
    if steps_total < 1:
        raise ValueError(f"claim_and_begin needs at least one step, got steps_total={steps_total}")
    return _claim(db, fields, steps_total)


def _claim(db: Database, fields: ClaimFields, begin_total: int | None) -> ClaimOutcome:
    if fields.keys() != ClaimFields.__required_keys__:
        missing = sorted(ClaimFields.__required_keys__ - fields.keys())
        unknown = sorted(fields.keys() - ClaimFields.__required_keys__)
        raise TypeError(f"claim fields: missing {missing}, unknown {unknown}")
    now = now_ms()
    begin = begin_total is not None
    reply_id, owner, lease_ms = fields["reply_id"], fields["owner"], fields["lease_ms"]
    fresh: dict[str, Any] = {
        **{k: v for k, v in fields.items() if k != "lease_ms"},
        "status": "pending",
        "lease_until": now + lease_ms,
        "steps_total": begin_total if begin else -1,
        "steps_done": 0,
        "in_flight": 0 if begin else -1,
        "message_ids": "[]",
        "error": None,
        "created_at": now,
        "updated_at": now,
    }
    # INSERT … ON CONFLICT DO NOTHING: a concurrent insert of the same reply_id waits for the
    # other transaction (PostgreSQL) or is serialized by the writer lock (SQLite), then finds it.
    insert_stmt = _INSERT.get(db.dialect)
    if insert_stmt is None:
        insert_stmt = _INSERT[db.dialect] = (
            db.insert(_T).on_conflict_do_nothing(index_elements=["reply_id"]).returning(_T.c.reply_id)
        )
    with db.connection(write=True) as conn:
        result = conn.execute(insert_stmt, fresh)
        # pysqlite reports no result columns when RETURNING yields no row (a conflict).
        if result.returns_rows and result.first() is not None:
            return ClaimOutcome("claimed", LedgerEntry.of(_Fresh(fresh)), begun=begin)
        row = _locked(conn, db, reply_id)
        if row is None:  # pragma: no cover - rows are never deleted
            raise RuntimeError(f"could not claim delivery {reply_id!r}")
        if row.status != "pending":
            return ClaimOutcome("done", LedgerEntry.of(row))
        if not _may_take_over(row, owner, now):
            return ClaimOutcome("busy", LedgerEntry.of(row))
        values: dict[str, Any] = {
            **row._asdict(),
            "owner": owner,
            "lease_until": now + lease_ms,
            "updated_at": now,
        }
        params: dict[str, Any] = {"r": reply_id, "o": owner, "lease": now + lease_ms, "now": now}
        start = begin and row.steps_done == 0 and row.in_flight == -1
        if start:
            values.update(in_flight=0, steps_total=begin_total)
            params["total"] = begin_total
        conn.execute(_TAKE_OVER_AND_BEGIN if start else _TAKE_OVER, params)
        return ClaimOutcome("claimed", LedgerEntry.of(_Fresh(values)), begun=start)


class _Fresh:
    """Attribute view of a dict of column values (for :meth:`LedgerEntry.of`)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def begin_step(db: Database, reply_id: str, owner: str, step: int, steps_total: int, lease_ms: int) -> None:
    """Mark step ``step`` (0-based) of ``steps_total`` as on the wire; renews the lease.

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    now = now_ms()
    params = {
        "r": reply_id,
        "o": owner,
        "step": step,
        "total": steps_total,
        "lease": now + lease_ms,
        "now": now,
    }
    with db.connection(write=True) as conn:
        if conn.execute(_BEGIN, params).rowcount == 0:
            raise _lost(reply_id, owner)


def _owned_ids(conn: Connection, db: Database, reply_id: str, owner: str) -> tuple[list[str | None], int]:
    stmt = _SELECT_OWNED_IDS if db.is_sqlite else _SELECT_OWNED_IDS_FOR_UPDATE
    row = conn.execute(stmt, {"r": reply_id, "o": owner}).first()
    if row is None:
        raise _lost(reply_id, owner)
    return json.loads(row.message_ids), int(row.in_flight)


def finish_step(
    db: Database, reply_id: str, owner: str, step: int, message_id: str | None, *, last: bool = False
) -> None:
    """Record that the platform confirmed step ``step`` (with its message id, if any); with
    ``last`` the reply is closed as ``sent`` in the same transaction (one SQLite write fewer).

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    _record_step(db, reply_id, owner, message_id, step=step, last=last)


def skip_uncertain_step(db: Database, reply_id: str, owner: str) -> int:
    """Skip the step a dead owner left on the wire (rule 2); returns its index.

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    return _record_step(db, reply_id, owner, None)


def _record_step(
    db: Database,
    reply_id: str,
    owner: str,
    message_id: str | None,
    *,
    step: int | None = None,
    last: bool = False,
) -> int:
    """Append ``message_id`` to the owned row's ids and mark ``step`` (``None``: the step on the
    wire) done, in one transaction; with ``last`` also close the reply as ``sent``. Returns the step."""
    with db.connection(write=True) as conn:
        ids, in_flight = _owned_ids(conn, db, reply_id, owner)
        done = in_flight if step is None else step
        ids.append(message_id)
        params = {"r": reply_id, "o": owner, "ids": json.dumps(ids), "done": done + 1, "now": now_ms()}
        conn.execute(_STEP_DONE_LAST if last else _STEP_DONE, params)
        return done


def finish(
    db: Database, reply_id: str, owner: str, status: Literal["sent", "failed"], error: str | None
) -> LedgerEntry:
    """Close the reply as ``sent`` or ``failed`` (terminal: never sent again).

    Raises:
        LostLeaseError: another owner took the reply over.
    """
    params = {"r": reply_id, "o": owner, "st": status, "err": error, "now": now_ms()}
    with db.connection(write=True) as conn:
        row = conn.execute(_FINISH, params).first()
        if row is None:
            raise _lost(reply_id, owner)
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

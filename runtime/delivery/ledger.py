"""The delivery ledger: one SQL row per reply, keyed by the reply's id
(docs/decisions.md#delivery-ledger, docs/decisions.md#delivery-outbox).

A reply is rendered into N platform API calls ("steps"). The ledger records, per reply:

* the whole delivery job (``job_json``), so any delivery actor can finish it;
* its state (``status``): ``queued`` (recorded by the session's turn, no owner yet: see
  :mod:`runtime.delivery.outbox`), ``pending`` (owned and being sent), and the final ``sent``,
  ``failed`` and ``uncertain``;
* who owns it (``owner`` = ``"{partition}:{incarnation}"`` of a DeliveryActor, or
  ``"host:{actor id}"`` of a session host sending its chat's head reply itself:
  docs/decisions.md#delivery-in-host) and until when (``lease_until``, Unix ms);
* how many steps are handled (``steps_done``) and which step is on the wire (``in_flight``,
  ``-1`` when none), plus the platform's message ids of the handled steps.

Rules that make a retried or replayed send never reach the platform twice:

1. A reply whose row is final (``sent``, ``failed``, ``uncertain``) is not sent again by itself
   (the caller gets the recorded result, outcome ``duplicate``); only an operator's retry
   (:func:`runtime.delivery.outbox.retry`) queues it again.
2. A step is marked ``in_flight`` *before* its HTTP call and done after the platform confirms.
   A new owner that finds a step in flight cannot know whether the platform received that call
   (its owner died mid-send), so it records the step as **uncertain** (a ``delivery_uncertain``
   row, :func:`record_uncertain`), never sends it again by itself, and goes on with the next
   steps; the reply then ends ``uncertain`` (docs/decisions.md#delivery-uncertain).
3. Ownership moves only when the lease expired, or when the claimer is the restarted incarnation
   of the same partition (Ray runs at most one incarnation of a named actor at a time, so the old
   one is dead). Each write checks the owner, so a stale owner cannot write over a new one. An
   owner that waits out a platform outage renews its lease (:func:`renew`).

What one reply writes, and when (:data:`REPLY_WRITES_OVER_HTTP`): a ``queued`` row nobody worked
on yet (the outbox's common case) of a bot over HTTP is claimed by the mark of its step 0 as the
request is written (:func:`claim_fresh`: the delivery actor read the chat's queue without a
write), then :func:`finish_step` once the platform confirmed it (the last step with the outbound
transcript row): two write transactions for a one-step reply, ``2 × steps`` in general. Any other
row — one worked on before, a reply with attachments (its media are fetched once, after the
claim), a reply handed straight to a delivery actor — is claimed first (:func:`claim_queued` or
:func:`claim`), then each step marked by :func:`begin_step` as its request is written (never at the
claim: a sender killed while connecting must leave a step that is sent again,
docs/decisions.md#delivery-uncertain): ``1 + 2 × steps``. Over a socket (a OneBot WebSocket) the
frame is written at once, so :func:`claim_and_begin` claims a row (inserting it when missing) and,
when its next step is 0 and nothing is on the wire, marks step 0 in flight in the same write:
``2 × steps`` writes.

The tables are :mod:`runtime.delivery.tables` (created with the memory tables; never
dropped or altered: docs/decisions.md#memory-create-only). The writes are SQLAlchemy Core
statements built once (docs/decisions.md#memory-write-path); each is one whole transaction, so a
caller may re-run it on a transient error. Every function here is blocking: call the writers
through :meth:`runtime.memory.db.Database.run_write`, the readers through
:meth:`~runtime.memory.db.Database.run`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

from sqlalchemy import Connection, bindparam, or_, update
from sqlalchemy import select as core_select
from sqlmodel import SQLModel, col, select

from runtime.delivery.ledger_steps import (
    FINAL,
    LEDGER_TABLE,
    UNCERTAIN_TABLE,
    FinalStatus,
    LedgerEntry,
    LedgerStatus,
    LostLeaseError,
    RowView,
    StepExtra,
    begin_step,
    finish,
    finish_step,
    record_uncertain,
    renew,
    skip_uncertain_step,
)
from runtime.delivery.owners import HOST_OWNER_PREFIX
from runtime.delivery.tables import DeliveryLedgerRow
from runtime.llm.types import now_ms
from runtime.memory.db import Database

__all__ = [
    "HOST_OWNER_PREFIX",
    "REPLY_WRITES_OVER_HTTP",
    "ClaimFields",
    "ClaimOutcome",
    "DeliveryLedgerRow",
    "FinalStatus",
    "LedgerEntry",
    "LedgerStatus",
    "LostLeaseError",
    "StepExtra",
    "begin_step",
    "claim",
    "claim_and_begin",
    "claim_fresh",
    "claim_queued",
    "create_ledger_table",
    "finish",
    "finish_step",
    "fresh",
    "get_entry",
    "record_uncertain",
    "release_dead_hosts",
    "release_owner",
    "renew",
    "resumable",
    "skip_uncertain_step",
]


REPLY_WRITES_OVER_HTTP = 2
"""Ledger write transactions of a queued one-step reply sent over HTTP (a turn's answer): step 0
marked on the wire as its request is written, which claims the row (:func:`claim_fresh`), and
step 0 done with the outbound transcript row (module docstring; docs/decisions.md#delivery-ledger).
A reply handed straight to a delivery actor writes one more, its claim. Pinned by
``tests/delivery/test_delivery_outbox.py`` and quoted by docs/architecture.md (checked by
``tests/docs``)."""


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """Result of a claim: ``state`` is ``claimed`` (you own it now), ``done`` (final already: do
    not send) or ``busy`` (a live owner holds the lease). ``begun`` is True when the claim also
    marked step 0 in flight (then do not call :func:`begin_step` for step 0). ``uncertain`` and
    ``resend`` are the reply's recorded uncertain steps: those left alone, and those an operator
    asked to send again (read only for a row that was worked on before)."""

    state: Literal["claimed", "done", "busy"]
    entry: LedgerEntry
    begun: bool = False
    uncertain: tuple[int, ...] = ()
    resend: tuple[int, ...] = ()


_ACTIVE_INDEX = next(i for i in LEDGER_TABLE.indexes if i.name == "ix_delivery_ledger_active")


def create_ledger_table(db: Database) -> None:
    """Create the memory and delivery tables if missing (never drops or alters;
    docs/decisions.md#memory-create-only), and the ledger's ``(status, session_key, created_at)``
    index on a ledger table made before it existed (an index only: no row or column changes).

    Runs in one writer transaction (SQLite: under the node-wide writer lock, ``BEGIN IMMEDIATE``),
    so several delivery actors starting at once on one SQLite file queue instead of failing with
    "database is locked" (a deferred transaction cannot be upgraded to a writer while another
    process writes).
    """
    from runtime.memory.tables import created_tables

    tables = [t.__table__ for t in created_tables()]  # type: ignore[attr-defined]
    with db.connection(write=True) as conn:
        SQLModel.metadata.create_all(conn, tables=tables, checkfirst=True)
        _ACTIVE_INDEX.create(conn, checkfirst=True)


_SELECT = core_select(LEDGER_TABLE).where(LEDGER_TABLE.c.reply_id == bindparam("r"))
_SELECT_FOR_UPDATE = _SELECT.with_for_update()
_SELECT_UNCERTAIN = (
    core_select(UNCERTAIN_TABLE.c.step, UNCERTAIN_TABLE.c.state)
    .where(UNCERTAIN_TABLE.c.reply_id == bindparam("r"))
    .order_by(UNCERTAIN_TABLE.c.step)
)
_TAKE_OVER = (
    update(LEDGER_TABLE)
    .where(LEDGER_TABLE.c.reply_id == bindparam("r"))
    .values(
        status="pending", owner=bindparam("o"), lease_until=bindparam("lease"), updated_at=bindparam("now")
    )
)
_TAKE_OVER_AND_BEGIN = _TAKE_OVER.values(in_flight=0, steps_total=bindparam("total"))
_CLAIM_FRESH_QUEUED = (
    _TAKE_OVER.where(LEDGER_TABLE.c.status == "queued")
    .where(LEDGER_TABLE.c.steps_done == 0)
    .where(LEDGER_TABLE.c.in_flight == -1)
    .where(LEDGER_TABLE.c.steps_total == -1)
    .returning(*LEDGER_TABLE.c)
)
"""A queued row nobody worked on yet, claimed in one statement (the outbox's common case)."""
_CLAIM_FRESH_QUEUED_AND_BEGIN = _CLAIM_FRESH_QUEUED.values(in_flight=0, steps_total=bindparam("total"))
_CLAIM_AS_READ = _CLAIM_FRESH_QUEUED.where(LEDGER_TABLE.c.created_at == bindparam("at"))
"""A queued row nobody worked on, still the one that was read: an operator's retry gives a row a new
``created_at`` (its place after the chat's unfinished rows), so a retried row is not taken for the
row read (or notified) before it."""
_CLAIM_AS_READ_AND_BEGIN = _CLAIM_AS_READ.values(in_flight=0, steps_total=bindparam("total"))

_INSERT: dict[str, Any] = {}
"""The fresh-row ``INSERT … ON CONFLICT DO NOTHING RETURNING`` per dialect (built once)."""


def _locked(conn: Connection, db: Database, reply_id: str) -> Any:
    # SQLite: the writer lock and BEGIN IMMEDIATE of a write transaction already serialize writers.
    return conn.execute(_SELECT if db.is_sqlite else _SELECT_FOR_UPDATE, {"r": reply_id}).first()


def _may_take_over(row: Any, owner: str, now: int) -> bool:
    if row.status == "queued" or row.owner == owner or row.lease_until <= now:
        return True
    partition, _, _ = owner.partition(":")
    if partition == HOST_OWNER_PREFIX:  # a session host (delivery-in-host) takes over no live owner's row
        return False
    return bool(row.owner.split(":", 1)[0] == partition)  # our own partition's dead previous incarnation


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
        ``claimed`` when ``owner`` may send now (fresh row, a queued one, own row, expired lease,
        or the dead previous incarnation of the same partition); ``done`` for a final row;
        ``busy`` when another live owner holds the lease.

    Raises:
        TypeError: a field of :class:`ClaimFields` is missing or an unknown one is given.
    """
    return _claim(db, fields, None)


def claim_and_begin(db: Database, *, steps_total: int, **fields: Unpack[ClaimFields]) -> ClaimOutcome:
    """:func:`claim`, and in the same transaction :func:`begin_step` of step 0 of ``steps_total``
    when the claimed row's next step is 0 and nothing is on the wire (a fresh row, or one whose
    owner died before its first send). Then ``begun`` is True and the caller sends step 0
    without another ledger write. A row with handled steps or a step on the wire (rule 2) is
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


def claim_queued(
    db: Database, reply_id: str, owner: str, lease_ms: int, steps_total: int | None = None
) -> ClaimOutcome | None:
    """Claim a row that exists (the outbox's ``queued`` rows, or one left ``pending`` by a dead
    owner) without trying an insert first; with ``steps_total`` (>= 1) also begin step 0 as
    :func:`claim_and_begin` does. A queued row nobody worked on is claimed in one ``UPDATE``.

    Returns:
        The outcome, or None when no row has ``reply_id``.
    """
    now = now_ms()
    params: dict[str, Any] = {"r": reply_id, "o": owner, "lease": now + lease_ms, "now": now}
    begin = steps_total is not None
    if begin:
        params["total"] = steps_total
    with db.connection(write=True) as conn:
        fresh = conn.execute(_CLAIM_FRESH_QUEUED_AND_BEGIN if begin else _CLAIM_FRESH_QUEUED, params).first()
        if fresh is not None:
            return ClaimOutcome("claimed", LedgerEntry.of(fresh), begun=begin)
        row = _locked(conn, db, reply_id)
        return None if row is None else _take(conn, row, owner, lease_ms, now, steps_total)


def fresh(entry: LedgerEntry) -> bool:
    """``entry`` is a ``queued`` row nobody worked on yet: no step marked, handled or rendered
    (the outbox's common case, which :func:`claim_fresh` claims)."""
    return (
        entry.status == "queued"
        and entry.steps_done == 0
        and entry.in_flight == -1
        and entry.steps_total == -1
    )


def claim_fresh(
    db: Database,
    reply_id: str,
    owner: str,
    lease_ms: int,
    created_at: int,
    steps_total: int | None = None,
) -> LedgerEntry:
    """Claim a :func:`fresh` ``queued`` row, still with the ``created_at`` (Unix ms) it was read (or
    notified) with, in one ``UPDATE``; with ``steps_total`` (>= 1) the same statement marks its
    step 0 of ``steps_total`` on the wire. That is the mark a sender writes as
    step 0's request is written (docs/decisions.md#delivery-outbox): until then the row stays
    ``queued``, so a sender that dies before it leaves nothing to take over, and whoever drains the
    chat next sends the reply. Without ``steps_total``: the claim of such a row before a wait for
    a retry or a close, when its step 0 failed before its mark. Returns the claimed row.

    Raises:
        LostLeaseError: the row is not that fresh ``queued`` one any more (someone claimed it
            since it was read; an operator's retry queued it again, in another place of the
            chat's order; it is gone): nothing was written, and the request must not be sent.
        ValueError: ``steps_total`` < 1.
    """
    if steps_total is not None and steps_total < 1:
        raise ValueError(f"claim_fresh needs at least one step, got steps_total={steps_total}")
    now = now_ms()
    params: dict[str, Any] = {
        "r": reply_id,
        "o": owner,
        "lease": now + lease_ms,
        "now": now,
        "at": created_at,
    }
    stmt = _CLAIM_AS_READ
    if steps_total is not None:
        params["total"], stmt = steps_total, _CLAIM_AS_READ_AND_BEGIN
    with db.connection(write=True) as conn:
        row = conn.execute(stmt, params).first()
    if row is None:
        raise LostLeaseError(f"delivery {reply_id!r} was claimed by another sender since it was read")
    return LedgerEntry.of(row)


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
            db.insert(LEDGER_TABLE)
            .on_conflict_do_nothing(index_elements=["reply_id"])
            .returning(LEDGER_TABLE.c.reply_id)
        )
    with db.connection(write=True) as conn:
        result = conn.execute(insert_stmt, fresh)
        # pysqlite reports no result columns when RETURNING yields no row (a conflict).
        if result.returns_rows and result.first() is not None:
            return ClaimOutcome("claimed", LedgerEntry.of(RowView(fresh)), begun=begin)
        row = _locked(conn, db, reply_id)
        if row is None:  # pragma: no cover - rows are never deleted
            raise RuntimeError(f"could not claim delivery {reply_id!r}")
        return _take(conn, row, owner, lease_ms, now, begin_total)


def _take(
    conn: Connection, row: Any, owner: str, lease_ms: int, now: int, begin_total: int | None
) -> ClaimOutcome:
    """The claim rules for an existing ``row`` (locked by the caller's transaction)."""
    if row.status in FINAL:
        return ClaimOutcome("done", LedgerEntry.of(row))
    if not _may_take_over(row, owner, now):
        return ClaimOutcome("busy", LedgerEntry.of(row))
    values: dict[str, Any] = {
        **row._asdict(),
        "status": "pending",
        "owner": owner,
        "lease_until": now + lease_ms,
        "updated_at": now,
    }
    params: dict[str, Any] = {"r": row.reply_id, "o": owner, "lease": now + lease_ms, "now": now}
    start = begin_total is not None and row.steps_done == 0 and row.in_flight == -1
    if start:
        values.update(in_flight=0, steps_total=begin_total)
        params["total"] = begin_total
    conn.execute(_TAKE_OVER_AND_BEGIN if start else _TAKE_OVER, params)
    uncertain: list[int] = []
    resend: list[int] = []
    if row.steps_total >= 0 or row.in_flight >= 0:  # worked on before: it may have uncertain steps
        for step, state in conn.execute(_SELECT_UNCERTAIN, {"r": row.reply_id}):
            if state == "resend":
                resend.append(int(step))
            elif state == "uncertain":
                uncertain.append(int(step))
    return ClaimOutcome(
        "claimed",
        LedgerEntry.of(RowView(values)),
        begun=start,
        uncertain=tuple(uncertain),
        resend=tuple(resend),
    )


def get_entry(db: Database, reply_id: str) -> LedgerEntry | None:
    """The reply's ledger row, or None."""
    with db.session() as s:
        row = s.exec(select(DeliveryLedgerRow).where(DeliveryLedgerRow.reply_id == reply_id)).first()
        return LedgerEntry.of(row) if row else None


def release_owner(
    db: Database,
    owner: str,
    *,
    partition: int | None = None,
    reply_id: str | None = None,
    to: str | None = None,
    lease_ms: int = 0,
) -> int:
    """Take the ``pending`` rows that ``owner`` holds from it now — those of ledger ``partition``,
    or the one row ``reply_id``; neither: all of them — because their owner is dead or stopping,
    or its send of that reply failed (a session host: docs/decisions.md#delivery-in-host).
    ``to``: the delivery actor that resumes them, which then holds them for ``lease_ms`` (so no
    other actor's sweep takes them first); None: their leases end, and whoever claims them next
    takes them. A step on the wire is recorded ``uncertain`` by the next owner's claim, as
    always. Returns the rows taken. One write transaction."""
    where = [col(DeliveryLedgerRow.owner) == owner]
    if partition is not None:
        where.append(col(DeliveryLedgerRow.partition) == partition)
    if reply_id is not None:
        where.append(col(DeliveryLedgerRow.reply_id) == reply_id)
    return _release(db, where, to, lease_ms)


def release_dead_hosts(db: Database, keep: str, *, partition: int, to: str, lease_ms: int) -> int:
    """:func:`release_owner` for every session host's ``pending`` rows of ledger ``partition``
    whose owner id does not start with ``keep`` (``runtime.delivery.owners.incarnation_prefix``
    of a host supervisor that starts: its previous incarnation's hosts died with it, as did an
    earlier Ray instance's; docs/decisions.md#delivery-in-host). Returns the rows taken. One write
    transaction."""
    owner = col(DeliveryLedgerRow.owner)
    where = [
        owner.startswith(f"{HOST_OWNER_PREFIX}:"),
        ~owner.startswith(keep),
        col(DeliveryLedgerRow.partition) == partition,
    ]
    return _release(db, where, to, lease_ms)


def _release(db: Database, where: list[Any], to: str | None, lease_ms: int) -> int:
    values: dict[str, Any] = {"lease_until": 0}
    if to is not None:
        values = {"owner": to, "lease_until": now_ms() + lease_ms}
    stmt = (
        update(DeliveryLedgerRow).where(col(DeliveryLedgerRow.status) == "pending", *where).values(**values)
    )
    with db.connection(write=True) as conn:
        return int(conn.execute(stmt).rowcount or 0)


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

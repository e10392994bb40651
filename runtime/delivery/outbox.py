"""The outbox side of the delivery ledger (docs/decisions.md#delivery-outbox): how a session's turn
records its reply without waiting for the platform, how delivery actors find the work, and the
operator's view and retry of replies that did not go out cleanly.

* :func:`queue_writer` — the ``queued`` row of a reply, written by the session host *inside* the
  transaction that appends the turn's ``im_reply`` record (``ContextRepository.append_messages(…,
  also=…)``): the reply and the record that the turn handed it over commit together, one write
  transaction as before the outbox. A crash-retried turn that finds its ``im_reply`` record hands
  nothing over again; a second insert of the same ``reply_id`` is a no-op (the id is the key).
  Its ``created_at`` is placed after the chat's unfinished rows (:func:`next_created_at`), so
  the chat's order is its hand-over order.
* :func:`chat_queue` — a chat's unfinished replies in ledger order (``created_at``, then
  ``reply_id``), which a delivery actor sends one after another (docs/decisions.md#delivery-outage);
  the actor reads them without a write and claims a fresh ``queued`` row with the mark of its
  first step on the wire (:func:`runtime.delivery.ledger.claim_fresh`).
* :func:`chats_to_resume` — the chats a delivery actor's sweep wakes: those with ``queued`` rows of
  its partition, and those with ``pending`` rows it may take over (ledger rule 3).
* :func:`list_replies`, :func:`retry`, :func:`counts` — ``GET /admin/deliveries``, ``POST
  /admin/deliveries/{reply_id}/retry`` and the backlog gauge.

Every function is blocking (run it through ``Database.run`` / ``run_write``); :func:`queue_writer`
returns a function run inside another transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, Select, and_, bindparam, func, or_, update
from sqlalchemy import select as core_select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from runtime.delivery.job import DeliveryJob
from runtime.delivery.ledger_steps import LEDGER_TABLE as T
from runtime.delivery.ledger_steps import UNCERTAIN_TABLE as U
from runtime.delivery.ledger_steps import LedgerEntry, RowView
from runtime.llm.types import now_ms
from runtime.memory.db import Database

__all__ = [
    "BACKLOG_STATES",
    "NotRetryableError",
    "QueuedRow",
    "ReplyRecord",
    "chat_queue",
    "chat_queue_select",
    "chats_to_resume",
    "counts",
    "list_replies",
    "next_created_at",
    "queue_writer",
    "queued_entry",
    "retry",
]

BACKLOG_STATES = ("queued", "pending", "failed", "uncertain")
"""The states the backlog gauge reports (``sent`` only grows and is not a backlog)."""
_UNFINISHED = ("queued", "pending")


class NotRetryableError(ValueError):
    """:func:`retry` of a reply that is neither ``failed`` nor ``uncertain`` (answered 409)."""


_LATEST_UNFINISHED = core_select(func.max(T.c.created_at)).where(
    T.c.status.in_(_UNFINISHED), T.c.session_key == bindparam("k")
)
"""The ``created_at`` of a chat's latest unfinished row; built once, as every statement of a hand-over
(docs/decisions.md#memory-write-path)."""
_QUEUE_INSERT = {
    "postgresql": pg_insert(T).on_conflict_do_nothing(index_elements=["reply_id"]).returning(T.c.reply_id),
    "sqlite": sqlite_insert(T).on_conflict_do_nothing(index_elements=["reply_id"]).returning(T.c.reply_id),
}
"""A reply's ``queued`` row, by dialect (a second insert of the same ``reply_id`` is a no-op; it
returns the ``reply_id`` of a row it inserted, nothing otherwise)."""


def next_created_at(conn: Connection, session_key: str, at_least: int) -> int:
    """The ``created_at`` of a row joining ``session_key``'s unfinished rows (``queued``,
    ``pending``): ``at_least`` (Unix ms), or 1 ms after the latest of them when that is not
    earlier. Run inside the write transaction that writes the row: the chat's order
    (``created_at``, then ``reply_id``) is then the order the rows were written in, even when two
    hand-overs share a millisecond or a host's clock is behind the previous one's
    (docs/decisions.md#delivery-outbox)."""
    return _placed(_latest_unfinished(conn, session_key), at_least)


def _latest_unfinished(conn: Connection, session_key: str) -> int | None:
    """The ``created_at`` of ``session_key``'s latest unfinished row, or None when it has none."""
    latest = conn.execute(_LATEST_UNFINISHED, {"k": session_key}).scalar()
    return None if latest is None else int(latest)


def _placed(latest: int | None, at_least: int) -> int:
    """``at_least``, or 1 ms after ``latest`` (the chat's latest unfinished row's ``created_at``)."""
    return at_least if latest is None else max(at_least, int(latest) + 1)


class QueuedRow:
    """The insert of a reply's ``queued`` row, run by :meth:`__call__` inside the caller's write
    transaction (:func:`queue_writer`); :attr:`head_at` says afterwards whether the row is its
    chat's head."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values
        self.head_at: int | None = None
        """After the write: the row's ``created_at`` (Unix ms) when no other row of the chat was
        unfinished as it was written (the delivery actor may send it without reading the chat's
        queue: docs/decisions.md#delivery-outbox), else None. Set by each run of the write, so a
        re-run transaction leaves what the committed one found."""

    def __call__(self, conn: Connection) -> None:
        insert = _QUEUE_INSERT["postgresql" if conn.dialect.name == "postgresql" else "sqlite"]
        session_key, created_at = self._values["session_key"], self._values["created_at"]
        latest = _latest_unfinished(conn, session_key)
        at = _placed(latest, created_at)
        result = conn.execute(insert, {**self._values, "created_at": at})
        # pysqlite reports no result columns when RETURNING yields no row (a conflict)
        inserted = result.returns_rows and result.first() is not None
        self.head_at = at if latest is None and inserted else None


def queue_writer(job: DeliveryJob, partition: int, created_at: int) -> QueuedRow:
    """The insert of ``job``'s ``queued`` row, to run inside the caller's write transaction.

    Args:
        job: The reply (its ``reply_id`` is the row's key).
        partition: ``crc32(session_key) % runtime.delivery_actors``: the delivery actor whose
            sweep finds the row.
        created_at: Unix ms, the hand-over time: the row's age. The row gets it, or 1 ms after
            the chat's latest unfinished row (:func:`next_created_at`): its place in the chat's
            order comes after every reply of the chat handed over before it.

    Returns:
        ``write(conn)``: inserts the row, or nothing when the ``reply_id`` is already there; its
        :attr:`QueuedRow.head_at` tells afterwards whether the row is the chat's head.
    """
    return QueuedRow(_queued_values(job, partition, created_at, job.model_dump_json()))


def queued_entry(job: DeliveryJob, partition: int, created_at: int) -> LedgerEntry:
    """The ledger entry of ``job``'s ``queued`` row as :func:`queue_writer` writes it, with
    ``created_at`` (Unix ms) as the hand-over found it: what a delivery actor notified with the
    job as its chat's head knows of the row without reading it. Its ``job_json`` is left empty:
    the caller holds the job."""
    return LedgerEntry.of(RowView(_queued_values(job, partition, created_at, "")))


def _queued_values(job: DeliveryJob, partition: int, created_at: int, job_json: str) -> dict[str, Any]:
    """The columns of ``job``'s fresh ``queued`` row: no owner, nothing rendered, marked or done."""
    return {
        "reply_id": job.reply_id,
        "session_key": job.session_key,
        "platform": job.platform,
        "bot_id": job.bot_id,
        "partition": partition,
        "job_json": job_json,
        "status": "queued",
        "owner": "",
        "lease_until": 0,
        "steps_total": -1,
        "steps_done": 0,
        "in_flight": -1,
        "message_ids": "[]",
        "error": None,
        "created_at": created_at,
        "updated_at": created_at,
    }


@functools.lru_cache(maxsize=8)
def chat_queue_select(limit: int = 50) -> Select[Any]:
    """The ``SELECT`` of :func:`chat_queue`: a chat's unfinished rows in ledger order, at most
    ``limit``, the session key bound as ``k``; built once per limit, as every statement of a
    delivery's path (docs/decisions.md#memory-write-path)."""
    return (
        core_select(T)
        .where(T.c.status.in_(_UNFINISHED), T.c.session_key == bindparam("k"))
        .order_by(T.c.created_at, T.c.reply_id)
        .limit(limit)
    )


def chat_queue(db: Database, session_key: str, limit: int = 50) -> list[LedgerEntry]:
    """The ``queued`` and ``pending`` replies of ``session_key``, oldest first (ledger order): the
    queue as it stands, read without claiming anything."""
    with db.connection() as conn:
        return [LedgerEntry.of(r) for r in conn.execute(chat_queue_select(limit), {"k": session_key})]


def chats_to_resume(db: Database, partition: int, owner: str, limit: int = 1000) -> list[str]:
    """Session keys with work for the actor ``owner`` of ``partition``, oldest first: ``queued``
    and ``pending`` rows of its partition (a ``pending`` one is held by its dead previous
    incarnation, or by ``owner`` itself: in a running chain, which a wake-up only queues behind,
    or left by an error), and ``pending`` rows of any partition whose lease expired."""
    now = now_ms()
    mine = T.c.partition == partition
    wanted = or_(
        and_(T.c.status.in_(_UNFINISHED), mine),
        and_(T.c.status == "pending", T.c.owner != owner, T.c.lease_until <= now),
    )
    stmt = (
        core_select(T.c.session_key, func.min(T.c.created_at).label("first"))
        .where(wanted)
        .group_by(T.c.session_key)
        .order_by("first")
        .limit(limit)
    )
    with db.connection() as conn:
        return [str(r.session_key) for r in conn.execute(stmt)]


def counts(db: Database, partition: int | None = None) -> dict[str, int]:
    """Replies per state of :data:`BACKLOG_STATES` (of one partition, or all); 0 for a state
    without rows."""
    stmt = core_select(T.c.status, func.count()).where(T.c.status.in_(BACKLOG_STATES)).group_by(T.c.status)
    if partition is not None:
        stmt = stmt.where(T.c.partition == partition)
    with db.connection() as conn:
        found = {str(s): int(n) for s, n in conn.execute(stmt)}
    return {state: found.get(state, 0) for state in BACKLOG_STATES}


@dataclass(frozen=True, slots=True)
class ReplyRecord:
    """One reply as the admin API shows it (times in Unix ms, ``age_s`` in seconds)."""

    reply_id: str
    session_key: str
    platform: str
    bot_id: str
    state: str
    error: str | None
    steps: dict[str, Any]
    """``{"total": int (-1: never rendered), "done": int, "uncertain": [step, ...]}`` — the
    uncertain steps not resent yet."""
    created_at: int
    updated_at: int
    age_s: float


def list_replies(
    db: Database, states: Sequence[str], *, limit: int = 50, offset: int = 0
) -> list[ReplyRecord]:
    """Replies in ``states``, newest first (``created_at``, then ``reply_id``, descending), from
    ``offset`` on, at most ``limit``."""
    stmt = (
        core_select(T)
        .where(T.c.status.in_(list(states)))
        .order_by(T.c.created_at.desc(), T.c.reply_id.desc())
        .limit(limit)
        .offset(offset)
    )
    now = now_ms()
    with db.connection() as conn:
        rows = list(conn.execute(stmt))
        ids = [r.reply_id for r in rows]
        open_steps: dict[str, list[int]] = {}
        if ids:
            query = core_select(U.c.reply_id, U.c.step).where(
                U.c.reply_id.in_(ids), U.c.state.in_(("uncertain", "resend"))
            )
            for reply_id, step in conn.execute(query.order_by(U.c.reply_id, U.c.step)):
                open_steps.setdefault(str(reply_id), []).append(int(step))
    return [
        ReplyRecord(
            reply_id=r.reply_id,
            session_key=r.session_key,
            platform=r.platform,
            bot_id=r.bot_id,
            state=r.status,
            error=r.error,
            steps={"total": r.steps_total, "done": r.steps_done, "uncertain": open_steps.get(r.reply_id, [])},
            created_at=r.created_at,
            updated_at=r.updated_at,
            age_s=round(max(0, now - r.created_at) / 1000, 3),
        )
        for r in rows
    ]


_REQUEUE = (
    update(T)
    .values(status="queued", owner="", lease_until=0, in_flight=-1, error=None)
    .returning(T.c.session_key, T.c.partition)
)


def retry(db: Database, reply_id: str) -> tuple[Literal["failed", "uncertain"], str, int]:
    """Queue a ``failed`` or ``uncertain`` reply again, an operator's decision
    (docs/decisions.md#delivery-uncertain): it gets a fresh age (``created_at`` = now, or 1 ms
    after the chat's latest unfinished reply if that is later: :func:`next_created_at`), which
    puts it after the chat's other unfinished replies. A failed reply goes on from the step that
    failed; an uncertain one sends only its uncertain steps again (their rows become ``resend``).

    Returns:
        ``(state it had, session_key, partition)``.

    Raises:
        LookupError: no reply has ``reply_id``.
        NotRetryableError: the reply is ``queued``, ``pending`` or ``sent``.
    """
    now = now_ms()
    with db.connection(write=True) as conn:
        query = core_select(T.c.status, T.c.session_key).where(T.c.reply_id == reply_id)
        row = conn.execute(query).first()
        if row is None:
            raise LookupError(f"no delivery {reply_id!r}")
        state = str(row.status)
        if state not in ("failed", "uncertain"):
            raise NotRetryableError(
                f"delivery {reply_id!r} is {state}: only failed or uncertain ones are retried"
            )
        at = next_created_at(conn, str(row.session_key), now)
        stmt = _REQUEUE.where(T.c.reply_id == reply_id, T.c.status == state)
        done = conn.execute(stmt.values(created_at=at, updated_at=now)).first()
        if done is None:  # PostgreSQL: a delivery actor changed it since the read above
            raise NotRetryableError(f"delivery {reply_id!r} changed meanwhile; look again")
        if state == "uncertain":
            conn.execute(
                update(U)
                .where(U.c.reply_id == reply_id, U.c.state == "uncertain")
                .values(state="resend", updated_at=now)
            )
        return state, str(done.session_key), int(done.partition)  # type: ignore[return-value]

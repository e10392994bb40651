"""The durable inbox: one SQL row per triggered inbound message, written before the webhook
answers (docs/decisions.md#inbox-durable).

A row holds the whole message (``message_json``: enough to route it again exactly), its
``session_key`` and that key's :func:`runtime.keys.key_hash` (a router shard selects its own keys
with ``key_hash % shards = shard``), and its ``state``:

* ``stored`` — written; no host has taken it yet (or the mark saying so is still on its way);
* ``routed`` — a session host accepted it (its turn may have started);
* ``handled`` — its ``TurnResult`` came back (the reply is in the delivery ledger, or the turn
  ended without one), or a host answered that it already had it;
* ``expired`` — older than ``runtime.replay_window_s`` and never handled: not replayed;
* ``failed`` — the recovery loop gave up after :data:`MAX_ATTEMPTS` re-submissions.

``UNIQUE (platform, bot_id, message_id)`` is the inbound dedup: a second insert of one message is
a conflict (the webhook answers ``duplicate``). ``attempts`` counts the recovery loop's
re-submissions a host accepted; ``received_at`` / ``updated_at`` are Unix ms. ``id`` is the inbox
order (one key's rows are replayed in ``id`` order).

Writes are SQLAlchemy Core statements built once (docs/decisions.md#memory-write-path), each a
whole transaction a caller may re-run on a transient error: :meth:`InboxStore.store` (the row and,
in the same transaction, the message's transcript row), :func:`mark` (batched state changes,
idempotent: a state only moves forward), :func:`expire`, :func:`note_attempt` (and
:func:`note_attempts`), :func:`fail`, :func:`prune`. Readers: :func:`pending`, :func:`backlog`,
:func:`pending_keys`, :func:`get_row`.
The table is created, if missing, by :func:`create_inbox_table` (never altered:
docs/decisions.md#memory-create-only). Every function here but :meth:`InboxStore.store` is
blocking: run writers through :meth:`runtime.memory.db.Database.run_write`, readers through
:meth:`~runtime.memory.db.Database.run`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    Table,
    Text,
    UniqueConstraint,
    bindparam,
    delete,
    or_,
    update,
)
from sqlalchemy import func as sql_func
from sqlalchemy import select as core_select
from sqlmodel import Field, SQLModel

from runtime.keys import key_hash
from runtime.llm.types import now_ms
from runtime.memory.db import Database
from runtime.memory.transcripts import PreparedInsert, no_nul

__all__ = [
    "EARLIER_LIMIT",
    "MAX_ATTEMPTS",
    "OPEN_STATES",
    "InboxEntry",
    "InboxRow",
    "InboxState",
    "InboxStore",
    "MessageRef",
    "StoreResult",
    "backlog",
    "create_inbox_table",
    "expire",
    "fail",
    "get_row",
    "mark",
    "message_ref",
    "note_attempt",
    "note_attempts",
    "pending",
    "pending_keys",
    "prune",
]

InboxState = Literal["stored", "routed", "handled", "expired", "failed"]
OPEN_STATES: tuple[str, str] = ("stored", "routed")
"""States of a row that still waits for its turn's result."""
MAX_ATTEMPTS = 3
"""Re-submissions by the recovery loop that a host accepted, after which an unhandled row is
``failed`` instead of sent once more (a message whose turn kills its host every time)."""

EARLIER_LIMIT = 200
"""Earlier open rows of a key :meth:`InboxStore.store` returns at most (``check_order``)."""

MessageRef = tuple[str, str, str]
"""``(platform, bot_id, message_id)`` as stored (NUL replaced): the unique key of a row."""


class InboxRow(SQLModel, table=True):
    """One triggered inbound message on its way to a turn (see the module docstring)."""

    __tablename__ = "inbox"
    __table_args__ = (
        UniqueConstraint("platform", "bot_id", "message_id", name="uq_inbox_message"),
        Index("ix_inbox_state_id", "state", "id"),
        Index("ix_inbox_key_id", "session_key", "id"),
    )

    id: int | None = Field(
        default=None, sa_column=Column(BigInteger().with_variant(Integer(), "sqlite"), primary_key=True)
    )
    """The inbox order (autoincrement; SQLite's rowid)."""
    platform: str = Field(sa_column=Column(Text, nullable=False))
    bot_id: str = Field(sa_column=Column(Text, nullable=False))
    message_id: str = Field(sa_column=Column(Text, nullable=False))
    session_key: str = Field(sa_column=Column(Text, nullable=False))
    key_hash: int = Field(sa_column=Column(BigInteger, nullable=False))
    """:func:`runtime.keys.key_hash` of ``session_key`` (its router shard is ``key_hash % N``)."""
    message_json: str = Field(sa_column=Column(Text, nullable=False))
    """The whole ``InboundMessage`` as JSON."""
    state: str = Field(sa_column=Column(Text, nullable=False))
    """``stored`` | ``routed`` | ``handled`` | ``expired`` | ``failed``."""
    attempts: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    received_at: int = Field(sa_column=Column(BigInteger, nullable=False))
    """When the ingress stored it, Unix ms."""
    updated_at: int = Field(sa_column=Column(BigInteger, nullable=False))
    """Last state change, Unix ms."""


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """A copy of one row (times in Unix ms)."""

    id: int
    platform: str
    bot_id: str
    message_id: str
    session_key: str
    message_json: str
    state: str
    attempts: int
    received_at: int
    updated_at: int


@dataclass(frozen=True, slots=True)
class StoreResult:
    """What :meth:`InboxStore.store` did: ``stored`` False — the message was already in the inbox
    (nothing written); ``row_id`` — the new row's id; ``earlier`` — only when asked: the earlier
    rows of the same session key that are still ``stored`` or ``routed``, in inbox order (at most
    :data:`EARLIER_LIMIT`; ``more`` — there were more)."""

    stored: bool
    row_id: int | None = None
    earlier: tuple[InboxEntry, ...] = ()
    more: bool = False


def create_inbox_table(db: Database) -> None:
    """Create ``inbox`` if it is missing (never drops or alters: docs/decisions.md#memory-create-only).
    Blocking; one writer transaction (SQLite: under the node-wide writer lock), so processes that
    start at once on one file queue instead of failing."""
    with db.connection(write=True) as conn:
        SQLModel.metadata.create_all(conn, tables=[_T], checkfirst=True)


def message_ref(platform: str, bot_id: str, message_id: str) -> MessageRef:
    """The stored form of a message's unique key (NUL replaced as :func:`no_nul` does)."""
    return no_nul(platform), no_nul(bot_id), no_nul(str(message_id))


_T: Table = InboxRow.__table__  # type: ignore[attr-defined]
_BY_REF = (
    (_T.c.platform == bindparam("p")) & (_T.c.bot_id == bindparam("b")) & (_T.c.message_id == bindparam("m"))
)
_MINE = (_T.c.key_hash % bindparam("shards")) == bindparam("shard")
_OPEN = or_(*(_T.c.state == state for state in OPEN_STATES))  # plain binds: executemany-safe
_EARLIER_OPEN = (
    core_select(_T)
    .where(_T.c.session_key == bindparam("k"), _T.c.id < bindparam("id"), _OPEN)
    .order_by(_T.c.id)
    .limit(bindparam("limit"))
)
_MARK_ROUTED = (
    update(_T).where(_BY_REF, _T.c.state == "stored").values(state="routed", updated_at=bindparam("now"))
)
_MARK_HANDLED = update(_T).where(_BY_REF, _OPEN).values(state="handled", updated_at=bindparam("now"))
_NOTE_ATTEMPT = (
    update(_T)
    .where(_T.c.id == bindparam("i"), _OPEN)
    .values(state="routed", attempts=_T.c.attempts + 1, updated_at=bindparam("now"))
)
_FAIL = update(_T).where(_T.c.id == bindparam("i"), _OPEN).values(state="failed", updated_at=bindparam("now"))
_EXPIRE = (
    update(_T)
    .where(_OPEN, _MINE, _T.c.received_at < bindparam("cutoff"))
    .values(state="expired", updated_at=bindparam("now"))
    .returning(_T.c.id, _T.c.session_key, _T.c.platform, _T.c.bot_id, _T.c.message_id, _T.c.state)
)
_PENDING = (
    core_select(_T)
    .where(_OPEN, _MINE, _T.c.received_at <= bindparam("before"), _T.c.received_at >= bindparam("after"))
    .order_by(_T.c.id)
    .limit(bindparam("limit"))
)
_BACKLOG = core_select(sql_func.count()).select_from(_T).where(_OPEN, _MINE)
_PENDING_KEYS = core_select(_T.c.session_key).where(_OPEN, _T.c.received_at >= bindparam("after")).distinct()
_PRUNE_IDS = (
    core_select(_T.c.id).where(~_OPEN, _T.c.updated_at < bindparam("before")).limit(bindparam("limit"))
)
_PRUNE = delete(_T).where(_T.c.id.in_(_PRUNE_IDS.scalar_subquery()))
_GET = core_select(_T).where(_BY_REF)


class InboxStore:
    """Writes new rows (the statement built once per store and dialect).

    Args:
        db: The :class:`Database` (``inbox`` created: :func:`create_inbox_table`).
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        unique = ["platform", "bot_id", "message_id"]
        self._insert = db.insert(_T).on_conflict_do_nothing(index_elements=unique).returning(_T.c.id)

    async def store(
        self,
        *,
        platform: str,
        bot_id: str,
        message_id: str,
        session_key: str,
        message_json: str,
        with_rows: Sequence[PreparedInsert] = (),
        check_order: bool = False,
    ) -> StoreResult:
        """Insert the message's row (state ``stored``) and, in the same transaction, ``with_rows``
        (its inbound transcript row); one write transaction, retried on a transient error.

        Args:
            platform / bot_id / message_id: The unique key.
            session_key: The message's session key.
            message_json: The whole message as JSON.
            with_rows: Rows written only when the inbox row is new (each ``ON CONFLICT DO NOTHING``).
            check_order: Also read the earlier rows of ``session_key`` that are still open
                (:attr:`StoreResult.earlier`), in the same transaction.

        Raises:
            sqlalchemy.exc.OperationalError: the database stayed unavailable (locked, down) for
                the database's ``write_retry_s``.
        """
        now = now_ms()
        ref = message_ref(platform, bot_id, message_id)
        values = {
            **dict(zip(("platform", "bot_id", "message_id"), ref, strict=True)),
            "session_key": session_key,
            "key_hash": key_hash(session_key),
            "message_json": message_json,
            "state": "stored",
            "attempts": 0,
            "received_at": now,
            "updated_at": now,
        }
        insert = self._insert

        def work() -> StoreResult:
            with self.db.connection(write=True) as conn:
                result = conn.execute(insert, values)
                # pysqlite reports no result columns when RETURNING yields no row (a conflict).
                first = result.first() if result.returns_rows else None
                if first is None:
                    return StoreResult(stored=False)
                row_id = int(first[0])
                for row in with_rows:
                    row.execute(conn)
                if not check_order:
                    return StoreResult(stored=True, row_id=row_id)
                params = {"k": session_key, "id": row_id, "limit": EARLIER_LIMIT + 1}
                earlier = [_entry(r) for r in conn.execute(_EARLIER_OPEN, params).all()]
                return StoreResult(
                    stored=True,
                    row_id=row_id,
                    earlier=tuple(earlier[:EARLIER_LIMIT]),
                    more=len(earlier) > EARLIER_LIMIT,
                )

        return await self.db.run_write(work, inline=True)  # docs/decisions.md#memory-sql-off-loop


def _entry(row: Any) -> InboxEntry:
    return InboxEntry(
        id=int(row.id),
        platform=row.platform,
        bot_id=row.bot_id,
        message_id=row.message_id,
        session_key=row.session_key,
        message_json=row.message_json,
        state=row.state,
        attempts=int(row.attempts),
        received_at=int(row.received_at),
        updated_at=int(row.updated_at),
    )


def mark(db: Database, routed: Iterable[MessageRef], handled: Iterable[MessageRef]) -> None:
    """Move rows forward in one transaction: ``stored`` → ``routed`` for ``routed``, then
    ``stored``/``routed`` → ``handled`` for ``handled``. Idempotent (a row in a later state is
    left as it is; an unknown ref changes nothing)."""
    now = now_ms()
    up = [{"p": p, "b": b, "m": m, "now": now} for p, b, m in routed]
    done = [{"p": p, "b": b, "m": m, "now": now} for p, b, m in handled]
    if not up and not done:
        return
    with db.connection(write=True) as conn:
        if up:
            conn.execute(_MARK_ROUTED, up)
        if done:
            conn.execute(_MARK_HANDLED, done)


def note_attempt(db: Database, row_id: int) -> bool:
    """A host accepted row ``row_id`` from the recovery loop: ``attempts`` + 1 and state ``routed``
    (when it was still open). Returns whether the row was open."""
    with db.connection(write=True) as conn:
        return bool(conn.execute(_NOTE_ATTEMPT, {"i": row_id, "now": now_ms()}).rowcount)


def note_attempts(db: Database, row_ids: Sequence[int]) -> None:
    """:func:`note_attempt` for every row of ``row_ids``, in one transaction."""
    if row_ids:
        now = now_ms()
        with db.connection(write=True) as conn:
            conn.execute(_NOTE_ATTEMPT, [{"i": i, "now": now} for i in row_ids])


def fail(db: Database, row_id: int) -> bool:
    """Give row ``row_id`` up (state ``failed``) when it is still open; returns whether it was."""
    with db.connection(write=True) as conn:
        return bool(conn.execute(_FAIL, {"i": row_id, "now": now_ms()}).rowcount)


def expire(db: Database, shard: int, shards: int, cutoff_ms: int) -> list[InboxEntry]:
    """Mark every open row of the shard's keys received before ``cutoff_ms`` (Unix ms) ``expired``;
    returns them (``state`` as it is now: ``expired``, ``message_json`` empty)."""
    params = {"shard": shard, "shards": shards, "cutoff": cutoff_ms, "now": now_ms()}
    with db.connection(write=True) as conn:
        rows = conn.execute(_EXPIRE, params).all()
    return [
        InboxEntry(int(r.id), r.platform, r.bot_id, r.message_id, r.session_key, "", r.state, 0, 0, 0)
        for r in rows
    ]


def pending(
    db: Database, shard: int, shards: int, *, before_ms: int, after_ms: int, limit: int = 500
) -> list[InboxEntry]:
    """Open rows of the shard's keys received in ``[after_ms, before_ms]`` (Unix ms), in inbox
    order, at most ``limit``."""
    params = {"shard": shard, "shards": shards, "before": before_ms, "after": after_ms, "limit": limit}
    with db.connection() as conn:
        return [_entry(r) for r in conn.execute(_PENDING, params).all()]


def backlog(db: Database, shard: int, shards: int) -> int:
    """How many rows of the shard's keys are open (``stored`` or ``routed``)."""
    with db.connection() as conn:
        return int(conn.execute(_BACKLOG, {"shard": shard, "shards": shards}).scalar_one())


def pending_keys(db: Database, after_ms: int) -> set[str]:
    """Session keys with an open row received at or after ``after_ms`` (Unix ms)."""
    with db.connection() as conn:
        return {str(k) for k in conn.execute(_PENDING_KEYS, {"after": after_ms}).scalars()}


def prune(db: Database, before_ms: int, limit: int = 1000) -> int:
    """Delete at most ``limit`` closed rows (``handled``/``expired``/``failed``) last changed
    before ``before_ms`` (Unix ms); returns how many. Open rows are never deleted."""
    with db.connection(write=True) as conn:
        return int(conn.execute(_PRUNE, {"before": before_ms, "limit": limit}).rowcount)


def get_row(db: Database, platform: str, bot_id: str, message_id: str) -> InboxEntry | None:
    """The row of one message, or None."""
    p, b, m = message_ref(platform, bot_id, message_id)
    with db.connection() as conn:
        row = conn.execute(_GET, {"p": p, "b": b, "m": m}).first()
    return _entry(row) if row is not None else None

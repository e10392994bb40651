"""The blocking SQL of session epochs and context reads, as SQLAlchemy Core statements built once
(:class:`runtime.memory.repository.ContextRepository` runs them on the SQL thread pool; the rules
are in its module docstring).

An activation (docs/decisions.md#session-lifecycle) is one of these per session: read the active
epoch and its context in one read transaction (:func:`read_active`), or — for a chat seen for the
first time — create epoch 1 in one write transaction (:func:`get_or_create`). Core rather than
the ORM: at the live-session cap every message may need an activation, and the ORM's unit of work
cost more CPU than the statements themselves (docs/decisions.md#memory-write-path).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import Connection, Table, bindparam, insert, select, text

from runtime.keys import make_session_id, parse_session_id, parse_session_key
from runtime.llm.types import AgentMessage, CustomMessage, now_ms
from runtime.memory.tables import AgentMessageRow, AgentSessionRow, AgentSummaryRow
from runtime.reply.sender import SUMMARY_CUSTOM_TYPE

__all__ = [
    "CorruptMessageError",
    "StoredMessage",
    "active_id",
    "get_or_create",
    "lock_key",
    "read_active",
    "read_context",
    "select_messages",
    "start_epoch",
    "summary_message",
]

MESSAGE = TypeAdapter(AgentMessage)
"""Parses one stored ``agent_messages.payload``."""

_SESSIONS: Table = AgentSessionRow.__table__  # type: ignore[attr-defined]
_MESSAGES: Table = AgentMessageRow.__table__  # type: ignore[attr-defined]
_SUMMARIES: Table = AgentSummaryRow.__table__  # type: ignore[attr-defined]

_ACTIVE_ID = select(_SESSIONS.c.session_id).where(
    _SESSIONS.c.session_key == bindparam("key"), _SESSIONS.c.status == "active"
)
_KEY_IDS = select(_SESSIONS.c.session_id).where(_SESSIONS.c.session_key == bindparam("key"))
_INSERT_SESSION = insert(_SESSIONS)
_LAST_SUMMARY = (
    select(_SUMMARIES.c.summary, _SUMMARIES.c.anchor_message_id, _SUMMARIES.c.created_at)
    .where(_SUMMARIES.c.session_id == bindparam("sid"))
    .order_by(_SUMMARIES.c.id.desc())
    .limit(1)
)
_ROWS = select(_MESSAGES.c.id, _MESSAGES.c.payload).where(_MESSAGES.c.session_id == bindparam("sid"))
_ALL_ROWS = _ROWS.order_by(_MESSAGES.c.id)
_ROWS_AFTER = _ROWS.where(_MESSAGES.c.id > bindparam("after")).order_by(_MESSAGES.c.id)
_PG_KEY_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))")


class CorruptMessageError(ValueError):
    """A stored ``agent_messages`` payload does not parse as an agent message (edited by hand,
    or written by an incompatible version); the message names the row id and the session."""


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One ``agent_messages`` row, decoded: its row ``id`` and the message."""

    id: int
    message: AgentMessage


def summary_message(summary: str, anchor_message_id: int | None, timestamp: int) -> CustomMessage:
    """The :class:`CustomMessage` that stands for a compaction summary in a context.

    ``data = {"summary": str, "anchor_message_id": int | None}``.
    """
    return CustomMessage(
        custom_type=SUMMARY_CUSTOM_TYPE,
        data={"summary": summary, "anchor_message_id": anchor_message_id},
        timestamp=timestamp,
    )


def active_id(conn: Connection, session_key: str) -> str | None:
    """The ``session_id`` of the active epoch of ``session_key``, or ``None``."""
    return conn.execute(_ACTIVE_ID, {"key": session_key}).scalar()


def lock_key(conn: Connection, session_key: str) -> None:
    """PostgreSQL: serialize epoch changes of one key across processes for this transaction
    (``pg_advisory_xact_lock``); SQLite's ``BEGIN IMMEDIATE`` already serializes writers."""
    if conn.dialect.name != "sqlite":
        conn.execute(_PG_KEY_LOCK, {"k": f"sessionray:{session_key}"})


def start_epoch(conn: Connection, session_key: str, model: str) -> str:
    """Insert the next epoch of ``session_key`` (highest stored + 1) as ``active``; returns its
    ``session_id``. Call inside a write transaction that holds :func:`lock_key`.

    Raises:
        sqlalchemy.exc.IntegrityError: another writer created it first (retry the transaction).
    """
    ids = conn.execute(_KEY_IDS, {"key": session_key}).scalars().all()
    epoch = max((parse_session_id(i).epoch for i in ids), default=0) + 1
    session_id = make_session_id(session_key, epoch)
    key = parse_session_key(session_key)
    now = now_ms()
    conn.execute(
        _INSERT_SESSION,
        {
            "session_id": session_id,
            "session_key": session_key,
            "platform": key.platform,
            "bot_id": key.bot_id,
            "scene_id": key.scene_id,
            "scene_type": key.scope,
            "model": model,
            "status": "active",
            "created_at": now,
            "updated_at": now,
        },
    )
    return session_id


def get_or_create(conn: Connection, session_key: str, model: str) -> tuple[str, bool]:
    """In a write transaction: ``(session_id, created)`` — the active epoch of ``session_key``,
    created when there is none (``created`` false: another writer made it first, its context may
    hold messages)."""
    lock_key(conn, session_key)
    found = active_id(conn, session_key)
    return (found, False) if found is not None else (start_epoch(conn, session_key, model), True)


def select_messages(conn: Connection, session_id: str, after_id: int | None) -> list[StoredMessage]:
    """The epoch's message rows with ``id > after_id`` (all when ``None``), in append order.

    Raises:
        CorruptMessageError: a stored row does not parse (its id is named).
    """
    if after_id is None:
        rows = conn.execute(_ALL_ROWS, {"sid": session_id}).all()
    else:
        rows = conn.execute(_ROWS_AFTER, {"sid": session_id, "after": after_id}).all()
    out: list[StoredMessage] = []
    for i, p in rows:
        try:
            out.append(StoredMessage(int(i or 0), MESSAGE.validate_json(p)))
        except ValidationError as exc:
            raise CorruptMessageError(
                f"agent_messages row {i} of {session_id!r} is not a valid message "
                f"({exc.error_count()} error(s); first: {exc.errors()[0]['msg']}); the row is left as it is"
            ) from exc
    return out


def read_context(conn: Connection, session_id: str) -> tuple[CustomMessage | None, list[StoredMessage]]:
    """The epoch's latest summary (as :func:`summary_message`) and the rows after its anchor (all
    rows without a summary), read on ``conn`` (one snapshot).

    Raises:
        CorruptMessageError: a stored row does not parse.
    """
    row = conn.execute(_LAST_SUMMARY, {"sid": session_id}).first()
    if row is None:
        return None, select_messages(conn, session_id, None)
    summary = summary_message(row.summary, row.anchor_message_id, row.created_at)
    return summary, select_messages(conn, session_id, row.anchor_message_id)


def read_active(
    conn: Connection, session_key: str
) -> tuple[str, CustomMessage | None, list[StoredMessage]] | None:
    """The active epoch of ``session_key`` with its context (:func:`read_context`), or ``None``
    when the key has no active epoch.

    Raises:
        CorruptMessageError: a stored row does not parse.
    """
    sid = active_id(conn, session_key)
    if sid is None:
        return None
    return (sid, *read_context(conn, sid))

"""The memory tables, as sqlmodel classes (docs/decisions.md#memory-tables).

* ``im_transcripts`` — what was said in a scene (audit and ``chat_history`` search). One row per
  platform message and direction; ``UNIQUE (platform, bot_id, message_id, direction)`` makes a
  redelivered webhook a no-op. ``body`` is plain text only; ``media_json`` is the segments JSON.
* ``agent_sessions`` — one row per epoch of a session: ``session_id`` = ``{session_key}#{epoch}``;
  at most one ``active`` row per ``session_key`` (a partial unique index).
* ``agent_messages`` — the agent's messages of one epoch; ``payload`` is the whole message JSON
  (``AgentMessage.model_dump_json()``), ``role`` is ``user | assistant | toolResult | custom``;
  index ``(session_id, timestamp)``. Rows are never updated or deleted.
* ``agent_summaries`` — compaction summaries; ``anchor_message_id`` is the id of the last
  ``agent_messages`` row the summary covers.
* ``model_capabilities`` — the structured-output tier of each ``(provider, model)`` with its
  source, time, reason and raw evidence (:mod:`runtime.session.capability_store`;
  docs/decisions.md#structured-capability-cache). One row per model, replaced in place;
  ``capability_probes`` — the lease of a probe running now (one row per model).
* ``delivery_ledger``, ``delivery_uncertain`` — the delivery outbox, declared by the delivery wing
  (:mod:`runtime.delivery.tables`), which adds them with :func:`register_tables` when it is imported
  (memory imports no delivery: docs/decisions.md#layout-forbidden-pairs).

Times (``time``, ``timestamp``, ``created_at``, ``updated_at``) are Unix epoch milliseconds in
64-bit integers. Row ids are 64-bit on PostgreSQL (``BIGSERIAL``) and the rowid on SQLite.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, ForeignKey, Index, Integer, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel

__all__ = [
    "MEMORY_TABLES",
    "AgentMessageRow",
    "AgentSessionRow",
    "AgentSummaryRow",
    "CapabilityProbeRow",
    "ImTranscriptRow",
    "ModelCapabilityRow",
    "created_tables",
    "register_tables",
]

# BIGINT primary keys do not alias SQLite's rowid (no autoincrement there), so use INTEGER on SQLite.
_ID = BigInteger().with_variant(Integer(), "sqlite")


def _id_column() -> Column:
    return Column(_ID, primary_key=True, autoincrement=True)


def _ms_column(*, index: bool = False) -> Column:
    return Column(BigInteger, nullable=False, index=index)


class ImTranscriptRow(SQLModel, table=True):
    """One IM message seen by a bot (inbound when accepted, outbound after the platform confirmed)."""

    __tablename__ = "im_transcripts"
    __table_args__ = (
        UniqueConstraint("platform", "bot_id", "message_id", "direction", name="uq_im_transcripts_delivery"),
        Index("ix_im_transcripts_scene_time", "platform", "bot_id", "scene_id", "time"),
    )

    id: int | None = Field(default=None, sa_column=_id_column())
    message_id: str = Field(sa_column=Column(Text, nullable=False))
    """The platform's message id."""
    platform: str = Field(sa_column=Column(Text, nullable=False))
    bot_id: str = Field(sa_column=Column(Text, nullable=False))
    scene_id: str = Field(sa_column=Column(Text, nullable=False))
    scene_type: str = Field(sa_column=Column(Text, nullable=False))
    """``private`` | ``group`` | ``channel``."""
    sender_id: str = Field(sa_column=Column(Text, nullable=False))
    sender_name: str = Field(sa_column=Column(Text, nullable=False))
    sender_role: str = Field(sa_column=Column(Text, nullable=False))
    direction: str = Field(sa_column=Column(Text, nullable=False))
    """``inbound`` | ``outbound``."""
    body: str = Field(sa_column=Column(Text, nullable=False))
    """Plain text only (may be empty when the message is media only)."""
    media_json: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    """The message's segments as JSON (``[{"type": …, "data": {…}}, …]``), or NULL."""
    time: int = Field(sa_column=_ms_column())
    """Unix ms."""


class AgentSessionRow(SQLModel, table=True):
    """One epoch of one session."""

    __tablename__ = "agent_sessions"
    __table_args__ = (
        Index(
            "uq_agent_sessions_one_active",
            "session_key",
            unique=True,
            sqlite_where=text("status = 'active'"),
            postgresql_where=text("status = 'active'"),
        ),
    )

    session_id: str = Field(sa_column=Column(Text, primary_key=True))
    """``{session_key}#{epoch}``."""
    session_key: str = Field(sa_column=Column(Text, nullable=False, index=True))
    platform: str = Field(sa_column=Column(Text, nullable=False))
    bot_id: str = Field(sa_column=Column(Text, nullable=False))
    scene_id: str = Field(sa_column=Column(Text, nullable=False))
    scene_type: str = Field(sa_column=Column(Text, nullable=False))
    model: str = Field(default="", sa_column=Column(Text, nullable=False))
    """The model ref most recently used (``provider/id``)."""
    status: str = Field(sa_column=Column(Text, nullable=False))
    """``active`` | ``archived``."""
    created_at: int = Field(sa_column=_ms_column())
    updated_at: int = Field(sa_column=_ms_column())


class AgentMessageRow(SQLModel, table=True):
    """One agent message of one epoch (never updated, never deleted)."""

    __tablename__ = "agent_messages"
    __table_args__ = (Index("ix_agent_messages_session_time", "session_id", "timestamp"),)

    id: int | None = Field(default=None, sa_column=_id_column())
    session_id: str = Field(sa_column=Column(Text, ForeignKey("agent_sessions.session_id"), nullable=False))
    role: str = Field(sa_column=Column(Text, nullable=False))
    payload: str = Field(sa_column=Column(Text, nullable=False))
    """The whole message as JSON (content blocks, usage, sender metadata…)."""
    timestamp: int = Field(sa_column=_ms_column())
    """The message's own ``timestamp`` (Unix ms)."""


class AgentSummaryRow(SQLModel, table=True):
    """A compaction summary of the messages up to ``anchor_message_id`` (inclusive)."""

    __tablename__ = "agent_summaries"
    __table_args__ = (Index("ix_agent_summaries_session", "session_id", "id"),)

    id: int | None = Field(default=None, sa_column=_id_column())
    session_id: str = Field(sa_column=Column(Text, ForeignKey("agent_sessions.session_id"), nullable=False))
    summary: str = Field(sa_column=Column(Text, nullable=False))
    anchor_message_id: int | None = Field(default=None, sa_column=Column(BigInteger, nullable=True))
    created_at: int = Field(sa_column=_ms_column())


class ModelCapabilityRow(SQLModel, table=True):
    """The structured-output capability of one ``(provider, model)``, shared by every process."""

    __tablename__ = "model_capabilities"

    provider: str = Field(sa_column=Column(Text, primary_key=True))
    """``Model.provider`` (or its ``api`` without one)."""
    model: str = Field(sa_column=Column(Text, primary_key=True))
    """The model id."""
    tier: str = Field(sa_column=Column(Text, nullable=False))
    """``native`` | ``tool`` | ``prompt``."""
    source: str = Field(sa_column=Column(Text, nullable=False))
    """``probe`` | ``config`` | ``downgrade``."""
    checked_at: int = Field(sa_column=_ms_column())
    """When the tier was established (Unix ms)."""
    reason: str = Field(default="", sa_column=Column(Text, nullable=False))
    evidence: str = Field(default="", sa_column=Column(Text, nullable=False))
    """Raw output that decided the tier (at most 4000 characters)."""
    failures: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    """Consecutive off-schema answers at ``tier``."""
    updated_at: int = Field(sa_column=_ms_column())


class CapabilityProbeRow(SQLModel, table=True):
    """Who probes a model's structured-output tier now: a lease, so one process of the deployment
    probes a model at a time (docs/decisions.md#structured-capability-cache)."""

    __tablename__ = "capability_probes"

    provider: str = Field(sa_column=Column(Text, primary_key=True))
    model: str = Field(sa_column=Column(Text, primary_key=True))
    holder: str = Field(sa_column=Column(Text, nullable=False))
    """A random id of the probing call."""
    until_ms: int = Field(sa_column=_ms_column())
    """The lease ends then (Unix ms); after it another process may take it."""


MEMORY_TABLES: tuple[type[SQLModel], ...] = (
    ImTranscriptRow,
    AgentSessionRow,
    AgentMessageRow,
    AgentSummaryRow,
    ModelCapabilityRow,
    CapabilityProbeRow,
)
"""The memory wing's own tables, in dependency order."""

_REGISTERED: list[type[SQLModel]] = []


def register_tables(*tables: type[SQLModel]) -> None:
    """Add another wing's tables to those :meth:`Database.create_tables` creates (in one
    ``create_all`` with the memory tables); a table registered twice is listed once.

    A wing calls it when its tables module is imported (:mod:`runtime.delivery.tables`,
    :mod:`runtime.spend.ledger`), so every process that writes those tables has them registered
    before it creates the tables: the schema stays where its rules are, and memory imports no
    wing above it
    (docs/decisions.md#layout-forbidden-pairs).
    """
    _REGISTERED.extend(t for t in tables if t not in _REGISTERED)


def created_tables() -> tuple[type[SQLModel], ...]:
    """Every table :meth:`Database.create_tables` creates: :data:`MEMORY_TABLES`, then the
    registered ones in the order they were registered."""
    return (*MEMORY_TABLES, *_REGISTERED)

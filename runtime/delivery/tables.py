"""The delivery tables, as sqlmodel classes: the outbox/idempotency ledger and its uncertain steps
(docs/decisions.md#delivery-ledger, docs/decisions.md#delivery-outbox,
docs/decisions.md#delivery-uncertain).

Importing this module registers them with the memory tables
(:func:`runtime.memory.tables.register_tables`), so every process that creates the tables at start
(``Database.create_tables``: the runtime, the ingress, a session host, the admin API) and writes a
ledger row (all of them import this module through :mod:`runtime.delivery.outbox` or
:mod:`runtime.delivery.ledger`) creates them in the same ``create_all``: a session host writes a
reply's ``queued`` row in the same transaction as the turn's ``im_reply`` record. What the
columns mean, and every rule of who writes them, is in :mod:`runtime.delivery.ledger` and
:mod:`runtime.delivery.outbox`.

Times are Unix epoch milliseconds in 64-bit integers, as in the memory tables.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, Text
from sqlmodel import Field, SQLModel

from runtime.memory.tables import register_tables

__all__ = ["LEDGER_STATES", "DeliveryLedgerRow", "DeliveryUncertainRow"]

LEDGER_STATES = ("queued", "pending", "sent", "failed", "uncertain")
"""Every value of ``delivery_ledger.status``: ``queued`` (recorded by the session, no owner yet),
``pending`` (a delivery actor owns it and sends), and the three final ones."""


class DeliveryLedgerRow(SQLModel, table=True):
    """One reply's delivery state (see :mod:`runtime.delivery.ledger`)."""

    __tablename__ = "delivery_ledger"
    __table_args__ = (Index("ix_delivery_ledger_active", "status", "session_key", "created_at"),)

    reply_id: str = Field(sa_column=Column(Text, primary_key=True))
    """The idempotency key: the reply's id (stable across retries and replays of one turn)."""
    session_key: str = Field(sa_column=Column(Text, nullable=False, index=True))
    platform: str = Field(sa_column=Column(Text, nullable=False))
    bot_id: str = Field(sa_column=Column(Text, nullable=False))
    partition: int = Field(sa_column=Column(Integer, nullable=False))
    """Index of the delivery actor this reply hashes to."""
    job_json: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(sa_column=Column(Text, nullable=False, index=True))
    """One of :data:`LEDGER_STATES`."""
    owner: str = Field(sa_column=Column(Text, nullable=False))
    """``"{partition}:{incarnation}"`` of the delivery actor that owns it; ``""`` while queued."""
    lease_until: int = Field(sa_column=Column(BigInteger, nullable=False))
    steps_total: int = Field(default=-1, sa_column=Column(Integer, nullable=False))
    """Number of API calls the reply renders to (``-1`` until rendered)."""
    steps_done: int = Field(default=0, sa_column=Column(Integer, nullable=False))
    in_flight: int = Field(default=-1, sa_column=Column(Integer, nullable=False))
    message_ids: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    """JSON list of the platform's message ids of the handled steps (``null``: none returned, or
    an uncertain step)."""
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    created_at: int = Field(sa_column=Column(BigInteger, nullable=False))
    """When the reply was recorded (or queued again by an operator's retry): its age and its place
    in the chat's order."""
    updated_at: int = Field(sa_column=Column(BigInteger, nullable=False))


class DeliveryUncertainRow(SQLModel, table=True):
    """One step of a reply that may or may not have reached the platform (its call was on the
    wire when its owner died, or it was written and never answered)."""

    __tablename__ = "delivery_uncertain"

    reply_id: str = Field(sa_column=Column(Text, primary_key=True))
    step: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    """0-based index of the API call."""
    state: str = Field(sa_column=Column(Text, nullable=False))
    """``uncertain`` (recorded, never sent again by itself), ``resend`` (an operator asked for it
    again) or ``resent`` (sent again and confirmed)."""
    owner: str = Field(sa_column=Column(Text, nullable=False))
    """The delivery actor that recorded it."""
    created_at: int = Field(sa_column=Column(BigInteger, nullable=False))
    updated_at: int = Field(sa_column=Column(BigInteger, nullable=False))


register_tables(DeliveryLedgerRow, DeliveryUncertainRow)

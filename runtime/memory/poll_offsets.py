"""The committed offset of each polled update stream: ``inbound_poll_offsets``, one row per
``(platform, bot_id)`` (docs/decisions.md#platform-telegram-polling).

A poller (``actors/inbound/telegram_poll.py``) stores each update through the ingress's steps first and
only then saves ``next_offset`` = that update's id + 1 here, so a poller that dies between the two
reads the update again on restart (the transcript row and the session host's dedup make the second
pass a no-op) and never skips one. The row is replaced in place (``INSERT … ON CONFLICT DO
UPDATE``) on SQLite and PostgreSQL, through :meth:`Database.run_write` (retried while the database
is busy). The table is created by :func:`create_poll_offsets_table` (create-only:
docs/decisions.md#memory-create-only), not by ``Database.create_tables``: only deployments with a
polling bot have it.
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import BigInteger, Column, Text, select
from sqlmodel import Field, SQLModel

from runtime.memory.db import Database

__all__ = ["PollOffsetRow", "PollOffsetStore", "create_poll_offsets_table"]


class PollOffsetRow(SQLModel, table=True):
    """The next update id a poller asks for (every lower one is stored)."""

    __tablename__ = "inbound_poll_offsets"

    platform: str = Field(sa_column=Column(Text, primary_key=True))
    bot_id: str = Field(sa_column=Column(Text, primary_key=True))
    next_offset: int = Field(sa_column=Column(BigInteger, nullable=False))
    """Telegram: the ``offset`` of the next ``getUpdates`` (last stored ``update_id`` + 1)."""
    updated_at: int = Field(sa_column=Column(BigInteger, nullable=False))
    """Unix milliseconds of the last commit."""


_T: Any = PollOffsetRow.__table__  # type: ignore[attr-defined]


def create_poll_offsets_table(db: Database) -> None:
    """Create ``inbound_poll_offsets`` if missing (never drops or alters), in one writer
    transaction (SQLite: under the node-wide writer lock). Blocking: call through ``db.run``."""
    with db.connection(write=True) as conn:
        SQLModel.metadata.create_all(conn, tables=[_T], checkfirst=True)


class PollOffsetStore:
    """Load and commit offsets on ``db`` (its table created with :func:`create_poll_offsets_table`).

    Raises (from every method): ``sqlalchemy.exc.SQLAlchemyError`` when the database fails.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    async def load(self, platform: str, bot_id: str) -> int | None:
        """The committed next offset, or ``None`` when nothing was committed yet."""

        def read() -> int | None:
            stmt = select(_T.c.next_offset).where(_T.c.platform == platform, _T.c.bot_id == bot_id)
            with self.db.connection() as conn:
                value = conn.execute(stmt).scalar()
            return None if value is None else int(value)

        return await self.db.run(read)

    async def commit(self, platform: str, bot_id: str, next_offset: int) -> None:
        """Save ``next_offset`` (an int64) for ``(platform, bot_id)``, replacing the row."""
        now = int(time.time() * 1000)
        values = {"platform": platform, "bot_id": bot_id, "next_offset": next_offset, "updated_at": now}

        def write() -> None:
            stmt = self.db.insert(_T).values(**values)
            stmt = stmt.on_conflict_do_update(
                index_elements=["platform", "bot_id"], set_={"next_offset": next_offset, "updated_at": now}
            )
            with self.db.connection(write=True) as conn:
                conn.execute(stmt)

        await self.db.run_write(write)

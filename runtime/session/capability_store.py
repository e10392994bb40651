"""The SQL capability store: ``model_capabilities`` rows behind
:class:`runtime.reply.capability.CapabilityCache` (docs/decisions.md#structured-capability-cache).

Every session host on every node reads and writes the same rows, so a model is probed once per
``ai.capability_ttl_s`` for the whole deployment and a downgrade one process saw is seen by all
(on the next turn: the cache reads the row at the start of each turn). One row per
``(provider, model)``, replaced in place (``INSERT … ON CONFLICT DO UPDATE``) on both SQLite and
PostgreSQL; writes go through :meth:`Database.run_write` (retried when the database is busy).

A probe is run by one process at a time for the whole deployment: :meth:`SqlCapabilityStore.claim_probe`
takes the model's ``capability_probes`` lease (one conditional upsert: taken only when free or
run out), :meth:`~SqlCapabilityStore.release_probe` gives it back.
"""

from __future__ import annotations

import time
from typing import Any, cast

from sqlalchemy import delete, select

from runtime.memory.db import Database
from runtime.memory.tables import CapabilityProbeRow, ModelCapabilityRow
from runtime.reply.capability import TIERS, CapabilityRecord, Source, Tier

__all__ = ["SqlCapabilityStore"]

_TABLE: Any = ModelCapabilityRow.__table__  # type: ignore[attr-defined]
_LEASE: Any = CapabilityProbeRow.__table__  # type: ignore[attr-defined]
_SOURCES = ("probe", "config", "downgrade")


def _record(row: Any) -> CapabilityRecord | None:
    """A row as a record; ``None`` for a row with an unknown tier or source (written by a newer
    version: ignored, the model is then probed again)."""
    if row.tier not in TIERS or row.source not in _SOURCES:
        return None
    return CapabilityRecord(
        provider=row.provider,
        model=row.model,
        tier=cast(Tier, row.tier),
        source=cast(Source, row.source),
        checked_at_ms=int(row.checked_at),
        reason=row.reason,
        evidence=row.evidence,
        failures=int(row.failures),
    )


class SqlCapabilityStore:
    """:class:`runtime.reply.capability.CapabilityStore` on a :class:`Database` whose tables exist
    (``Database.create_tables``).

    Raises (from every method): ``sqlalchemy.exc.SQLAlchemyError`` when the database fails.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    async def load(self, provider: str, model: str) -> CapabilityRecord | None:
        """The record of ``(provider, model)``, or ``None``."""

        def read() -> CapabilityRecord | None:
            stmt = select(_TABLE).where(_TABLE.c.provider == provider, _TABLE.c.model == model)
            with self.db.connection() as conn:
                row = conn.execute(stmt).first()
            return _record(row) if row is not None else None

        return await self.db.run(read)

    async def load_all(self) -> list[CapabilityRecord]:
        """Every record, ordered by provider and model."""

        def read() -> list[CapabilityRecord]:
            stmt = select(_TABLE).order_by(_TABLE.c.provider, _TABLE.c.model)
            with self.db.connection() as conn:
                rows = conn.execute(stmt).all()
            return [r for r in (_record(row) for row in rows) if r is not None]

        return await self.db.run(read)

    async def save(self, record: CapabilityRecord) -> None:
        """Insert or replace the row of ``(record.provider, record.model)``."""
        values = {
            "provider": record.provider,
            "model": record.model,
            "tier": record.tier,
            "source": record.source,
            "checked_at": record.checked_at_ms,
            "reason": record.reason,
            "evidence": record.evidence,
            "failures": record.failures,
            "updated_at": int(time.time() * 1000),
        }
        update = {k: v for k, v in values.items() if k not in ("provider", "model")}

        def write() -> None:
            stmt = self.db.insert(_TABLE).values(**values)
            stmt = stmt.on_conflict_do_update(index_elements=["provider", "model"], set_=update)
            with self.db.connection(write=True) as conn:
                conn.execute(stmt)

        await self.db.run_write(write)

    async def claim_probe(self, provider: str, model: str, holder: str, lease_s: float) -> bool:
        """Take the probe lease of ``(provider, model)`` for ``lease_s`` seconds as ``holder``;
        False when another holder has it and it has not run out."""
        now = int(time.time() * 1000)
        values = {
            "provider": provider,
            "model": model,
            "holder": holder,
            "until_ms": now + int(lease_s * 1000),
        }

        def write() -> bool:
            upsert = self.db.insert(_LEASE).values(**values)
            claim = upsert.on_conflict_do_update(
                index_elements=["provider", "model"],
                set_={"holder": holder, "until_ms": values["until_ms"]},
                where=(_LEASE.c.until_ms < now) | (_LEASE.c.holder == holder),
            ).returning(_LEASE.c.holder)
            with self.db.connection(write=True) as conn:
                result = conn.execute(claim)
                # pysqlite reports no result columns when RETURNING yields no row
                return (result.first() if result.returns_rows else None) is not None

        return bool(await self.db.run_write(write))

    async def release_probe(self, provider: str, model: str, holder: str) -> None:
        """Give the lease back (when ``holder`` still has it)."""

        def write() -> None:
            stmt = delete(_LEASE).where(
                _LEASE.c.provider == provider, _LEASE.c.model == model, _LEASE.c.holder == holder
            )
            with self.db.connection(write=True) as conn:
                conn.execute(stmt)

        await self.db.run_write(write)

"""The waits of a stopping ``sessionray serve`` (actors/serve/shutdown.py,
docs/decisions.md#ops-graceful-shutdown) on a real database, without Ray: the replies of this run
still open in the delivery ledger are counted (queued and pending ones, the ones with a call on the
wire), older rows and final ones are not; the drain waits until the turns in flight end and the
ledger rows are final, or until the deadline, and says so in one line per phase.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import insert

from actors.serve.shutdown import drain, open_replies
from runtime.delivery.tables import DeliveryLedgerRow
from runtime.memory.db import Database
from tests.memory.pg_schema import create_schema, drop_schema

SINCE_MS = 1_800_000_000_000


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """An empty database (no tables yet): a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path}/s.db")
        yield database
        database.dispose()
        return
    pg_url = request.getfixturevalue("pg_url")
    url, schema = create_schema(pg_url)
    database = Database(url)
    try:
        yield database
    finally:
        database.dispose()
        drop_schema(pg_url, schema)


def ledger_row(reply_id: str, status: str, created_at: int, in_flight: int = -1) -> dict[str, object]:
    return {
        "reply_id": reply_id,
        "session_key": "onebot11:1:private:2",
        "platform": "onebot11",
        "bot_id": "1",
        "partition": 0,
        "job_json": "{}",
        "status": status,
        "owner": "0:x",
        "lease_until": 0,
        "in_flight": in_flight,
        "steps_total": -1,
        "steps_done": 0,
        "message_ids": "[]",
        "created_at": created_at,
        "updated_at": created_at,
    }


def add(db: Database, *rows: dict[str, object]) -> None:
    with db.connection(write=True) as conn:
        conn.execute(insert(DeliveryLedgerRow.__table__), list(rows))  # type: ignore[attr-defined]


def finish(db: Database, reply_id: str) -> None:
    with db.connection(write=True) as conn:
        table = DeliveryLedgerRow.__table__  # type: ignore[attr-defined]
        conn.execute(table.update().where(table.c.reply_id == reply_id).values(status="sent", in_flight=-1))


def test_open_replies_counts_this_runs_unfinished_rows(db: Database) -> None:
    assert open_replies(db, SINCE_MS) == (0, 0)  # no ledger table yet: nothing to wait for
    db.create_tables()
    add(
        db,
        ledger_row("queued", "queued", SINCE_MS + 1),
        ledger_row("on-the-wire", "pending", SINCE_MS + 2, in_flight=0),
        ledger_row("between-steps", "pending", SINCE_MS + 3),
        ledger_row("sent", "sent", SINCE_MS + 4),
        ledger_row("failed", "failed", SINCE_MS + 5),
        ledger_row("uncertain", "uncertain", SINCE_MS + 6),
        ledger_row("before-this-run", "queued", SINCE_MS - 1),
    )
    assert open_replies(db, SINCE_MS) == (3, 1)


class Turns:
    """``in_flight()`` of a runtime whose turns end when the test says so."""

    def __init__(self, n: int) -> None:
        self.n = n

    async def in_flight(self) -> int:
        return self.n


async def test_drain_waits_for_turns_and_replies_then_reports(
    db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    db.create_tables()
    since = int(time.time() * 1000)
    add(db, ledger_row("r1", "queued", since + 1), ledger_row("r2", "pending", since + 2, in_flight=1))
    turns = Turns(2)

    async def work() -> None:  # one turn ends, then the other, then both replies are sent
        for step in (lambda: setattr(turns, "n", 1), lambda: setattr(turns, "n", 0)):
            await asyncio.sleep(0.3)
            step()
        await asyncio.sleep(0.3)
        await db.run(lambda: finish(db, "r1"))
        await db.run(lambda: finish(db, "r2"))

    worker = asyncio.create_task(work())
    counts = await drain(turns, db, deadline=time.monotonic() + 30, since_ms=since, forced=asyncio.Event())
    await worker

    assert counts == {"turns": 2, "turns_left": 0, "replies": 2, "replies_left": 0, "on_the_wire": 0}
    assert capsys.readouterr().out == (
        "sessionray: stopping: turns: 2 in flight, 2 ended, 0 cut off (their messages are replayed by the "
        "next start)\n"
        "sessionray: stopping: deliveries: 2 replies of this run unsent, 2 sent meanwhile, 0 left for the "
        "next start\n"
    )


async def test_the_deadline_ends_the_waits_and_what_is_left_is_counted(
    db: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    db.create_tables()
    since = int(time.time() * 1000)
    add(db, ledger_row("r1", "pending", since + 1, in_flight=0))
    started = time.monotonic()

    counts = await drain(Turns(1), db, deadline=started + 0.5, since_ms=since, forced=asyncio.Event())

    assert time.monotonic() - started < 5  # no wait beyond the deadline but one poll
    assert counts == {"turns": 1, "turns_left": 1, "replies": 1, "replies_left": 1, "on_the_wire": 1}
    out = capsys.readouterr().out
    assert "turns: 1 in flight, 0 ended, 1 cut off" in out
    assert (
        "deliveries: 1 replies of this run unsent, 0 sent meanwhile, 1 left for the next start "
        "(1 with a call on the wire)"
    ) in out

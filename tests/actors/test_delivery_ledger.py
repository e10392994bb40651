"""The delivery idempotency ledger on a real SQLite file (Ray-free): who may claim a reply, the
uncertain step after a crash, and that a stale owner cannot write over a new one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import delivery_ledger as ledger
from runtime.memory.db import Database


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.create_ledger_table(database)
    yield database
    database.dispose()


def claim(db: Database, owner: str, reply_id: str = "r1", lease_ms: int = 60_000, partition: int = 0) -> str:
    return ledger.claim(
        db, reply_id=reply_id, session_key="onebot11:1:private:2", platform="onebot11", bot_id="1",
        partition=partition, job_json="{}", owner=owner, lease_ms=lease_ms,
    ).state  # fmt: skip


def test_claim_rules(db: Database) -> None:
    assert claim(db, "0:a") == "claimed"  # fresh row
    assert claim(db, "0:a") == "claimed"  # its own owner again
    assert claim(db, "1:x") == "busy"  # another partition while the lease holds
    assert claim(db, "0:b") == "claimed"  # the restarted incarnation of the same partition
    with pytest.raises(ledger.LostLeaseError):
        ledger.begin_step(db, "r1", "0:a", 0, 1, 60_000)  # the dead owner can no longer write
    ledger.begin_step(db, "r1", "0:b", 0, 2, 60_000)
    ledger.finish_step(db, "r1", "0:b", 0, "m-1")
    entry = ledger.get_entry(db, "r1")
    assert entry is not None
    assert (entry.owner, entry.steps_total, entry.steps_done, entry.in_flight, entry.message_ids) == (
        "0:b",
        2,
        1,
        -1,
        ["m-1"],
    )
    ledger.begin_step(db, "r1", "0:b", 1, 2, 60_000)
    ledger.finish_step(db, "r1", "0:b", 1, "m-2", last=True)
    assert claim(db, "0:c") == "done"  # terminal: never sent again
    done = ledger.get_entry(db, "r1")
    assert done is not None and (done.status, done.message_ids) == ("sent", ["m-1", "m-2"])


def test_expired_lease_lets_any_actor_resume_and_skip_the_uncertain_step(db: Database) -> None:
    assert claim(db, "0:a", reply_id="r2", lease_ms=-1) == "claimed"
    ledger.begin_step(db, "r2", "0:a", 0, 2, -1)  # on the wire when "0:a" died; lease already over
    assert [e.reply_id for e in ledger.resumable(db, partition=1, owner="1:x")] == ["r2"]
    assert claim(db, "1:x", reply_id="r2") == "claimed"
    assert ledger.skip_uncertain_step(db, "r2", "1:x") == 0
    entry = ledger.get_entry(db, "r2")
    assert entry is not None and (entry.steps_done, entry.in_flight, entry.message_ids) == (1, -1, [None])
    final = ledger.finish(db, "r2", "1:x", "failed", "retcode 1404: x")
    assert (final.status, final.error) == ("failed", "retcode 1404: x")
    assert ledger.resumable(db, partition=0, owner="0:z") == []

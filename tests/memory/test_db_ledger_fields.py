"""``claim`` / ``claim_and_begin`` of runtime/delivery/ledger.py take their fields as one
:class:`ClaimFields` (keyword arguments, as before); a missing or unknown field is a clear
TypeError that writes nothing, and a fresh row stores every field as given."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.delivery import ledger as ledger
from runtime.memory.db import Database

FIELDS: dict[str, Any] = {
    "reply_id": "r-fields",
    "session_key": "onebot11:1:private:2",
    "platform": "onebot11",
    "bot_id": "1",
    "partition": 3,
    "job_json": '{"job": 1}',
    "owner": "3:a",
    "lease_ms": 60_000,
}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path}/ledger.db", threads=1)
    ledger.create_ledger_table(database)
    try:
        yield database
    finally:
        database.dispose()


def _row(entry: ledger.LedgerEntry | None) -> tuple[object, ...]:
    assert entry is not None
    return (
        entry.reply_id, entry.session_key, entry.platform, entry.bot_id, entry.partition, entry.job_json,
        entry.status, entry.owner, entry.steps_total, entry.steps_done, entry.in_flight, entry.message_ids,
        entry.error,
    )  # fmt: skip


def test_bad_fields_are_a_type_error_and_write_nothing(db: Database) -> None:
    missing = {k: v for k, v in FIELDS.items() if k != "job_json"}
    with pytest.raises(TypeError, match=r"claim fields: missing \['job_json'\], unknown \[\]"):
        ledger.claim(db, **missing)
    with pytest.raises(TypeError, match=r"claim fields: missing \[\], unknown \['steps'\]"):
        ledger.claim_and_begin(db, **FIELDS, steps=2, steps_total=2)  # type: ignore[call-arg]
    assert ledger.get_entry(db, "r-fields") is None


def test_claim_and_claim_and_begin_store_every_field(db: Database) -> None:
    fresh = ledger.claim(db, **FIELDS)
    assert (fresh.state, fresh.begun) == ("claimed", False)
    expected: tuple[object, ...] = (
        "r-fields",
        "onebot11:1:private:2",
        "onebot11",
        "1",
        3,
        '{"job": 1}',
        "pending",
        "3:a",
        -1,
        0,
        -1,
        [],
        None,
    )
    assert _row(fresh.entry) == expected
    assert _row(ledger.get_entry(db, "r-fields")) == expected

    begun = ledger.claim_and_begin(db, **{**FIELDS, "reply_id": "r-begun"}, steps_total=2)
    assert (begun.state, begun.begun) == ("claimed", True)
    assert _row(ledger.get_entry(db, "r-begun")) == ("r-begun", *expected[1:8], 2, 0, 0, [], None)
    assert _row(begun.entry) == _row(ledger.get_entry(db, "r-begun"))

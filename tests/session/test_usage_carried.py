"""A turn's usage rows go with the turn's next write (docs/decisions.md#spend-ledger): real
SQLite, the scripted faux model, a Ray-free SessionCore; the engine's commits counted with a
SQLAlchemy event, the repository's appends counted (and failed once) by
tests/session/test_writer_staging.py's wrapper."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, text

from runtime.llm.attribution import CallAttribution, CallReason
from runtime.llm.types import Usage
from runtime.llm.usage import MAX_COUNT, CallUsage, sane_usage
from runtime.memory.db import Database
from runtime.spend.ledger import USAGE_TABLE, UsageCarrier, UsageLedger, carried_usage, ledger_row
from tests.memory.pg_schema import create_schema, drop_schema
from tests.session.recorder import Recorder
from tests.session.test_session_core import open_core, turn, wait_for
from tests.session.test_writer_staging import CountingStore


@contextmanager
def commits(db: Database) -> Iterator[list[int]]:
    """Counts the engine's commits while the block runs (one list item each)."""
    seen: list[int] = []

    def on_commit(conn: Any) -> None:
        seen.append(1)

    event.listen(db.engine, "commit", on_commit)
    try:
        yield seen
    finally:
        event.remove(db.engine, "commit", on_commit)


def usage_rows(db: Database) -> list[Any]:
    with db.connection() as conn:
        return list(conn.execute(select(USAGE_TABLE.c.turn_id, USAGE_TABLE.c.reason)))


async def test_a_turn_without_tools_commits_its_usage_row_with_its_hand_over(
    repo: Any, tmp_path: Path
) -> None:
    core = await open_core(repo, tmp_path, Recorder(), turns=1)
    assert (await core.submit(turn(1, "warm"))).outcome == "ok"  # the session's first turn
    with commits(repo.db) as seen:
        assert (await core.submit(turn(2, "echo 2"))).outcome == "ok"
    assert len(seen) == 1  # the hand-over alone: the model call's row went with it
    assert [tuple(r) for r in usage_rows(repo.db)] == [("m1", "turn"), ("m2", "turn")]
    assert core.writer.staged_writes == 0


async def test_each_call_of_a_tool_turn_is_carried_by_the_write_after_it(repo: Any, tmp_path: Path) -> None:
    core = await open_core(repo, tmp_path, Recorder(), turns=1)
    store = CountingStore(repo)
    core.writer.store = store
    with commits(repo.db) as seen:
        assert (await core.submit(turn(1, "slow 0"))).outcome == "ok"
    assert [tuple(r) for r in usage_rows(repo.db)] == [("m1", "turn"), ("m1", "turn")]  # two calls
    assert len(seen) == len(store.calls)  # no transaction of their own


async def test_a_failed_hand_over_keeps_the_usage_row_for_the_turns_last_write(
    repo: Any, tmp_path: Path
) -> None:
    core = await open_core(repo, tmp_path, Recorder(), turns=1)
    store = CountingStore(repo)
    core.writer.store = store
    store.fail_on = "im_reply"  # the hand-over fails once
    assert (await core.submit(turn(1, "echo 1"))).outcome == "error"
    assert [tuple(r) for r in usage_rows(repo.db)] == [("m1", "turn")]  # written with the records
    assert core.writer.staged_writes == 0


def _call(reason: CallReason) -> CallUsage:
    owner = CallAttribution(
        bot_id="1", session_key="k", user_id="u", session_id="s", turn_id="t", reason=reason
    )
    return CallUsage("faux/m", "faux", Usage(input=3, output=4), 0.0, "stop", owner, 1)


async def test_only_the_open_turns_own_calls_on_its_database_are_carried(tmp_path: Path) -> None:
    db, other = (Database(f"sqlite:///{tmp_path / n}") for n in ("a.db", "b.db"))
    for d in (db, other):
        d.create_tables()
    staged: list[Any] = []
    ledger = UsageLedger(db)
    try:
        with carried_usage(UsageCarrier(db, staged.append)) as carrier:
            await ledger(_call("turn"))
            await ledger(_call("correction"))
            await ledger(_call("sub-agent"))  # not the turn's own call: written at once
            assert not carrier.take(other, _call("turn"), [ledger_row(_call("turn"))])
        await ledger(_call("turn"))  # the turn ended: written at once
        assert len(staged) == 2
        assert [r.reason for r in usage_rows(db)] == ["sub-agent", "turn"]
        with db.connection(write=True) as conn:
            for write in staged:
                write(conn)
        assert sorted(r.reason for r in usage_rows(db)) == ["correction", "sub-agent", "turn", "turn"]
    finally:
        db.dispose()
        other.dispose()


async def test_a_usage_row_that_cannot_be_written_never_fails_the_turns_write(
    repo: Any, tmp_path: Path, metric: Any
) -> None:
    core = await open_core(repo, tmp_path, Recorder(), turns=1)
    with repo.db.connection(write=True) as conn:
        conn.execute(text("DROP TABLE llm_usage"))  # every insert of a row now fails
    assert (await core.submit(turn(1, "echo 1"))).outcome == "ok"  # the hand-over went through
    assert metric("sessionray_usage_ledger_failures_total") == 1.0
    assert core.writer.staged_writes == 0


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
async def test_a_staged_row_that_fails_is_rolled_back_alone_and_the_write_goes_on(
    dialect: str, request: pytest.FixtureRequest, tmp_path: Path, metric: Any
) -> None:
    """The staged insert's savepoint, on the driver's connection, on both dialects: a staged write
    of two rows whose second fails (no time: NOT NULL) is rolled back whole — its first row too,
    which SQLite's per-row insert had written — and the transaction goes on: the write staged
    after it commits."""
    pg_url = request.getfixturevalue("pg_url") if dialect == "postgresql" else None
    url, schema = create_schema(pg_url) if pg_url else (f"sqlite:///{tmp_path / 'sp.db'}", None)
    db = Database(url)
    try:
        db.create_tables()
        staged: list[Any] = []
        row = ledger_row(_call("turn"))
        with carried_usage(UsageCarrier(db, staged.append)) as carrier:
            assert carrier.take(db, _call("turn"), [row, {**row, "ts": None}])  # fails on its 2nd row
            assert carrier.take(db, _call("turn"), [row])
        with db.connection(write=True) as conn:
            for write in staged:
                write(conn)
        assert metric("sessionray_usage_ledger_failures_total") == 1.0
        assert [tuple(r) for r in usage_rows(db)] == [("t", "turn")]
    finally:
        db.dispose()
        if pg_url and schema:
            drop_schema(pg_url, schema)


async def test_a_turn_waiting_for_an_earlier_hand_over_commits_its_rows_first(
    repo: Any, tmp_path: Path
) -> None:
    core = await open_core(repo, tmp_path, Recorder(), turns=4)
    gate = tmp_path / "markers" / "gate-g1"
    first = asyncio.ensure_future(core.submit(turn(1, "ablock g1")))  # held in its tool
    await wait_for(lambda: gate.with_suffix(".waiting").exists())
    second = asyncio.ensure_future(core.submit(turn(2, "echo 2")))  # answers, then waits (chat order)
    await wait_for(lambda: ("m2", "turn") in [tuple(r) for r in usage_rows(repo.db)])
    assert not first.done() and not second.done()  # both still running: the row did not wait
    gate.with_suffix(".open").write_text("")
    assert [r.outcome for r in await asyncio.gather(first, second)] == ["ok", "ok"]
    assert sorted(tuple(r) for r in usage_rows(repo.db)) == [("m1", "turn"), ("m1", "turn"), ("m2", "turn")]


async def test_a_token_count_beyond_a_64_bit_integer_is_recorded_cut_to_it(repo: Any, tmp_path: Path) -> None:
    db = repo.db
    ledger = UsageLedger(db)
    huge = CallUsage("faux/m", "faux", sane_usage(Usage(input=2**64, output=5)), 0.0, "stop", None, 1)
    await ledger(huge)
    with db.connection() as conn:
        assert list(conn.execute(select(USAGE_TABLE.c.input_tokens, USAGE_TABLE.c.output_tokens))) == [
            (MAX_COUNT, 5)
        ]

"""The durable inbox table (runtime/memory/inbox.py) and its batched marks
(runtime/memory/inbox_marks.py) on SQLite and PostgreSQL: one write transaction per stored
message (with its transcript row), the unique key as dedup, the per-key order check, marks that
only move forward, and the recovery loop's selections by shard, grace and window."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Connection, update

from runtime.keys import key_hash
from runtime.llm.types import now_ms
from runtime.memory import inbox
from runtime.memory.db import Database
from runtime.memory.inbox_marks import InboxMarks
from runtime.memory.transcripts import PreparedInsert, TranscriptStore

KEY_A = "onebot11:10001:private:501"
KEY_B = "onebot11:10001:private:502"


@pytest.fixture
def store(db: Database) -> inbox.InboxStore:
    inbox.create_inbox_table(db)
    inbox.create_inbox_table(db)  # create-only: a second call changes nothing
    return inbox.InboxStore(db)


async def put(store: inbox.InboxStore, mid: str, key: str = KEY_A, **kw: Any) -> inbox.StoreResult:
    return await store.store(
        platform="onebot11",
        bot_id="10001",
        message_id=mid,
        session_key=key,
        message_json=f'{{"message_id": "{mid}"}}',
        **kw,
    )


def states(db: Database) -> dict[str, tuple[str, int]]:
    with db.connection() as conn:
        rows = conn.execute(inbox.InboxRow.__table__.select()).all()  # type: ignore[attr-defined]
    return {r.message_id: (r.state, r.attempts) for r in rows}


def set_received(db: Database, mid: str, received_at: int) -> None:
    table = inbox.InboxRow.__table__  # type: ignore[attr-defined]
    with db.connection(write=True) as conn:
        conn.execute(update(table).where(table.c.message_id == mid).values(received_at=received_at))


async def test_a_message_is_stored_once_with_its_transcript_row(
    db: Database, store: inbox.InboxStore
) -> None:
    transcripts = TranscriptStore(db)
    row = transcripts.prepare(
        direction="inbound",
        message_id="m1",
        platform="onebot11",
        bot_id="10001",
        scene_id="501",
        scene_type="private",
        sender_id="501",
        text="hello",
    )
    assert row is not None
    first = await put(store, "m1", with_rows=[row])
    again = await put(store, "m1", with_rows=[row])
    assert (first.stored, first.row_id is not None, again) == (True, True, inbox.StoreResult(stored=False))
    entry = await db.run(lambda: inbox.get_row(db, "onebot11", "10001", "m1"))
    assert entry is not None
    assert (entry.session_key, entry.state, entry.attempts, entry.message_json) == (
        KEY_A,
        "stored",
        0,
        '{"message_id": "m1"}',
    )
    assert entry.received_at == entry.updated_at and abs(entry.received_at - now_ms()) < 60_000
    scene = await transcripts.scene("onebot11", "10001", "501")
    assert [(e.message_id, e.direction, e.body) for e in scene] == [("m1", "inbound", "hello")]


async def test_a_failing_row_of_the_same_transaction_stores_nothing(
    db: Database, store: inbox.InboxStore
) -> None:
    class Broken(PreparedInsert):
        def execute(self, conn: Connection) -> bool:
            raise RuntimeError("the transcript row failed")

    with pytest.raises(RuntimeError, match="the transcript row failed"):
        await put(store, "m2", with_rows=[Broken(None, {})])
    assert states(db) == {}
    assert (await put(store, "m2")).stored  # nothing was left behind: the redelivery stores it


async def test_the_order_check_sees_earlier_open_rows_of_the_same_key(
    db: Database, store: inbox.InboxStore
) -> None:
    await put(store, "a1")
    other = await put(store, "b1", KEY_B, check_order=True)
    behind = await put(store, "a2", check_order=True)
    assert (other.earlier, [e.message_id for e in behind.earlier]) == ((), ["a1"])
    await db.run_write(lambda: inbox.mark(db, [("onebot11", "10001", "a1")], []))
    third = await put(store, "a3", check_order=True)  # routed is still open
    assert [e.message_id for e in third.earlier] == ["a1", "a2"]
    refs = [("onebot11", "10001", m) for m in ("a1", "a2", "a3")]
    await db.run_write(lambda: inbox.mark(db, [], refs))
    assert (await put(store, "a4", check_order=True)).earlier == ()


async def test_marks_only_move_forward_and_are_idempotent(db: Database, store: inbox.InboxStore) -> None:
    for mid in ("m1", "m2", "m3"):
        await put(store, mid)
    ref = ("onebot11", "10001")
    await db.run_write(lambda: inbox.mark(db, [(*ref, "m1"), (*ref, "m2")], [(*ref, "m2")]))
    await db.run_write(lambda: inbox.mark(db, [(*ref, "m2"), (*ref, "unknown")], [(*ref, "m2")]))
    assert states(db) == {"m1": ("routed", 0), "m2": ("handled", 0), "m3": ("stored", 0)}
    assert await db.run_write(lambda: inbox.note_attempt(db, 3))
    assert await db.run_write(lambda: inbox.fail(db, 3))
    assert not await db.run_write(lambda: inbox.fail(db, 3))  # closed rows stay as they are
    assert not await db.run_write(lambda: inbox.note_attempt(db, 2))
    assert states(db) == {"m1": ("routed", 0), "m2": ("handled", 0), "m3": ("failed", 1)}


async def test_the_recovery_selections_by_shard_grace_and_window(
    db: Database, store: inbox.InboxStore
) -> None:
    keys = [f"onebot11:10001:private:{600 + i}" for i in range(8)]
    for i, key in enumerate(keys):
        await put(store, f"k{i}", key)
    now = now_ms()
    for i in range(8):
        set_received(db, f"k{i}", now - 10_000)
    set_received(db, "k0", now - 100)  # within the grace: not yet
    set_received(db, "k1", now - 700_000)  # older than the window
    shards = 3
    seen: list[str] = []
    for shard in range(shards):
        rows = await db.run(
            lambda s=shard: inbox.pending(db, s, shards, before_ms=now - 5_000, after_ms=now - 600_000)
        )
        assert all(key_hash(r.session_key) % shards == shard for r in rows)
        assert [r.id for r in rows] == sorted(r.id for r in rows)
        seen += [r.message_id for r in rows]
    assert sorted(seen) == [f"k{i}" for i in range(2, 8)]
    expired = []
    for shard in range(shards):
        expired += await db.run_write(lambda s=shard: inbox.expire(db, s, shards, now - 600_000))
    assert [(e.message_id, e.session_key, e.state) for e in expired] == [("k1", keys[1], "expired")]
    backlog = sum([await db.run(lambda s=shard: inbox.backlog(db, s, shards)) for shard in range(shards)])
    assert backlog == 7
    assert await db.run(lambda: inbox.pending_keys(db, now - 600_000)) == set(keys) - {keys[1]}


async def test_prune_deletes_old_closed_rows_only(db: Database, store: inbox.InboxStore) -> None:
    for mid in ("open", "done", "recent"):
        await put(store, mid)
    ref = ("onebot11", "10001")
    await db.run_write(lambda: inbox.mark(db, [], [(*ref, "done"), (*ref, "recent")]))
    table = inbox.InboxRow.__table__  # type: ignore[attr-defined]
    with db.connection(write=True) as conn:
        conn.execute(update(table).where(table.c.message_id != "recent").values(updated_at=1))
    assert await db.run_write(lambda: inbox.prune(db, now_ms() - 60_000)) == 1
    assert set(states(db)) == {"open", "recent"}


async def test_marks_are_written_in_one_batch(db: Database, store: inbox.InboxStore) -> None:
    for i in range(50):
        await put(store, f"b{i}")
    marks = InboxMarks(db, flush_s=0.05)
    for i in range(50):
        marks.routed("onebot11", "10001", f"b{i}")
    for i in range(25):
        marks.handled("onebot11", "10001", f"b{i}")
    await marks.close()
    assert marks.counts == {"routed": 50, "handled": 25, "flushes": 1, "failed_flushes": 0}
    got = states(db)
    assert [got[f"b{i}"][0] for i in range(50)] == ["handled"] * 25 + ["routed"] * 25

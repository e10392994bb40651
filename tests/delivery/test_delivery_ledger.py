"""The delivery idempotency ledger on a real SQLite file and on PostgreSQL (Ray-free): who may
claim a reply, claim_and_begin (one write before the first send), the uncertain step after a
crash, that a stale owner cannot write over a new one, and the ledger writes of one delivery."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import event, text

from runtime.delivery import ledger as ledger
from runtime.delivery import outbox
from runtime.delivery.core import DeliveryResult, DeliverySender, DeliverySettings
from runtime.llm.types import now_ms
from runtime.memory.db import Database
from tests.actors.edge_support import onebot_bot, private_call, text_job
from tests.actors.session_support import eventually
from tests.memory.pg_schema import create_schema, drop_schema
from tests.platform_api_server import PlatformApiServer


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'ledger.db'}")
        ledger.create_ledger_table(database)
        yield database
        database.dispose()
        return
    pg_url = request.getfixturevalue("pg_url")
    url, schema = create_schema(pg_url)
    database = Database(url)
    try:
        ledger.create_ledger_table(database)
        yield database
    finally:
        database.dispose()
        drop_schema(pg_url, schema)


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


def claim_and_begin(db: Database, owner: str, reply_id: str, lease_ms: int = 60_000) -> ledger.ClaimOutcome:
    return ledger.claim_and_begin(
        db, reply_id=reply_id, session_key="onebot11:1:private:2", platform="onebot11", bot_id="1",
        partition=0, job_json="{}", owner=owner, lease_ms=lease_ms, steps_total=2,
    )  # fmt: skip


def state(entry: ledger.LedgerEntry | None) -> tuple[object, ...]:
    assert entry is not None
    return (
        entry.status,
        entry.owner,
        entry.steps_total,
        entry.steps_done,
        entry.in_flight,
        entry.message_ids,
    )


def test_claim_and_begin_marks_step_zero_in_the_claiming_write(db: Database) -> None:
    fresh = claim_and_begin(db, "0:a", "r3")
    assert (fresh.state, fresh.begun) == ("claimed", True)
    assert state(fresh.entry) == ("pending", "0:a", 2, 0, 0, [])
    assert state(ledger.get_entry(db, "r3")) == state(fresh.entry)
    # The same owner again: step 0 is on the wire, so nothing is begun a second time.
    again = claim_and_begin(db, "0:a", "r3")
    assert (again.state, again.begun, state(again.entry)) == (
        "claimed",
        False,
        ("pending", "0:a", 2, 0, 0, []),
    )
    assert (claim_and_begin(db, "1:x", "r3").state, claim_and_begin(db, "1:x", "r3").begun) == ("busy", False)
    # The restarted incarnation finds step 0 uncertain (rule 2): claimed, not begun, then skipped.
    takeover = claim_and_begin(db, "0:b", "r3")
    assert (takeover.state, takeover.begun, state(takeover.entry)) == (
        "claimed", False, ("pending", "0:b", 2, 0, 0, []),
    )  # fmt: skip
    assert ledger.skip_uncertain_step(db, "r3", "0:b") == 0
    ledger.begin_step(db, "r3", "0:b", 1, 2, 60_000)
    ledger.finish_step(db, "r3", "0:b", 1, "m-2", last=True)
    assert state(ledger.get_entry(db, "r3")) == ("sent", "0:b", 2, 2, -1, [None, "m-2"])
    done = claim_and_begin(db, "0:c", "r3")
    assert (done.state, done.begun) == ("done", False)


def test_claim_and_begin_on_a_row_claimed_but_never_begun(db: Database) -> None:
    """An owner that died between claim and its first begin_step left nothing on the wire: the
    next claimer begins step 0 in its claiming write."""
    assert claim(db, "0:a", reply_id="r4", lease_ms=-1) == "claimed"
    taken = claim_and_begin(db, "1:x", "r4")
    assert (taken.state, taken.begun, state(taken.entry)) == (
        "claimed",
        True,
        ("pending", "1:x", 2, 0, 0, []),
    )
    assert state(ledger.get_entry(db, "r4")) == state(taken.entry)
    with pytest.raises(ValueError, match="at least one step"):
        ledger.claim_and_begin(
            db, reply_id="r5", session_key="k", platform="p", bot_id="b", partition=0, job_json="{}",
            owner="0:a", lease_ms=1, steps_total=0,
        )  # fmt: skip
    assert ledger.get_entry(db, "r5") is None


def test_a_stale_owner_cannot_finish_or_step(db: Database) -> None:
    assert claim(db, "0:a", reply_id="r6") == "claimed"
    assert claim(db, "0:b", reply_id="r6") == "claimed"
    for write in (
        lambda: ledger.begin_step(db, "r6", "0:a", 0, 1, 60_000),
        lambda: ledger.finish_step(db, "r6", "0:a", 0, "m"),
        lambda: ledger.finish_step(db, "r6", "0:a", 0, "m", last=True),
        lambda: ledger.skip_uncertain_step(db, "r6", "0:a"),
        lambda: ledger.finish(db, "r6", "0:a", "sent", None),
    ):
        with pytest.raises(ledger.LostLeaseError, match="delivery 'r6' is no longer owned by '0:a'"):
            write()
    assert state(ledger.get_entry(db, "r6")) == ("pending", "0:b", -1, 0, -1, [])
    final = ledger.finish(db, "r6", "0:b", "sent", None)
    assert (final.status, final.owner, final.in_flight, final.error) == ("sent", "0:b", -1, None)


@pytest.mark.parametrize("how", ["queued", "direct"])
async def test_what_one_reply_writes_the_transcript_in_the_last_write(
    fixtures_dir: Path, tmp_path: Path, how: str
) -> None:
    """A fresh single-step reply over HTTP. Queued by a turn (the message path): the chat's queue
    read without a write, the claim and step 0's mark in one UPDATE as the request is written,
    the send, finish_step(last) — one UPDATE, no read — with the outbound transcript row in a
    savepoint of the same transaction — ``REPLY_WRITES_OVER_HTTP`` (2) write transactions.
    Handed straight to the actor: the claim inserts the row first, and the mark is a write of its
    own (not at the claim: docs/decisions.md#delivery-uncertain) — one more
    (docs/decisions.md#delivery-ledger)."""
    url = f"sqlite:///{tmp_path / 'send.db'}"
    with PlatformApiServer(fixtures_dir) as api:
        sender = DeliverySender(DeliverySettings(database_url=url, bots=[onebot_bot(api.base_url)]), 0, "0:t")
        job = text_job("one write less", reply_id="r-fast")
        if how == "queued":
            with sender.db.connection(write=True) as conn:
                outbox.queue_writer(job, 0, 1_000)(conn)
        statements: list[str] = []

        def record(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
            words = statement.split()  # "INSERT INTO t …" → "INSERT t"; else the first two words
            statements.append(" ".join([words[0], words[2]] if words[0] == "INSERT" else words[:2]))

        event.listen(sender.db.engine, "before_cursor_execute", record)
        try:
            if how == "queued":
                sender.wake(job.session_key)
                await eventually(lambda: bool(api.requests) and not sender.chains.active, what="the drain")
            else:
                result = await sender.deliver(job)
                assert result == DeliveryResult(
                    reply_id="r-fast", outcome="sent", message_ids=[result.message_ids[0]], attempts=1
                )
        finally:
            event.remove(sender.db.engine, "before_cursor_execute", record)
            await sender.close()
        requests = [(r.path, r.json) for r in api.requests]
    assert requests == [("/send_private_msg", private_call("20002", "one write less"))]
    claim = {
        "queued": ["BEGIN", "SELECT delivery_ledger.reply_id,"],  # the chat's queue, read
        "direct": ["BEGIN IMMEDIATE", "INSERT delivery_ledger"],  # the claim: nothing on the wire yet
    }[how]
    assert statements == [
        *claim,
        "BEGIN IMMEDIATE",
        "UPDATE delivery_ledger",  # step 0 on the wire (queued: the claim too): the request is being written
        "BEGIN IMMEDIATE",
        "UPDATE delivery_ledger",  # finish_step(last=True) of step 0: one UPDATE, no read first
        "SAVEPOINT sa_savepoint_1",
        "INSERT im_transcripts",  # the outbound transcript, in the same transaction
        "RELEASE SAVEPOINT",
    ]
    writes = statements.count("BEGIN IMMEDIATE")
    assert writes == ledger.REPLY_WRITES_OVER_HTTP + (how == "direct")  # what the docs quote
    db = Database(url)
    entry = ledger.get_entry(db, "r-fast")
    db.dispose()
    assert entry is not None and entry.message_ids[0]
    assert state(entry) == ("sent", "0:t", 1, 1, -1, entry.message_ids)


async def test_a_transcript_row_that_cannot_be_written_does_not_undo_the_confirmed_send(
    fixtures_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The transcript row shares the last step's transaction in a savepoint: when its INSERT fails
    (here the table is gone) only the savepoint rolls back — the reply is closed ``sent`` with its
    message id, sent once, and the failure is logged."""
    url = f"sqlite:///{tmp_path / 'no-transcripts.db'}"
    with PlatformApiServer(fixtures_dir) as api:
        sender = DeliverySender(DeliverySettings(database_url=url, bots=[onebot_bot(api.base_url)]), 0, "0:t")
        with sender.db.connection(write=True) as conn:
            conn.execute(text("DROP TABLE im_transcripts"))
        try:
            result = await sender.deliver(text_job("kept anyway", reply_id="r-no-transcript"))
            entry = ledger.get_entry(sender.db, "r-no-transcript")
        finally:
            await sender.close()
        sent = [r.path for r in api.requests]
    assert result.outcome == "sent" and result.message_ids[0]
    assert state(entry) == ("sent", "0:t", 1, 1, -1, result.message_ids)
    assert sent == ["/send_private_msg"]
    assert "outbound transcript of r-no-transcript not written" in caplog.text


async def test_a_sender_lost_while_connecting_left_nothing_on_the_wire_and_the_next_sends_it_once(
    fixtures_dir: Path, tmp_path: Path
) -> None:
    """A step is marked on the wire when its request is written, not at the claim
    (docs/decisions.md#delivery-uncertain): while the platform refuses connections the claimed
    row has nothing in flight, so the sender that takes it over (the first one gone, its lease
    over) sends it once — it is not recorded ``uncertain``."""
    url = f"sqlite:///{tmp_path / 'connect.db'}"
    with socket.socket() as probe:  # a port nothing listens on: every connect is refused
        probe.bind(("127.0.0.1", 0))
        refused = probe.getsockname()[1]
    settings = DeliverySettings(database_url=url, backoff_base_s=0.01, backoff_max_s=0.05)
    first = DeliverySender(
        settings.model_copy(update={"bots": [onebot_bot(f"http://127.0.0.1:{refused}")]}), 0, "0:a"
    )
    attempts: list[str] = []

    async def count(request: httpx.Request) -> None:
        attempts.append(request.url.path)

    [client] = first.clients.values()  # one HTTP client per bot
    client.event_hooks["request"].append(count)
    job = text_job("sent once after all", reply_id="r-connect")
    task = asyncio.create_task(first.deliver(job))
    try:
        await eventually(lambda: len(attempts) >= 3, what="three refused connects")
        entry = ledger.get_entry(first.db, "r-connect")
        assert state(entry) == ("pending", "0:a", -1, 0, -1, [])  # claimed, nothing on the wire
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await first.close()
    db = Database(url)
    with db.connection(write=True) as conn:  # the first sender's lease is over
        conn.execute(text("UPDATE delivery_ledger SET lease_until = 0 WHERE reply_id = 'r-connect'"))
    db.dispose()
    with PlatformApiServer(fixtures_dir) as api:
        second = DeliverySender(settings.model_copy(update={"bots": [onebot_bot(api.base_url)]}), 0, "0:b")
        try:
            result = await second.deliver(job)
        finally:
            await second.close()
        requests = [(r.path, r.json) for r in api.requests]
    assert (result.outcome, requests) == (
        "sent",
        [("/send_private_msg", private_call("20002", "sent once after all"))],
    )
    db = Database(url)
    assert state(ledger.get_entry(db, "r-connect")) == ("sent", "0:b", 1, 1, -1, result.message_ids)
    db.dispose()


def refused_port() -> int:
    """A port nothing listens on: every connect to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_queued_reply_refused_at_connect_is_claimed_before_its_wait_and_not_marked(
    tmp_path: Path,
) -> None:
    """A queued reply is claimed by its step 0's mark on the wire; a connect refused before that
    mark leaves it unclaimed, so the retry's wait claims it first (the lease must cover the wait:
    docs/decisions.md#delivery-outbox) — still with nothing on the wire. One refused past
    ``delivery.max_age_s`` is claimed before it is closed ``failed``."""
    url = f"sqlite:///{tmp_path / 'connect.db'}"
    settings = DeliverySettings(
        database_url=url,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        bots=[onebot_bot(f"http://127.0.0.1:{refused_port()}")],
    )
    sender = DeliverySender(settings, 0, "0:a")
    attempts: list[str] = []

    async def count(request: httpx.Request) -> None:
        attempts.append(request.url.path)

    [client] = sender.clients.values()
    client.event_hooks["request"].append(count)
    job = text_job("waits for the platform", reply_id="r-wait")
    with sender.db.connection(write=True) as conn:
        outbox.queue_writer(job, 0, now_ms())(conn)
    try:
        sender.wake(job.session_key)
        await eventually(lambda: len(attempts) >= 2, what="two refused connects")
        assert state(ledger.get_entry(sender.db, "r-wait")) == ("pending", "0:a", -1, 0, -1, [])
    finally:
        await sender.close()

    old = text_job("too old to send", reply_id="r-old")
    expired = DeliverySender(settings.model_copy(update={"max_age_s": 0.0}), 0, "0:b")
    [client] = expired.clients.values()
    client.event_hooks["request"].append(count)
    with expired.db.connection(write=True) as conn:
        outbox.queue_writer(old, 0, 1_000)(conn)
    try:
        expired.wake(old.session_key)
        closed = lambda: getattr(ledger.get_entry(expired.db, "r-old"), "status", "") == "failed"  # noqa: E731
        await eventually(closed, what="r-old closed")
        entry = ledger.get_entry(expired.db, "r-old")
    finally:
        await expired.close()
    assert entry is not None and (entry.owner, entry.in_flight, entry.steps_done) == ("0:b", -1, 0)
    assert "delivery.max_age_s=0" in (entry.error or "")


async def test_a_queued_reply_claimed_by_another_sender_after_the_read_is_not_sent(
    fixtures_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another sender claims the queued row right after this one read the chat's queue (a real
    second writer, at the worst moment): the mark of step 0, which would claim it, finds it taken,
    writes nothing and ends the call before the request is written — the platform gets nothing
    from this sender, and the row stays the other's (docs/decisions.md#delivery-outbox)."""
    url = f"sqlite:///{tmp_path / 'race.db'}"
    with PlatformApiServer(fixtures_dir) as api:
        sender = DeliverySender(DeliverySettings(database_url=url, bots=[onebot_bot(api.base_url)]), 0, "0:a")
        other = Database(url)
        job = text_job("taken meanwhile", reply_id="r-race")
        with sender.db.connection(write=True) as conn:
            outbox.queue_writer(job, 0, 1_000)(conn)
        taken: list[str] = []

        def claim_after_the_read(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
            if not taken and statement.lstrip().startswith("SELECT delivery_ledger.reply_id"):
                found = ledger.claim_queued(other, "r-race", "1:other", 60_000)
                taken.append(found.state if found else "none")

        event.listen(sender.db.engine, "after_cursor_execute", claim_after_the_read)
        try:
            sender.wake(job.session_key)
            await eventually(lambda: not sender.chains.active and bool(taken), what="the drain")
            entry = ledger.get_entry(other, "r-race")
        finally:
            await sender.close()
            other.dispose()
        requests = list(api.requests)
    assert taken == ["claimed"]
    assert requests == []
    assert state(entry) == ("pending", "1:other", -1, 0, -1, [])
    assert "'r-race' was claimed by another sender since it was read" in caplog.text

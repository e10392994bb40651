"""The delivery outbox without Ray (docs/decisions.md#delivery-outbox,
docs/decisions.md#delivery-outage, docs/decisions.md#delivery-uncertain): queued rows in chat
order, a failing chat holding only itself, ``delivery.max_age_s``, uncertain steps and the
operator's retry, Retry-After parsing — on real SQLite (the ledger also on PostgreSQL) and the
platform-API stand-in over loopback; plus what one message costs in SQL write transactions."""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
from sqlalchemy import event

from runtime.delivery import ledger, outbox
from runtime.delivery.core import DeliverySender, DeliverySettings
from runtime.delivery.job import DeliveryJob
from runtime.delivery.send import full_jitter, parse_retry_after
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.reply.segments import Reply
from runtime.session.core import SessionCore
from runtime.session.message_cost import SQL_WRITES_PER_MESSAGE
from tests.actors.edge_support import BOT_ID, HoldingApiServer, onebot_bot, text_job
from tests.actors.session_scripts import ScriptedSetup
from tests.memory.pg_schema import create_schema, drop_schema
from tests.platform_api_server import PlatformApiServer
from tests.session.test_session_core import KEY, turn


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        database = Database(f"sqlite:///{tmp_path / 'outbox.db'}")
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


def queue(db: Database, job: DeliveryJob, created_at: int, partition: int = 0) -> None:
    """What a session host does in its ``im_reply`` transaction."""
    with db.connection(write=True) as conn:
        outbox.queue_writer(job, partition, created_at)(conn)


def group_job(text: str, reply_id: str, group: str = "30001") -> DeliveryJob:
    return DeliveryJob(
        reply_id=reply_id, session_key=f"onebot11:{BOT_ID}:group:{group}", platform="onebot11",
        bot_id=BOT_ID, scene_type="group", scene_id=group, reply=Reply.of_text(text),
    )  # fmt: skip


async def eventually(pred: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached within {timeout_s} s"
        await asyncio.sleep(0.02)


def texts(api: PlatformApiServer, path: str) -> list[str]:
    """Texts of the requests of ``path`` the stand-in answered 200, in arrival order."""
    return ["".join(s["data"].get("text", "") for s in r.json["message"]) for r in api.answered_ok(path)]


def state(db: Database, reply_id: str) -> str | None:
    entry = ledger.get_entry(db, reply_id)
    return entry.status if entry else None


def metric(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


# --------------------------------------------------------------------------- pieces


def test_retry_after_as_seconds_or_http_date_and_full_jitter() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("3", now) == 3.0
    assert parse_retry_after(" 0.25 ", now) == 0.25
    assert parse_retry_after(email.utils.formatdate(now + 7, usegmt=True), now) == 7.0
    assert parse_retry_after(email.utils.formatdate(now - 60, usegmt=True), now) == 0.0  # past: now
    assert parse_retry_after("soon", now) is None
    waits = [full_jitter(n, 0.5, 4.0) for n in (1, 2, 3, 4, 5, 6) for _ in range(200)]
    assert all(0 <= w <= 4.0 for w in waits) and max(waits[:200]) <= 0.5 and max(waits) > 2.0
    late = [full_jitter(n, 0.5, 4.0) for n in (1_025, 5_000, 10**9) for _ in range(50)]
    assert all(0 <= w <= 4.0 for w in late) and max(late) > 2.0  # at the cap, however many tries


def test_queued_rows_in_chat_order_claimed_in_one_update(db: Database) -> None:
    a1, a2, b1 = text_job("a1", reply_id="A1"), text_job("a2", reply_id="A2"), group_job("b1", "B1")
    queue(db, a1, 1_000_001)
    queue(db, b1, 1_000_001, partition=1)
    queue(db, a2, 1_000_002)
    queue(db, a1, 1_000_009)  # a replayed insert of the same reply is a no-op
    assert [e.reply_id for e in outbox.chat_queue(db, a1.session_key)] == ["A1", "A2"]
    assert outbox.chats_to_resume(db, 0, "0:x") == [a1.session_key]
    assert outbox.chats_to_resume(db, 1, "1:x") == [b1.session_key]
    claimed = ledger.claim_queued(db, "A1", "0:x", 60_000, steps_total=1)
    assert claimed is not None and (claimed.state, claimed.begun) == ("claimed", True)
    entry = claimed.entry
    assert (entry.status, entry.owner, entry.steps_total, entry.in_flight, entry.created_at) == (
        "pending", "0:x", 1, 0, 1_000_001,
    )  # fmt: skip
    assert ledger.claim_queued(db, "A1", "1:y", 60_000, steps_total=1).state == "busy"  # type: ignore[union-attr]
    ledger.finish_step(db, "A1", "0:x", 0, "m-1", last=True)
    assert [e.reply_id for e in outbox.chat_queue(db, a1.session_key)] == ["A2"]
    assert outbox.counts(db) == {"queued": 2, "pending": 0, "failed": 0, "uncertain": 0}
    assert ledger.claim_queued(db, "nope", "0:x", 60_000) is None


def test_a_fresh_queued_row_is_claimed_with_its_first_mark_once(db: Database) -> None:
    """``claim_fresh`` claims a queued row nobody worked on — with ``steps_total`` marking step 0
    on the wire in the same UPDATE — exactly once; a row worked on before, claimed since it was
    read, or missing is refused with nothing written (docs/decisions.md#delivery-outbox)."""
    a1, a2 = text_job("a1", reply_id="A1"), text_job("a2", reply_id="A2")
    queue(db, a1, 1_000_001)
    queue(db, a2, 1_000_002)
    read = outbox.chat_queue(db, a1.session_key)
    assert [(e.reply_id, ledger.fresh(e)) for e in read] == [("A1", True), ("A2", True)]

    marked = ledger.claim_fresh(db, "A1", "0:x", 60_000, 1_000_001, steps_total=2)
    assert (marked.status, marked.owner, marked.steps_total, marked.in_flight, marked.created_at) == (
        "pending", "0:x", 2, 0, 1_000_001,
    )  # fmt: skip
    with pytest.raises(ledger.LostLeaseError, match="claimed by another sender since it was read"):
        ledger.claim_fresh(db, "A1", "1:y", 60_000, 1_000_001, steps_total=2)  # read by another too
    assert getattr(ledger.get_entry(db, "A1"), "owner", None) == "0:x"
    assert not ledger.fresh(outbox.chat_queue(db, a1.session_key)[0])

    with pytest.raises(ledger.LostLeaseError):  # not the row as read: A2 is at 1_000_002
        ledger.claim_fresh(db, "A2", "0:x", 60_000, 1_000_001)
    claimed = ledger.claim_fresh(db, "A2", "0:x", 60_000, 1_000_002)  # before a retry's wait: no mark
    got = (claimed.status, claimed.owner, claimed.steps_total, claimed.in_flight)
    assert got == ("pending", "0:x", -1, -1)
    with pytest.raises(ledger.LostLeaseError):
        ledger.claim_fresh(db, "nope", "0:x", 60_000, 1_000_001, steps_total=1)
    with pytest.raises(ValueError, match="at least one step"):
        ledger.claim_fresh(db, "A2", "0:x", 60_000, 1_000_002, steps_total=0)


def test_a_queued_row_worked_on_before_is_not_fresh(db: Database) -> None:
    # an operator's retry queues a reply whose first step went out: claim_queued decides
    c1 = text_job("c1", scene_id="20003", reply_id="C1")
    queue(db, c1, 1_000_001)
    with db.connection(write=True) as conn:
        conn.execute(
            ledger.LEDGER_TABLE.update()
            .where(ledger.LEDGER_TABLE.c.reply_id == "C1")
            .values(steps_total=2, steps_done=1, message_ids='["m-1", null]')
        )
    head = outbox.chat_queue(db, c1.session_key)
    assert [(e.reply_id, e.status, ledger.fresh(e)) for e in head] == [("C1", "queued", False)]
    with pytest.raises(ledger.LostLeaseError):
        ledger.claim_fresh(db, "C1", "0:x", 60_000, 1_000_001, steps_total=2)
    assert getattr(ledger.get_entry(db, "C1"), "status", None) == "queued"
    taken = ledger.claim_queued(db, "C1", "0:x", 60_000)
    assert taken is not None and taken.state == "claimed" and taken.entry.steps_done == 1


def test_the_hand_over_knows_when_its_reply_is_the_chats_head(db: Database) -> None:
    """The queued row's insert reads the chat's latest unfinished row for its order; with none
    there the row is the chat's head (``QueuedRow.head_at`` = its ``created_at``), which the
    delivery actor may send without reading the queue. Never stored: the row's job has no
    ``head_at`` (docs/decisions.md#delivery-outbox)."""
    a1, a2, a3 = (text_job(t, reply_id=t.upper()) for t in ("a1", "a2", "a3"))

    def write(job: DeliveryJob, at: int) -> int | None:
        row = outbox.queue_writer(job, 0, at)
        with db.connection(write=True) as conn:
            row(conn)
        return row.head_at

    assert write(a1, 5_000) == 5_000  # nothing else unfinished in the chat
    assert write(group_job("b1", "B1"), 5_000) == 5_000  # another chat has its own head
    assert write(a2, 4_000) is None  # a1 is unfinished: a2 comes after it, read from the queue
    assert write(a1, 9_000) is None  # a replay of a1's hand-over inserts nothing
    ledger.claim_fresh(db, "A1", "0:x", 60_000, 5_000, steps_total=1)
    ledger.finish_step(db, "A1", "0:x", 0, "m-1", last=True)
    ledger.claim_fresh(db, "A2", "0:x", 60_000, 5_001, steps_total=1)
    ledger.finish_step(db, "A2", "0:x", 0, "m-2", last=True)
    assert write(a3, 9_000) == 9_000  # a1 and a2 are sent: a3 is the head again
    stored = ledger.get_entry(db, "A3")
    assert stored is not None and "head_at" not in json.loads(stored.job_json)
    noted = a3.model_copy(update={"head_at": 9_000})
    assert noted.head_at == 9_000 and "head_at" not in noted.model_dump_json()
    assert DeliveryJob.model_validate_json(noted.model_dump_json()).head_at is None


def test_hand_overs_in_one_millisecond_or_behind_the_clock_keep_hand_over_order(db: Database) -> None:
    """The chat's order is its hand-over order even when two rows get the same millisecond (CI:
    b1's random reply id sorted before b0's, so b1 went out first) or a later one an earlier
    time (a host with a clock behind): the ledger places each after the chat's unfinished rows
    (docs/decisions.md#delivery-outbox). A retried reply goes after them too."""
    ids = {"b0": "ffff-b0", "b1": "0000-b1", "b2": "8888-b2"}  # b1's id sorts first, b0's last
    b0, b1, b2 = (text_job(t, reply_id=r) for t, r in ids.items())
    other = group_job("c0", "0000-c0")
    queue(db, b0, 7_000)
    queue(db, b1, 7_000)  # the same millisecond; its reply id sorts first
    queue(db, other, 7_000)  # another chat: its own order, its own times
    queue(db, b2, 6_000)  # a clock behind

    def order(session_key: str) -> list[tuple[str, int]]:
        return [(e.reply_id, e.created_at) for e in outbox.chat_queue(db, session_key)]

    assert order(b0.session_key) == [("ffff-b0", 7_000), ("0000-b1", 7_001), ("8888-b2", 7_002)]
    assert order(other.session_key) == [("0000-c0", 7_000)]
    ledger.claim_queued(db, "ffff-b0", "0:x", 60_000)
    ledger.finish(db, "ffff-b0", "0:x", "failed", "HTTP 500")
    later = int(time.time() * 1000) + 600_000  # a row handed over by a host whose clock runs ahead
    b3 = text_job("b3", reply_id="0000-b3")
    queue(db, b3, later)
    assert outbox.retry(db, "ffff-b0") == ("failed", b0.session_key, 0)
    assert order(b0.session_key) == [
        ("0000-b1", 7_001), ("8888-b2", 7_002), ("0000-b3", later), ("ffff-b0", later + 1),
    ]  # fmt: skip


def test_uncertain_step_then_retry_resends_only_it(db: Database) -> None:
    job = text_job("x", reply_id="U1")
    queue(db, job, 5_000)
    ledger.claim_queued(db, "U1", "0:dead", 60_000, steps_total=3)  # step 0 on the wire, then died
    taken = ledger.claim_queued(db, "U1", "0:new", 60_000, steps_total=3)
    assert taken is not None and (taken.state, taken.begun, taken.entry.in_flight) == ("claimed", False, 0)
    assert ledger.record_uncertain(db, "U1", "0:new") == 0
    ledger.begin_step(db, "U1", "0:new", 1, 3, 60_000)
    ledger.finish_step(db, "U1", "0:new", 1, "m-1")
    ledger.begin_step(db, "U1", "0:new", 2, 3, 60_000)
    ledger.finish_step(db, "U1", "0:new", 2, "m-2", last=True, final="uncertain")
    [shown] = outbox.list_replies(db, ["uncertain"])
    assert (shown.reply_id, shown.state, shown.steps) == (
        "U1",
        "uncertain",
        {"total": 3, "done": 3, "uncertain": [0]},
    )
    assert ledger.claim_queued(db, "U1", "0:new", 60_000).state == "done"  # type: ignore[union-attr]
    with pytest.raises(LookupError):
        outbox.retry(db, "nope")
    assert outbox.retry(db, "U1") == ("uncertain", job.session_key, 0)
    with pytest.raises(outbox.NotRetryableError, match="is queued"):
        outbox.retry(db, "U1")
    again = ledger.claim_queued(db, "U1", "0:new", 60_000, steps_total=3)
    assert again is not None and (again.state, again.begun, again.resend, again.uncertain) == (
        "claimed",
        False,
        (0,),
        (),
    )
    ledger.begin_step(db, "U1", "0:new", 0, 3, 60_000)
    ledger.finish_step(db, "U1", "0:new", 0, "m-0", last=True, final="sent")
    entry = ledger.get_entry(db, "U1")
    assert entry is not None and (entry.status, entry.message_ids) == ("sent", ["m-0", "m-1", "m-2"])
    assert outbox.list_replies(db, ["sent"])[0].steps == {"total": 3, "done": 3, "uncertain": []}


# --------------------------------------------------------------------------- the sender


@pytest.fixture
def api(fixtures_dir: Path) -> Iterator[PlatformApiServer]:
    with PlatformApiServer(fixtures_dir, vary_message_ids=True) as server:
        yield server


async def make_sender(tmp_path: Path, api_base: str, **settings: Any) -> DeliverySender:
    bot = onebot_bot(api_base, forward_api=True)
    knobs = {"backoff_base_s": 0.01, "backoff_max_s": 0.1, **settings}
    url = f"sqlite:///{tmp_path / 'sender.db'}"
    return await asyncio.to_thread(
        DeliverySender, DeliverySettings(database_url=url, bots=[bot], **knobs), 0, "0:s"
    )


async def test_a_head_sent_by_the_sweeps_drain_meanwhile_is_not_sent_again(
    tmp_path: Path, api: PlatformApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A reply notified as its chat's head after the sweep's drain already sent it: the mark that
    would claim it finds the row taken, writes nothing and ends the call before the request is
    written; the chat's queue is read instead (nothing left) — one request in all."""
    sender = await make_sender(tmp_path, api.base_url)
    try:
        job = text_job("once", reply_id="H1")
        queue(sender.db, job, 1_000)
        sender.wake(job.session_key)  # the sweep: reads the queue, sends H1
        await eventually(lambda: state(sender.db, "H1") == "sent", "the sweep's send")
        caplog.set_level(logging.INFO, logger="sessionray.delivery")
        sender.wake(job.session_key, job.model_copy(update={"head_at": 1_000}))  # the late notice
        await eventually(lambda: "reading the chat's queue" in caplog.text, "the head's claim refused")
        await eventually(lambda: not sender.chains.active, "the drain's end")
        assert texts(api, "/send_private_msg") == ["once"] and len(api.requests) == 1
    finally:
        await sender.close()


async def test_a_stale_head_of_a_reply_retried_since_does_not_jump_the_chats_queue(
    tmp_path: Path, api: PlatformApiServer
) -> None:
    """h1 was notified as its chat's head, failed before any mark (refused until it expired:
    claimed, closed ``failed``) and was retried by an operator after r4 was queued — so it now
    comes after r4. Its old notice, still waiting in the chain, must not send it first: the mark
    claims only the row as it was notified (its ``created_at``), and the retried row has another;
    the queue is read instead (found by review; docs/decisions.md#delivery-outbox)."""
    sender = await make_sender(tmp_path, api.base_url)
    try:
        h1, r4 = text_job("h1", reply_id="H1"), text_job("r4", reply_id="R4")
        row = outbox.queue_writer(h1, 0, 1_000)
        with sender.db.connection(write=True) as conn:
            row(conn)
        assert row.head_at == 1_000
        ledger.claim_fresh(sender.db, "H1", "0:s", 60_000, 1_000)  # what _fail writes first
        ledger.finish(sender.db, "H1", "0:s", "failed", "gave up")
        queue(sender.db, r4, 2_000)
        outbox.retry(sender.db, "H1")
        assert [e.reply_id for e in outbox.chat_queue(sender.db, h1.session_key)] == ["R4", "H1"]
        sender.wake(h1.session_key, h1.model_copy(update={"head_at": 1_000}))  # the stale notice
        sender.wake(r4.session_key)  # r4's
        await eventually(lambda: state(sender.db, "H1") == state(sender.db, "R4") == "sent", "both")
        assert texts(api, "/send_private_msg") == ["r4", "h1"]
    finally:
        await sender.close()


async def test_heads_and_queued_replies_of_one_chat_go_out_in_hand_over_order(
    tmp_path: Path, api: PlatformApiServer
) -> None:
    """Notices as the session host sends them: h1 notified as the head; h2, handed over while h1
    was unfinished, notified without a job (read from the queue, after h1); h3, handed over once
    both were sent, as the head again."""
    sender = await make_sender(tmp_path, api.base_url)
    try:
        jobs = [text_job(t, reply_id=t.upper()) for t in ("h1", "h2", "h3")]
        heads = []
        for job in jobs[:2]:
            row = outbox.queue_writer(job, 0, 1_000)
            with sender.db.connection(write=True) as conn:
                row(conn)
            heads.append(row.head_at)
        assert heads == [1_000, None]
        sender.wake(jobs[0].session_key, jobs[0].model_copy(update={"head_at": 1_000}))
        sender.wake(jobs[1].session_key, jobs[1])  # no head_at: the queue is read
        await eventually(lambda: state(sender.db, "H2") == "sent", "h1 and h2")
        row = outbox.queue_writer(jobs[2], 0, 2_000)
        with sender.db.connection(write=True) as conn:
            row(conn)
        assert row.head_at == 2_000
        sender.wake(jobs[2].session_key, jobs[2].model_copy(update={"head_at": row.head_at}))
        await eventually(lambda: state(sender.db, "H3") == "sent", "h3")
        assert texts(api, "/send_private_msg") == ["h1", "h2", "h3"]
    finally:
        await sender.close()


async def test_a_failing_chat_holds_only_its_own_later_replies(
    tmp_path: Path, api: PlatformApiServer
) -> None:
    sender = await make_sender(tmp_path, api.base_url)
    try:
        a = [group_job(f"a{i}", f"A{i}") for i in (1, 2)]
        b = [text_job(f"b{i}", reply_id=f"B{i}") for i in (1, 2)]
        api.respond_with("/send_group_msg", 503, b"")  # chat A's platform path is down
        now = int(time.time() * 1000)
        for n, job in enumerate([a[0], b[0], a[1], b[1]]):
            queue(sender.db, job, now + n)
        sender.wake(a[0].session_key)
        sender.wake(b[0].session_key)
        await eventually(lambda: len(texts(api, "/send_private_msg")) == 2, "chat B's replies")
        assert texts(api, "/send_private_msg") == ["b1", "b2"]
        await eventually(lambda: any(r.path == "/send_group_msg" for r in api.requests), "chat A tried")
        assert texts(api, "/send_group_msg") == []
        assert (state(sender.db, "A1"), state(sender.db, "A2")) == ("pending", "queued")  # a2 waits behind a1
        api.reset_scripts()
        await eventually(lambda: state(sender.db, "A2") == "sent", "chat A after its outage")
        assert texts(api, "/send_group_msg") == ["a1", "a2"]
        assert [state(sender.db, r) for r in ("A1", "A2", "B1", "B2")] == ["sent"] * 4
    finally:
        await sender.close()


async def test_older_than_max_age_is_failed_listed_and_a_retry_sends_it_once(
    tmp_path: Path, api: PlatformApiServer
) -> None:
    before = metric("sessionray_delivery_failures_total", platform="onebot11", reason="expired")
    sender = await make_sender(tmp_path, api.base_url, max_age_s=0.5)
    try:
        job = text_job("late", reply_id="OLD-1")
        api.respond_with("/send_private_msg", 500, b"")
        queue(sender.db, job, int(time.time() * 1000))
        sender.wake(job.session_key)
        await eventually(lambda: state(sender.db, "OLD-1") == "failed", "the reply to fail")
        [shown] = outbox.list_replies(sender.db, ["failed"])
        assert shown.reply_id == "OLD-1" and "delivery.max_age_s=0.5" in (shown.error or "")
        # counted just after the ledger write that made the reply failed
        await eventually(
            lambda: (
                metric("sessionray_delivery_failures_total", platform="onebot11", reason="expired")
                == before + 1
            ),
            "the failure counted",
        )
        tries = len(api.requests)
        assert tries >= 2 and texts(api, "/send_private_msg") == []
        api.reset_scripts()
        assert outbox.retry(sender.db, "OLD-1")[0] == "failed"
        sender.wake(job.session_key)
        await eventually(lambda: state(sender.db, "OLD-1") == "sent", "the retried reply")
        assert texts(api, "/send_private_msg") == ["late"] and len(api.requests) == tries + 1
    finally:
        await sender.close()


FORWARD = Reply.model_validate(
    {"segments": [
        {"type": "text", "data": {"text": "a"}},
        {"type": "forward", "data": {"forward_id": "fw"}},
        {"type": "text", "data": {"text": "b"}},
    ]}
)  # fmt: skip
"""Three platform calls with a forward-capable OneBot bot: message, forward, message."""


async def test_a_dead_owners_step_is_uncertain_the_rest_goes_out_and_only_a_retry_resends_it(
    tmp_path: Path, api: PlatformApiServer
) -> None:
    sender = await make_sender(tmp_path, api.base_url)
    try:
        job = text_job("", reply_id="W1").model_copy(update={"reply": FORWARD})
        queue(sender.db, job, 20_000)
        ledger.claim_queued(sender.db, "W1", "0:dead", 600_000, steps_total=3)  # step 0 on the wire
        assert await sender.sweep() == 1  # the restarted incarnation of partition 0 takes it over
        await eventually(lambda: state(sender.db, "W1") == "uncertain", "the reply to end uncertain")
        assert [r.path for r in api.answered_ok()] == ["/send_private_forward_msg", "/send_private_msg"]
        [shown] = outbox.list_replies(sender.db, ["uncertain"])
        assert shown.steps == {"total": 3, "done": 3, "uncertain": [0]}
        assert await sender.sweep() == 0  # final: nothing resends it by itself
        outbox.retry(sender.db, "W1")
        sender.wake(job.session_key)
        await eventually(lambda: state(sender.db, "W1") == "sent", "the resent step")
        assert [(r.path, r.json.get("message")) for r in api.answered_ok()][2] == (
            "/send_private_msg", [{"type": "text", "data": {"text": "a"}}],
        )  # fmt: skip
        assert len(api.requests) == 3
        entry = ledger.get_entry(sender.db, "W1")
        assert entry is not None and None not in entry.message_ids and len(entry.message_ids) == 3
    finally:
        await sender.close()


async def test_a_call_written_and_never_answered_is_uncertain_not_resent(
    tmp_path: Path, fixtures_dir: Path
) -> None:
    with HoldingApiServer(fixtures_dir) as api:
        sender = await make_sender(tmp_path, api.base_url, timeout_s=0.5)
        try:
            result = await sender.deliver(text_job("held", reply_id="H1"))
            assert (result.outcome, result.attempts, result.message_ids) == ("uncertain", 1, [None])
            assert result.error is None and state(sender.db, "H1") == "uncertain"
            assert (await sender.deliver(text_job("held", reply_id="H1"))).outcome == "duplicate"
            assert len(api.requests) == 1
        finally:
            api.release()
            await sender.close()


# --------------------------------------------------------------------------- SQL writes per message


async def test_one_message_costs_the_documented_write_transactions(
    tmp_path: Path, api: PlatformApiServer
) -> None:
    """One message costs ``SQL_WRITES_PER_MESSAGE`` (3) SQL write transactions after the ingress
    stored it — the number docs/architecture.md quotes (tests/docs checks the quote): the staged
    inbound record and user message, the LLM call's staged usage row
    (docs/decisions.md#spend-ledger), the final assistant message and ``im_reply`` with the
    reply's ``queued`` ledger row (docs/decisions.md#session-turn-records); the delivery's claim
    and step 0's mark on the wire in one UPDATE, written as the request is (a sender killed before
    it leaves the row queued, a sender killed while connecting nothing uncertain:
    docs/decisions.md#delivery-outbox, docs/decisions.md#delivery-uncertain), after a read of the
    chat's queue that writes nothing; step done with the outbound transcript row."""
    url = f"sqlite:///{tmp_path / 'writes.db'}"
    db = Database(url)
    db.create_tables()
    sender = DeliverySender(DeliverySettings(database_url=url, bots=[onebot_bot(api.base_url)]), 0, "0:w")
    writes: list[list[str]] = []

    def record(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        words = statement.split()
        if words[:2] == ["BEGIN", "IMMEDIATE"]:
            writes.append([])
        elif writes and words[0] in ("INSERT", "UPDATE"):
            writes[-1].append(f"{words[0]} {words[2] if words[0] == 'INSERT' else words[1]}")

    sender_reads: list[str] = []

    def read(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        if statement.split() == ["BEGIN"]:  # a read transaction (writes: BEGIN IMMEDIATE)
            sender_reads.append(statement)

    async def notify(job: DeliveryJob) -> None:  # as a session host does (actors.placement.hosts.host)
        sender.wake(job.session_key, job)

    try:
        core = await SessionCore.open(
            KEY,
            ContextRepository(db),
            ScriptedSetup(str(tmp_path / "m"))(KEY),
            notify,
            max_concurrent_turns=1,
        )
        for engine in (db.engine, sender.db.engine):
            event.listen(engine, "before_cursor_execute", record)
        event.listen(sender.db.engine, "before_cursor_execute", read)
        result = await core.submit(turn(1, "hello"))
        await eventually(lambda: state(db, result.reply_id or "") == "sent", "the reply")
        await eventually(
            lambda: len(writes) == SQL_WRITES_PER_MESSAGE and len(writes[-1]) == 2, "the outbound transcript"
        )
    finally:
        await sender.close()
        db.dispose()
    assert writes == [
        # the staged im_inbound + user message, the final answer + im_reply, the LLM call's
        # staged usage row, the queued ledger row
        [
            "UPDATE agent_sessions",
            *["INSERT agent_messages"] * 4,
            "INSERT llm_usage",
            "INSERT delivery_ledger",
        ],
        ["UPDATE delivery_ledger"],  # claimed with step 0's mark on the wire, as its request is written
        ["UPDATE delivery_ledger", "INSERT im_transcripts"],  # step done, sent; the transcript
    ]
    assert sender_reads == []  # the chat's only reply is notified with its job: no queue read
    assert [json.loads(r.body)["message"][0]["data"]["text"] for r in api.requests] == ["re: hello"]

"""A session host's own sending of its chats' head replies, without Ray
(docs/decisions.md#delivery-in-host): :class:`runtime.delivery.in_host.HostSender` with a real
:class:`~runtime.delivery.core.DeliverySender` on the host's SQLite database, the platform-API
stand-in over loopback, and a second real sender in the place of the chat's delivery actor,
woken by the host's notifications as ``DeliveryPool.notify`` would."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runtime.delivery import ledger, outbox
from runtime.delivery.core import DeliverySender, DeliverySettings
from runtime.delivery.in_host import HostSender, host_owner
from runtime.delivery.job import DeliveryJob
from runtime.delivery.owners import incarnation_prefix
from runtime.memory.db import Database
from runtime.reply.segments import Reply
from tests.actors.edge_support import HoldingApiServer, onebot_bot, text_job
from tests.delivery.test_delivery_outbox import eventually, state, texts
from tests.platform_api_server import PlatformApiServer

HOST = host_owner("inc1", "abc123")


class Chat:
    """The host's :class:`HostSender` and the chat's delivery actor (a sender of partition 0,
    woken by the host's notifications), on one database."""

    def __init__(self, db: Database, api_base: str) -> None:
        bot = onebot_bot(api_base)
        settings = DeliverySettings(
            database_url=str(db.url), bots=[bot], backoff_base_s=0.01, backoff_max_s=0.1
        )
        self.db = db
        self.notified: list[tuple[str, str | None]] = []
        self.actor = DeliverySender(settings, 0, "0:d")
        self.host_sender = DeliverySender(settings, -1, HOST, db=db)

        def notify(key: str, head: DeliveryJob | None) -> None:
            self.notified.append((key, head.reply_id if head is not None else None))
            self.actor.wake(key, head)

        self.host = HostSender(lambda: self.host_sender, notify, partitions=1)

    def hand_over(self, job: DeliveryJob, created_at: int) -> DeliveryJob:
        """Queue ``job`` as the turn does (its ``im_reply`` transaction), then hand it over."""
        row = outbox.queue_writer(job, 0, created_at)
        with self.db.connection(write=True) as conn:
            row(conn)
        job = job.model_copy(update={"head_at": row.head_at})
        self.host.hand_over(job)
        return job

    async def close(self) -> None:
        await self.host.close(5.0)
        await self.actor.close()


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'host.db'}", threads=4, max_overflow=1)
    ledger.create_ledger_table(database)
    yield database
    database.dispose()


@pytest.fixture
def api(fixtures_dir: Path) -> AsyncIterator[PlatformApiServer]:
    with PlatformApiServer(fixtures_dir, vary_message_ids=True) as server:
        yield server


async def test_a_head_reply_is_sent_by_its_host_and_its_delivery_actor_is_not_told(
    db: Database, api: PlatformApiServer
) -> None:
    chat = Chat(db, api.base_url)
    try:
        job = chat.hand_over(text_job("hello", reply_id="H1"), 1_000)
        assert job.head_at == 1_000
        await eventually(lambda: state(db, "H1") == "sent", "the host's send")
        await eventually(lambda: chat.host.sending == 0, "the send's end")
        assert texts(api, "/send_private_msg") == ["hello"]
        entry = ledger.get_entry(db, "H1")
        assert entry is not None and entry.owner == HOST and entry.steps_done == 1
        assert chat.notified == []
    finally:
        await chat.close()


async def test_a_reply_handed_over_while_its_chats_head_is_on_the_wire_goes_after_it(
    db: Database, fixtures_dir: Path
) -> None:
    """h2 is handed over while h1, the head, waits for the platform's answer: h2 is no head, and
    the chat's delivery actor hears of it only once h1 is sent — then h2 follows h1."""
    with HoldingApiServer(fixtures_dir) as api:
        chat = Chat(db, api.base_url)
        try:
            chat.hand_over(text_job("h1", reply_id="H1"), 1_000)
            await asyncio.to_thread(api.received.wait, 30)
            h2 = chat.hand_over(text_job("h2", reply_id="H2"), 2_000)
            assert h2.head_at is None and chat.notified == []
            assert state(db, "H1") == "pending" and state(db, "H2") == "queued"
            api.release()
            await eventually(lambda: state(db, "H2") == "sent", "h2 after h1")
            assert texts(api, "/send_private_msg") == ["h1", "h2"]
            assert chat.notified == [(h2.session_key, None)]
            assert ledger.get_entry(db, "H2").owner == "0:d"  # type: ignore[union-attr]
        finally:
            await chat.close()


async def test_a_head_with_an_attachment_goes_to_its_delivery_actor_at_once(
    db: Database, api: PlatformApiServer
) -> None:
    chat = Chat(db, api.base_url)
    try:
        image = {
            "type": "image",
            "data": {"media": {"kind": "url", "value": "https://example.invalid/a.png"}},
        }
        reply = Reply.model_validate({"segments": [{"type": "text", "data": {"text": "see"}}, image]})
        job = chat.hand_over(text_job("x", reply_id="M1").model_copy(update={"reply": reply}), 1_000)
        assert job.head_at == 1_000
        assert chat.notified == [(job.session_key, "M1")] and chat.host.sending == 0
        await eventually(lambda: state(db, "M1") in ledger.FINAL, "the delivery actor's send")
        assert ledger.get_entry(db, "M1").owner == "0:d"  # type: ignore[union-attr]
    finally:
        await chat.close()


async def test_a_head_claimed_meanwhile_is_left_to_its_delivery_actor(
    db: Database, api: PlatformApiServer
) -> None:
    """The delivery actor's sweep took the head between its hand-over and the host's mark: the
    host's mark writes nothing and sends nothing; the actor is told to read the chat's queue."""
    chat = Chat(db, api.base_url)
    try:
        job = text_job("once", reply_id="S1")
        row = outbox.queue_writer(job, 0, 1_000)
        with db.connection(write=True) as conn:
            row(conn)
        ledger.claim_queued(db, "S1", "0:d", 60_000)  # the sweep's drain, not sent yet
        chat.host.hand_over(job.model_copy(update={"head_at": row.head_at}))
        await eventually(lambda: chat.notified == [(job.session_key, None)], "the notice to the actor")
        await eventually(lambda: state(db, "S1") == "sent", "the actor's send")
        assert texts(api, "/send_private_msg") == ["once"]
        assert ledger.get_entry(db, "S1").owner == "0:d"  # type: ignore[union-attr]
    finally:
        await chat.close()


async def test_a_dead_hosts_pending_reply_is_released_and_resumed_by_the_sweep(
    db: Database, api: PlatformApiServer
) -> None:
    """A host removed by the supervisor held a claimed reply whose step 0 was not on the wire:
    ``release_owner`` hands it to the chat's delivery actor, whose sweep sends it (before: nothing to
    take, the lease runs 60 s)."""
    chat = Chat(db, api.base_url)
    try:
        job = text_job("late", reply_id="D1")
        with db.connection(write=True) as conn:
            outbox.queue_writer(job, 0, 1_000)(conn)
        ledger.claim_queued(db, "D1", HOST, 60_000)
        await chat.actor.sweep()
        await eventually(lambda: not chat.actor.chains.active, "the sweep's drain")
        assert state(db, "D1") == "pending" and texts(api, "/send_private_msg") == []  # busy: a live lease
        assert (
            ledger.release_owner(db, HOST, partition=1, to="1:x", lease_ms=60_000) == 0
        )  # another partition's rows only
        assert (
            ledger.release_owner(db, HOST, partition=0, to="0:d", lease_ms=60_000) == 1
        )  # the chat's actor holds it now
        await chat.actor.sweep()
        await eventually(lambda: state(db, "D1") == "sent", "the take-over")
        assert texts(api, "/send_private_msg") == ["late"]
    finally:
        await chat.close()


def test_a_restarted_supervisor_releases_the_rows_of_every_host_but_its_own_incarnations(
    db: Database,
) -> None:
    """``release_dead_hosts`` (a host supervisor's start: docs/decisions.md#delivery-in-host) takes
    the pending rows of every host owner id without the new incarnation's prefix — the previous
    incarnation's, an earlier instance's without one — in its partition only; a row of one of
    its own hosts (one started meanwhile included), a delivery actor's row, a queued and a
    finished row stay as they are."""
    old, new = "0ld", "n3w"
    rows = {  # reply id → (partition, owner; None: left queued)
        "gone": (0, host_owner(old, "a1")),
        "gone-too": (0, host_owner(old, "a2")),
        "before-incarnations": (0, "host:a3"),
        "mine": (0, host_owner(new, "b1")),
        "actor": (0, "0:abc"),
        "queued": (0, None),
        "other-partition": (1, host_owner(old, "a1")),
        "sent": (0, host_owner(old, "a1")),
    }
    for i, (reply_id, (partition, owner)) in enumerate(rows.items()):
        with db.connection(write=True) as conn:
            outbox.queue_writer(text_job("x", scene_id=str(30_000 + i), reply_id=reply_id), partition, 1_000)(
                conn
            )
        if owner is not None:
            ledger.claim_queued(db, reply_id, owner, 60_000)
    ledger.finish(db, "sent", host_owner(old, "a1"), "sent", None)
    assert ledger.release_dead_hosts(db, incarnation_prefix(new), partition=0, to="0:d", lease_ms=60_000) == 3
    owners = {r: ledger.get_entry(db, r).owner for r in rows}  # type: ignore[union-attr]
    assert owners == {
        "gone": "0:d",
        "gone-too": "0:d",
        "before-incarnations": "0:d",
        "mine": host_owner(new, "b1"),
        "actor": "0:abc",
        "queued": "",
        "other-partition": host_owner(old, "a1"),
        "sent": host_owner(old, "a1"),
    }
    assert [state(db, r) for r in ("gone", "queued", "sent")] == ["pending", "queued", "sent"]


async def test_a_reply_its_actor_left_behind_the_hosts_head_is_sent_after_it(
    db: Database, fixtures_dir: Path
) -> None:
    """r2 was queued and notified elsewhere (a session moved to another host, an operator's
    retry) while this host's head h1 was on the wire: the actor's drain found h1 owned by a live
    host and left the chat. Once h1 is sent, the host reads the chat's queue and tells the actor
    — r2 goes out after h1, not at the next sweep (found by review)."""
    with HoldingApiServer(fixtures_dir) as api:
        chat = Chat(db, api.base_url)
        try:
            chat.hand_over(text_job("h1", reply_id="H1"), 1_000)
            await asyncio.to_thread(api.received.wait, 30)
            r2 = text_job("r2", reply_id="R2")
            with db.connection(write=True) as conn:
                outbox.queue_writer(r2, 0, 2_000)(conn)
            chat.actor.wake(r2.session_key)  # the other host's notice
            await eventually(lambda: not chat.actor.chains.active, "the actor's drain")
            assert state(db, "R2") == "queued"  # left: h1 is held by a live host
            api.release()
            await eventually(lambda: state(db, "R2") == "sent", "r2 after h1")
            assert texts(api, "/send_private_msg") == ["h1", "r2"]
            assert chat.notified == [(r2.session_key, None)]
        finally:
            await chat.close()


async def test_a_stopping_host_ends_its_leases_and_sends_nothing_more(
    db: Database, fixtures_dir: Path
) -> None:
    """The host stops while its head waits for the platform's answer: ``close`` returns within its
    wait, the stopped send ends (its chain's call is cancelled, not left hanging), the row it
    held has no lease left — the next sweep takes it — and a reply handed over after the stop
    goes to its delivery actor (found by review)."""
    with HoldingApiServer(fixtures_dir) as api:
        chat = Chat(db, api.base_url)
        try:
            chat.hand_over(text_job("h1", reply_id="H1"), 1_000)
            await asyncio.to_thread(api.received.wait, 30)
            await asyncio.wait_for(chat.host.close(0.2), 10)
            await eventually(lambda: chat.host.sending == 0, "the stopped send's end")
            entry = ledger.get_entry(db, "H1")
            assert entry is not None and entry.status == "pending" and entry.owner == HOST
            assert entry.lease_until == 0
            api.release()
            other = text_job("after", scene_id="20003", reply_id="A1")
            chat.hand_over(other, 2_000)
            assert (other.session_key, "A1") in chat.notified
            await eventually(lambda: state(db, "A1") == "sent", "the actor's send")
        finally:
            await chat.actor.close()


def test_hosts_that_send_take_a_share_of_a_bots_connections() -> None:
    from runtime.config import RuntimeConfig
    from runtime.delivery.settings import senders

    assert senders(RuntimeConfig(delivery_actors=2)) == 2  # the pool alone
    assert senders(RuntimeConfig(delivery_actors=1, min_hosts=1, deliver_in_host=True)) == 2
    assert senders(None) == 1

"""What one message costs in Ray actor calls, counted on a real local Ray run: the figure
docs/architecture.md quotes (``RAY_CALLS_PER_MESSAGE``; tests/docs checks the quote).

A session is made live and cached by a first message; the second message of the same chat is
counted in this process (the ingress) and in the session host's process
(:mod:`tests.actors.ray_calls`) from its submit until its reply reached the platform stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select

from actors.placement.submit import RAY_CALLS_PER_MESSAGE
from runtime.delivery import ledger, outbox
from runtime.delivery.tables import DeliveryLedgerRow
from runtime.memory.db import Database
from tests.actors.edge_support import BOT_ID, text_job
from tests.actors.ray_calls import CountingSetup, count_calls, host_calls
from tests.actors.session_support import Harness, eventually, inbound, running_runtime, submit_until_accepted

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    tmp = tmp_path_factory.mktemp("ray-calls")
    with running_runtime(tmp, fixtures_dir, setup=CountingSetup(str(tmp / "markers"))) as harness:
        yield harness


async def test_a_message_to_a_live_cached_session_costs_the_documented_ray_calls(h: Harness) -> None:
    user = "70001"
    await submit_until_accepted(h.rt, inbound(user, "hello"))  # places the session, caches its host
    await eventually(lambda: h.sent(user) == ["re: hello"], 120, "the first reply")
    await eventually(lambda: "DeliveryActor.notify" in host_calls(h.markers), 60, "the first notify")
    before = len(host_calls(h.markers))

    ingress: list[str] = []
    undo = count_calls(ingress.append)
    try:
        assert (await h.rt.submit(inbound(user, "again"))).status == "accepted"
        await eventually(lambda: h.sent(user) == ["re: hello", "re: again"], 120, "the second reply")
        await eventually(lambda: len(host_calls(h.markers)) > before, 60, "the host's calls")
    finally:
        undo()
    host = host_calls(h.markers)[before:]

    assert ingress == ["SessionHost.submit"]  # cache hit: no router shard call
    assert host == ["DeliveryActor.notify"]  # the hand-over's notice; the turn does not wait for it
    assert len(ingress) + len(host) == RAY_CALLS_PER_MESSAGE


@pytest.fixture(scope="module")
def in_host(
    ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path
) -> Iterator[Harness]:
    tmp = tmp_path_factory.mktemp("ray-calls-in-host")
    setup = CountingSetup(str(tmp / "markers"))
    with running_runtime(tmp, fixtures_dir, setup=setup, deliver_in_host=True) as harness:
        yield harness


async def test_a_host_that_sends_its_chats_head_replies_itself_makes_no_delivery_call(
    in_host: Harness,
) -> None:
    """``runtime.deliver_in_host`` (the single-machine profile's; docs/decisions.md#delivery-in-host):
    the reply is its chat's only unfinished one, so the session host sends it in its own process,
    under its own ledger owner id — one Ray call for the message, the ingress's submit."""
    h, user = in_host, "70002"
    await submit_until_accepted(h.rt, inbound(user, "hello"))
    await eventually(lambda: h.sent(user) == ["re: hello"], 120, "the first reply")
    ingress: list[str] = []
    undo = count_calls(ingress.append)
    try:
        assert (await h.rt.submit(inbound(user, "again"))).status == "accepted"
        await eventually(lambda: h.sent(user) == ["re: hello", "re: again"], 120, "the second reply")
    finally:
        undo()
    assert ingress == ["SessionHost.submit"]
    assert host_calls(h.markers) == []  # no DeliveryActor.notify for either message
    db = Database(str(h.config.database.url))
    try:
        with db.session() as s:
            key = f"onebot11:{BOT_ID}:private:{user}"
            rows = s.exec(select(DeliveryLedgerRow).where(DeliveryLedgerRow.session_key == key)).all()
            found = sorted((r.status, r.owner.split(":")[0]) for r in rows)
    finally:
        db.dispose()
    assert found == [("sent", "host"), ("sent", "host")]


async def test_the_delivery_actors_take_over_the_replies_of_a_removed_host(in_host: Harness) -> None:
    """A host the supervisor removed held a claimed reply (not on the wire yet): the pool's
    ``take_over`` of its owner id ends the lease, and the chat's delivery actor sends it now,
    not when the 60 s lease runs out."""
    h, user = in_host, "70003"
    job = text_job("left behind", scene_id=user, reply_id="T1")
    db = Database(str(h.config.database.url))
    try:
        with db.connection(write=True) as conn:
            outbox.queue_writer(job, 0, 1_000)(conn)
        ledger.claim_queued(db, "T1", "host:gone", 60_000)
        h.rt.delivery.take_over("host:gone")
        await eventually(lambda: h.sent(user) == ["left behind"], 60, "the take-over's send")
        sent = lambda: (e := ledger.get_entry(db, "T1")) is not None and e.status == "sent" and e  # noqa: E731
        entry = await eventually(sent, 30, "the close")
        assert entry.owner.startswith("0:") and entry.steps_done == 1
    finally:
        db.dispose()


async def test_a_crashed_supervisor_hands_the_replies_its_hosts_held_to_the_delivery_actors(
    in_host: Harness,
) -> None:
    """The host supervisor is killed and restarted by Ray; the hosts it owned died with it. A reply
    such a host had claimed (not on the wire) is sent once the new incarnation starts, not after
    its 60 s lease and the next sweep (chaos CI ``supervisor_kill``: a chat's later replies waited
    behind it past the 60 s drain). Last in this module: it kills the module runtime's hosts."""
    import ray

    h, user, text = in_host, "70004", "held by a host that died with its supervisor"
    job = text_job(text, scene_id=user, reply_id="T2")
    db = Database(str(h.config.database.url))
    try:
        with db.connection(write=True) as conn:
            outbox.queue_writer(job, 0, 1_000)(conn)
        assert ledger.claim_queued(db, "T2", "host:0ld:died-with-the-supervisor", 60_000) is not None
        ray.kill(h.rt.hosts, no_restart=False)  # a crash: Ray restarts the detached supervisor
        await eventually(lambda: h.sent(user) == [text], 40, "the send after the supervisor's restart")
        sent = lambda: (e := ledger.get_entry(db, "T2")) is not None and e.status == "sent" and e  # noqa: E731
        entry = await eventually(sent, 30, "the close")
        assert entry.owner.startswith("0:") and entry.steps_done == 1
    finally:
        db.dispose()

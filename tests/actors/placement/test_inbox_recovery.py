"""The durable inbox on real local Ray, over real HTTP and SQLite (docs/decisions.md#inbox-durable):
a message stored while its router shard is down is answered ``queued`` and, once a shard is back,
answered exactly once; rows an ingress stored and never routed (its process gone) are answered
once each, in per-chat order, by the recovery pass a starting shard runs at once; a row whose
turn already ran is not run again; an expired row is never replayed; a shard restarted by Ray
after kill -9 replays by itself.

One runtime + ingress for the module (scripted model: ``re: <text>``); each test uses its own
chats (OneBot user ids) and message ids."""

from __future__ import annotations

import inspect
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import ray
from sqlalchemy import update

from actors.inbound.ingress import build_app
from actors.placement.router import shard_of
from runtime.memory.db import Database
from runtime.memory.inbox import InboxRow, InboxStore, get_row
from runtime.platforms.base import InboundMessage, Sender
from tests.actors.edge_support import (
    BOT_ID,
    IngressHarness,
    onebot_event,
    private_call,
    running_ingress,
    serve_in_thread,
    signed,
)
from tests.actors.session_support import eventually, key_of

pytestmark = pytest.mark.ray

_T = InboxRow.__table__  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def h(
    ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path
) -> Iterator[IngressHarness]:
    with running_ingress(tmp_path_factory.mktemp("inbox"), fixtures_dir) as harness:
        yield harness


@pytest.fixture
def db(h: IngressHarness) -> Iterator[Database]:
    database = Database(h.db_url, threads=1)
    try:
        yield database
    finally:
        database.dispose()


def post(h: IngressHarness, user: str, text: str, message_id: int, url: str | None = None) -> tuple[int, str]:
    body = onebot_event(h.api.fixtures_dir, user, text, message_id)
    hook = f"{url or h.url}/webhooks/onebot11/{BOT_ID}"
    resp = httpx.post(hook, content=body, headers=signed(body), timeout=60)
    return resp.status_code, resp.json().get("status", "")


def sent_texts(h: IngressHarness, user: str) -> list[str]:
    return [
        r.json["message"][0]["data"]["text"]
        for r in list(h.api.requests)
        if r.path == "/send_private_msg" and str(r.json["user_id"]) == user
    ]


def states(db: Database, user: str) -> list[tuple[str, str]]:
    """``(message_id, state)`` of ``user``'s inbox rows, in inbox order."""
    with db.connection() as conn:
        rows = conn.execute(_T.select().where(_T.c.session_key == key_of(user)).order_by(_T.c.id)).all()
    return [(r.message_id, r.state) for r in rows]


async def user_texts(h: IngressHarness, user: str) -> list[str]:
    """The user messages of ``user``'s live context (one per turn that ran)."""
    ctx = await h.runtime.context(key_of(user))
    return [m["content"] for m in ctx if m["role"] == "user"]


async def all_handled(db: Database, user: str, n: int) -> None:
    await eventually(
        lambda: [s for _, s in states(db, user)] == ["handled"] * n, 60, f"{user}'s rows handled"
    )


def message(user: str, text: str, message_id: str) -> InboundMessage:
    return InboundMessage(
        platform="onebot11",
        bot_id=BOT_ID,
        message_id=message_id,
        scene_type="private",
        scene_id=user,
        sender=Sender(id=user, name=f"user{user}"),
        text=text,
        segments=[{"type": "text", "data": {"text": text}}],
        time_ms=int(time.time() * 1000),
    )


async def store_directly(db: Database, msg: InboundMessage, *, age_s: float, state: str = "stored") -> None:
    """Store ``msg`` as an ingress does, ``age_s`` seconds ago and in ``state`` (as left by an
    ingress process that died before routing it, or before its marks were written)."""
    stored = await InboxStore(db).store(
        platform=msg.platform,
        bot_id=msg.bot_id,
        message_id=msg.message_id,
        session_key=msg.session_key,
        message_json=msg.model_dump_json(),
    )
    assert stored.stored
    when = int((time.time() - age_s) * 1000)
    with db.connection(write=True) as conn:
        conn.execute(update(_T).where(_T.c.id == stored.row_id).values(received_at=when, state=state))


async def stop_shards(h: IngressHarness) -> None:
    """Kill the router shards for good (no restart) and wait until their names are free."""
    rt = h.runtime
    for router in rt.routers:
        ray.kill(router, no_restart=True)

    def gone() -> bool:
        try:
            ray.get_actor(rt.router_name(0), namespace="sessionray")
        except ValueError:
            return True
        return False

    await eventually(gone, 30, "the shard's name is free")


async def start_shards(h: IngressHarness) -> None:
    """Start the runtime again (hosts and delivery are still there): a new shard incarnation,
    whose first recovery pass runs at once."""
    await h.runtime.start(h.config, delivery=h.runtime.delivery)


async def test_stored_while_the_router_is_down_then_answered_once(h: IngressHarness, db: Database) -> None:
    user = "300000001"
    assert shard_of(key_of(user), 1) == 0
    await stop_shards(h)
    # a chat the ingress has no placement for: its submit must ask the (dead) shard
    assert post(h, user, "while down", 90001) == (200, "queued")
    assert post(h, user, "while down", 90001) == (200, "duplicate")  # the redelivery: stored once
    assert post(h, user, "and after", 90002) == (200, "queued")  # held behind the first (chat order)
    assert states(db, user) == [("90001", "stored"), ("90002", "stored")]
    await start_shards(h)
    await eventually(lambda: len(sent_texts(h, user)) >= 2, 60, "the replies")
    await all_handled(db, user, 2)
    assert sent_texts(h, user) == ["re: while down", "re: and after"]
    assert await user_texts(h, user) == ["while down", "and after"]  # one turn each
    # the chat is no longer held: the next message goes straight to its host
    assert post(h, user, "live again", 90003) == (200, "accepted")
    await eventually(lambda: len(sent_texts(h, user)) == 3, 60, "the third reply")
    assert h.api.requests[-1].json == private_call(user, "re: live again")


async def test_a_starting_shard_answers_what_a_dead_ingress_stored_once_in_chat_order(
    h: IngressHarness, db: Database
) -> None:
    users = ["300000011", "300000012"]
    done_user = "300000013"
    # a message answered normally, whose "handled" mark was lost with its ingress process
    assert post(h, done_user, "already answered", 91000) == (200, "accepted")
    await all_handled(db, done_user, 1)
    await stop_shards(h)
    with db.connection(write=True) as conn:
        conn.execute(update(_T).where(_T.c.session_key == key_of(done_user)).values(state="routed"))
    # what an ingress stored (and partly marked routed) before its process died, interleaved
    for i in range(3):
        for user in users:
            state = "routed" if i == 0 and user == users[0] else "stored"
            await store_directly(db, message(user, f"{user} #{i}", f"{user}-{i}"), age_s=10 - i, state=state)
    # a new ingress process finds those chats' open rows and holds their new messages behind them
    with serve_in_thread(build_app(h.runtime, h.config)) as url:
        assert post(h, users[0], f"{users[0]} late", 91001, url) == (200, "queued")
    expected = {users[0]: [f"{users[0]} #{i}" for i in range(3)] + [f"{users[0]} late"]}
    expected[users[1]] = [f"{users[1]} #{i}" for i in range(3)]
    await start_shards(h)
    for user, texts in expected.items():
        n = len(texts)
        await eventually(lambda u=user, n=n: len(sent_texts(h, u)) >= n, 60, f"{user}'s replies")
        await all_handled(db, user, n)
    await all_handled(db, done_user, 1)
    for user, texts in expected.items():
        assert sent_texts(h, user) == [f"re: {t}" for t in texts]
        assert await user_texts(h, user) == texts
    assert sent_texts(h, done_user) == ["re: already answered"]
    assert await user_texts(h, done_user) == ["already answered"]  # no second turn
    status = await h.runtime.routers[0].inbox_status.remote()
    assert (status["resubmitted"], status["failed"]) == (7, 0)


async def test_an_expired_row_is_never_replayed(h: IngressHarness, db: Database) -> None:
    user = "300000021"
    window = h.config.runtime.replay_window_s
    router = h.runtime.routers[0]
    before = await router.inbox_status.remote()
    await store_directly(db, message(user, "too old", "expired-1"), age_s=window + 60)
    after = await router.recover_now.remote()  # one whole pass, now
    assert after["expired"] == before["expired"] + 1
    assert after["resubmitted"] == before["resubmitted"]
    row = await db.run(lambda: get_row(db, "onebot11", BOT_ID, "expired-1"))
    assert row is not None and (row.state, row.attempts) == ("expired", 0)
    assert sent_texts(h, user) == []
    assert await h.runtime.session(key_of(user)) is None  # never even placed


async def test_a_shard_restarted_after_kill_9_replays_without_being_called(
    h: IngressHarness, db: Database
) -> None:
    """Ray restarts a SIGKILLed shard; its new incarnation starts its recovery loop by itself
    (nobody calls the shard here) and answers what is left in the inbox."""
    user = "300000031"
    os.kill(await h.runtime.routers[0].pid.remote(), signal.SIGKILL)
    await store_directly(db, message(user, "after the crash", "crash-1"), age_s=10)
    await eventually(lambda: sent_texts(h, user) == ["re: after the crash"], 120, "the reply")
    await all_handled(db, user, 1)
    assert await user_texts(h, user) == ["after the crash"]


async def test_a_held_chat_under_steady_load_returns_to_the_direct_path_in_order(
    h: IngressHarness, db: Database
) -> None:
    """What a restart leaves: a chat with an open row and a new ingress process that holds the
    chat behind it. Messages that keep coming are answered ``accepted`` (the direct path) once
    the held row is handled, not ``queued`` for as long as the load lasts; all in chat order."""
    user = "300000041"
    await store_directly(db, message(user, "left by the restart", "held-0"), age_s=0)
    answers: list[tuple[int, str]] = []
    with serve_in_thread(build_app(h.runtime, h.config)) as url:
        for i in range(1, 400):  # back to back, no pause: the chat's load never stops
            answers.append((i, post(h, user, f"steady {i}", 92000 + i, url)[1]))
            if dict(states(db, user))["held-0"] == "handled":
                break
        assert dict(states(db, user))["held-0"] == "handled", "the held row was never handled"
        drained_at = len(answers)
        for i in range(drained_at + 1, drained_at + 6):
            answers.append((i, post(h, user, f"steady {i}", 92000 + i, url)[1]))
    after = [status for i, status in answers if i > drained_at]
    assert after == ["accepted"] * 5
    texts = ["left by the restart"] + [f"steady {i}" for i, _ in answers]
    await eventually(lambda: len(sent_texts(h, user)) >= len(texts), 120, f"{user}'s replies")
    assert sent_texts(h, user) == [f"re: {t}" for t in texts]
    assert await user_texts(h, user) == texts


async def test_in_flight_counts_the_turns_the_recovery_loop_started(h: IngressHarness, db: Database) -> None:
    """``in_flight()`` (what a SIGTERM's drain waits for) counts every turn of the instance: here one
    that a router shard's recovery loop started, which this process never submitted."""
    user = "300000051"
    markers = Path(h.db_url.removeprefix("sqlite:///")).parent / "markers"
    gate = f"recovered-{user}"
    await store_directly(db, message(user, f"block {gate}", "in-flight-1"), age_s=10)
    await h.runtime.routers[0].recover_now.remote()
    await eventually(lambda: (markers / f"gate-{gate}.waiting").exists(), 60, "the recovered turn runs")

    async def in_flight() -> int:
        n = h.runtime.in_flight()
        return int(await n if inspect.isawaitable(n) else n)

    assert ((await h.runtime.status())["pending"], await in_flight()) == (0, 1)
    (markers / f"gate-{gate}.open").write_text("")
    await all_handled(db, user, 1)
    assert await in_flight() == 0

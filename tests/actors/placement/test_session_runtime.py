"""The session runtime on real local Ray: ordering, steer, follow-up, dedup, backpressure.

One runtime per host mode (``packed``: the sessions share a host; ``strict``: each live session its
own host process) for the module: 1 router shard, at most 8 live sessions, mailbox of 4, one
delivery actor, the platform-API test server; each test uses its own chat ids. Replies are
asserted where they leave the system: the platform API calls."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from actors.placement.runtime import NotMasterError, SessionRuntime, UnknownSessionError
from runtime.config.ai import CoalesceConfig
from runtime.memory.db import Database
from tests.actors.edge_support import BOT_ID
from tests.actors.session_scripts import ScriptedSetup
from tests.actors.session_support import (
    MASTER,
    MODES,
    Harness,
    eventually,
    inbound,
    key_of,
    running_runtime,
    submit_until_accepted,
)

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", params=list(MODES))
def h(
    request: pytest.FixtureRequest,
    ray_session: None,
    tmp_path_factory: pytest.TempPathFactory,
    fixtures_dir: Path,
) -> Iterator[Harness]:
    tmp = tmp_path_factory.mktemp(f"runtime-{request.param}")
    with running_runtime(
        tmp,
        fixtures_dir,
        setup=ScriptedSetup(str(tmp / "markers"), coalesce=CoalesceConfig()),  # groups coalesce
        mailbox_size=4,
        max_live_sessions=8,
        idle_ttl_s=120,
        **MODES[request.param],
    ) as harness:
        yield harness


async def test_twenty_sessions_ten_messages_each_keep_per_chat_order(h: Harness) -> None:
    users = [str(30000 + i) for i in range(20)]

    async def chat(user: str) -> int:
        busy = 0
        for i in range(10):
            busy += await submit_until_accepted(h.rt, inbound(user, f"{user}-{i}"), timeout_s=300)
        return busy

    await asyncio.gather(*(chat(u) for u in users))
    await eventually(lambda: all(len(h.sent(u)) == 10 for u in users), 300, "200 replies")
    for u in users:
        assert h.sent(u) == [f"re: {u}-{i}" for i in range(10)]
    # 20 chats over a cap of 8 live sessions: the idle ones were LRU-passivated, nothing was lost
    status = await h.rt.status()
    assert status["live_sessions"] <= 8
    assert status["shards"][0]["forgotten"] >= 12  # the host told the shard of each LRU passivation
    assert status["supervisor"]["live"] <= 8 or status["supervisor"]["hosts"] == 1
    assert (status["submit"]["errors"], status["submit"]["lost"]) == (0, 0)


async def test_steer_as_master_reaches_the_next_llm_call(h: Harness) -> None:
    user = "40001"
    assert (await h.rt.submit(inbound(user, "slow 1.5"))).status == "accepted"
    await eventually(lambda: h.tool_starts() >= 1, 120, "the slow tool to start")
    assert await h.rt.steer(key_of(user), "answer in French", MASTER) == "steered"
    await eventually(lambda: h.sent(user), 120, "the reply")
    assert h.sent(user) == ["tool: slept 1.5; then: ['answer in French']"]


async def test_steer_and_follow_up_from_a_non_master_are_refused_and_counted(h: Harness) -> None:
    user = "40002"
    await submit_until_accepted(h.rt, inbound(user, "hello"))
    await eventually(lambda: h.sent(user), 120, "the reply")
    before = await refused_count(h)
    with pytest.raises(NotMasterError, match="not a master"):
        await h.rt.steer(key_of(user), "do something else", user)
    with pytest.raises(NotMasterError, match="not a master"):
        await h.rt.follow_up(key_of(user), "and more", user)
    assert await refused_count(h) == before + 2
    with pytest.raises(UnknownSessionError):
        await h.rt.steer(key_of("49999"), "anyone?", MASTER)
    assert h.sent(user) == ["re: hello"]


async def refused_count(h: Harness) -> int:
    """Steer/follow-up refusals counted by the router shards (also exported as
    ``sessionray_control_total{outcome="refused"}``)."""
    return sum(int(s["refused"]) for s in (await h.rt.status())["shards"])


async def test_follow_up_runs_after_the_current_turn_with_its_own_reply(h: Harness) -> None:
    user = "40003"
    await h.rt.submit(inbound(user, "slow 1"))
    await eventually(lambda: h.tool_starts() >= 2, 120, "the slow tool to start")
    assert await h.rt.follow_up(key_of(user), "echo and one more thing", MASTER) == "queued"
    await eventually(lambda: len(h.sent(user)) == 2, 120, "two replies")
    assert h.sent(user) == ["tool: slept 1; then: []", "and one more thing"]
    # with no running turn, a follow-up runs at once
    await eventually(lambda: idle(h, user), 120, "the session to be idle")
    assert await h.rt.follow_up(key_of(user), "echo later", MASTER) == "started"
    await eventually(lambda: len(h.sent(user)) == 3, 120, "the third reply")
    assert h.sent(user)[2] == "later"


async def idle(h: Harness, user: str) -> bool:
    info = await h.rt.session(key_of(user))
    return info is not None and info.actor is not None and info.actor["active_turns"] == 0


async def test_a_redelivered_event_gets_one_turn(h: Harness) -> None:
    user = "40004"
    msg = inbound(user, "only once", message_id="dup-1")
    results = [await h.rt.submit(msg) for _ in range(3)]
    assert [r.status for r in results] == ["accepted", "duplicate", "duplicate"]
    await eventually(lambda: h.sent(user), 120, "the reply")
    ctx = await h.rt.context(key_of(user))
    assert [m["content"] for m in ctx if m["role"] == "user"] == ["only once"]
    assert h.sent(user) == ["re: only once"]


async def test_a_full_mailbox_answers_busy_and_the_retry_succeeds(h: Harness) -> None:
    user = "40005"
    for i in range(4):  # mailbox_size = 4: four slow turns pending
        assert (await h.rt.submit(inbound(user, f"slow 2.{i}"))).status == "accepted"
    refused = await h.rt.submit(inbound(user, "echo fifth", message_id="fifth"))
    assert (refused.status, refused.retry_after_s) == ("busy", 1.0)
    busy = await submit_until_accepted(h.rt, inbound(user, "echo fifth", message_id="fifth"))
    assert busy >= 1  # the retry waited for a slot; a refused message was never accepted
    await eventually(lambda: len(h.sent(user)) == 5, 120, "five replies")
    assert h.sent(user) == [
        "tool: slept 2; then: []",
        "tool: slept 2.1; then: []",
        "tool: slept 2.2; then: []",
        "tool: slept 2.3; then: []",
        "fifth",
    ]


async def test_status_reports_hosts_and_sessions(h: Harness) -> None:
    # a session of its own, just used (which idle session made room for earlier ones depends on
    # the host mode: the router passivates on the least loaded host)
    user = "40007"
    await submit_until_accepted(h.rt, inbound(user, "hello"))
    await eventually(lambda: h.sent(user), 120, "the reply")
    status = await h.rt.status()
    assert status["hosts"] == status["supervisor"]["hosts"] >= 1
    assert status["live_sessions"] == len(await h.rt.sessions())
    key = key_of(user)
    info = await h.rt.session(key)
    assert info is not None and info.actor is not None
    assert (info.session_key, info.actor["session_key"]) == (key, key)
    assert isinstance(h.rt, SessionRuntime)


async def test_run_deferred_task_runs_as_a_ray_task_and_replies_separately(h: Harness) -> None:
    user = "40006"
    assert (await h.rt.submit(inbound(user, "defer square 3"))).status == "accepted"
    await eventually(lambda: len(h.sent(user)) == 2, 120, "the reply and the deferred result")
    started = "started deferred task square; its result will be sent to the chat as a separate message"
    first, second = h.sent(user)
    assert first == f"tool: {started}; then: []"
    assert second.startswith("square of 3 is 9 (pid ")
    info = await h.rt.session(key_of(user))
    assert info is not None and info.actor is not None
    assert int(second.removesuffix(")").split("pid ")[1]) != info.actor["pid"]  # ran outside the actor


async def test_a_hot_group_answers_what_waited_in_one_batch(h: Harness) -> None:
    # docs/decisions.md#session-hot-chat-coalescing through a session host: three mentions that
    # arrive while the group's turn holds its (gated) tool are one batch turn, one reply
    group = "55501"
    key = f"onebot11:{BOT_ID}:group:{group}"
    assert (await h.rt.submit(inbound("41001", "block hot1", group=group))).status == "accepted"
    await eventually(lambda: h.gate_waiting("hot1"), 120, "the first turn holding its tool")
    asks = [inbound(user, f"ask {i}", group=group) for i, user in enumerate(("41002", "41003", "41004"))]
    for msg in asks:
        assert (await h.rt.submit(msg)).status == "accepted"
    h.open_gate("hot1")

    async def all_answered() -> list[dict[str, Any]] | None:
        ctx = await h.rt.context(key)
        got = [m["data"] for m in ctx if m.get("role") == "custom" and m.get("custom_type") == "im_reply"]
        return got if len(got) == 4 else None

    done = await eventually(all_answered, 120, "every message answered")
    by_message = {d["message_id"]: d["reply_id"] for d in done}
    batch_id = by_message[asks[0].message_id]
    assert [by_message[m.message_id] for m in asks] == [batch_id] * 3
    assert batch_id.endswith(f"/{asks[0].message_id}")
    with Database(h.config.database.url).connection() as conn:
        rows = conn.execute(text("SELECT count(*) FROM delivery_ledger WHERE session_key = :k"), {"k": key})
        assert rows.scalar_one() == 2  # two replies for four mentions
    await eventually(lambda: len(group_sent(h, group)) == 2, 120, "both replies sent")
    first, batch = group_sent(h, group)
    assert first == "tool: released hot1; then: []"
    assert batch.startswith("re: [sender:id=41004 ") and batch.endswith("] ask 2")  # the batch's last


def group_sent(h: Harness, group: str) -> list[str]:
    """Texts the platform API received for ``group``, in arrival order."""
    return [
        "".join(seg["data"].get("text", "") for seg in r.json["message"])
        for r in list(h.api.requests)
        if r.path == "/send_group_msg" and str(r.json.get("group_id")) == group
    ]

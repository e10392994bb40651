"""Many sessions on one session host (packed mode), real local Ray (docs/decisions.md#session-lifecycle,
docs/decisions.md#session-crash-recovery):

* a slow tool in one session — a plain, blocking function (run in a worker thread) or a coroutine —
  does not hold up 50 other sessions of the same host: all their replies arrive while it still
  waits (ordered by the scripted gated tools' marker files, not by wall-clock time);
* a steer reaches a session whose host is busy with other sessions' turns;
* 500 sessions live at once, two messages each, every chat's replies in order;
* kill -9 of a host with 20 sessions mid-turn: every accepted message is answered exactly once
  and no tool runs twice.

One runtime for the module: one host ahead of need, room for 600 live sessions, so all sessions
of a test share one host process (asserted)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.session.turn import INTERRUPTED_TEXT
from tests.actors.session_support import (
    MASTER,
    Harness,
    eventually,
    inbound,
    key_of,
    running_runtime,
    submit_until_accepted,
)

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    with running_runtime(
        tmp_path_factory.mktemp("scale"),
        fixtures_dir,
        max_live_sessions=600,
        idle_ttl_s=600,
        activation_wait_s=60.0,
        delivery_actors=2,
    ) as harness:
        yield harness


async def host_pids(h: Harness, users: list[str]) -> set[int]:
    """The host processes of ``users``' live sessions."""
    return set(await asyncio.gather(*(h.host_pid(u) for u in users)))


@pytest.mark.parametrize("tool", ["block", "ablock"])
async def test_a_slow_tool_does_not_hold_up_the_other_sessions_of_its_host(h: Harness, tool: str) -> None:
    slow, gate = f"7{len(tool)}0000", f"slow-{tool}"
    others = [f"7{len(tool)}{i:04d}" for i in range(1, 51)]
    assert (await h.rt.submit(inbound(slow, f"{tool} {gate}"))).status == "accepted"
    await eventually(lambda: h.gate_waiting(gate), 120, "the slow tool to start")
    await asyncio.gather(*(submit_until_accepted(h.rt, inbound(u, f"echo hi {u}")) for u in others))
    await eventually(lambda: all(h.sent(u) for u in others), 180, "the 50 other replies")
    # every other session answered while the slow tool still waited (it only returns once opened)
    assert (h.gate_done(gate), h.sent(slow)) == (False, [])
    assert {u: h.sent(u) for u in others} == {u: [f"hi {u}"] for u in others}
    assert len(await host_pids(h, [slow, *others])) == 1  # one host for all of them
    h.open_gate(gate)
    await eventually(lambda: h.sent(slow), 120, "the slow session's reply")
    assert h.sent(slow) == [f"tool: released {gate}; then: []"]


async def test_a_steer_reaches_a_session_whose_host_is_busy_with_other_sessions_turns(h: Harness) -> None:
    target, gate = "72000", "steered"
    busy = [f"72{i:03d}" for i in range(1, 21)]
    # 20 other sessions of the host in the middle of a turn (4 of them in a blocking tool: a host
    # runs plain-function tools on its loop's default thread pool, min(32, CPUs + 4) threads)
    for i, u in enumerate(busy):
        tool = "block" if i % 5 == 0 else "ablock"
        assert (await h.rt.submit(inbound(u, f"{tool} busy-{u}"))).status == "accepted"
    assert (await h.rt.submit(inbound(target, f"ablock {gate}"))).status == "accepted"
    waiting = [f"busy-{u}" for u in busy] + [gate]
    await eventually(lambda: all(h.gate_waiting(g) for g in waiting), 120, "every turn in its tool")
    assert len(await host_pids(h, [target, *busy])) == 1
    assert await h.rt.steer(key_of(target), "answer in French", MASTER) == "steered"
    h.open_gate(gate)
    await eventually(lambda: h.sent(target), 120, "the steered reply")
    assert h.sent(target) == [f"tool: released {gate}; then: ['answer in French']"]
    assert not any(h.sent(u) for u in busy)  # the others were still in their turns throughout
    for u in busy:
        h.open_gate(f"busy-{u}")
    await eventually(lambda: all(h.sent(u) for u in busy), 120, "the other replies")
    assert {u: h.sent(u) for u in busy} == {u: [f"tool: released busy-{u}; then: []"] for u in busy}


async def test_five_hundred_live_sessions_keep_per_chat_order(h: Harness) -> None:
    users = [str(800000 + i) for i in range(500)]

    async def chat(user: str) -> None:
        for i in range(2):
            await submit_until_accepted(h.rt, inbound(user, f"{user}-{i}"), timeout_s=300)

    await asyncio.gather(*(chat(u) for u in users))
    await eventually(lambda: all(len(h.sent(u)) == 2 for u in users), 300, "1000 replies")
    assert {u: h.sent(u) for u in users} == {u: [f"re: {u}-0", f"re: {u}-1"] for u in users}
    live = {s.session_key for s in await h.rt.sessions()}
    assert {key_of(u) for u in users} <= live  # all 500 live at once: none was passivated
    status = await h.rt.status()
    assert (status["submit"]["busy"], status["submit"]["errors"], status["submit"]["lost"]) == (0, 0, 0)
    assert status["live_sessions"] == len(live) >= 500


async def test_kill_9_of_a_host_with_twenty_sessions_mid_turn_answers_every_message_once(h: Harness) -> None:
    users = [str(900000 + i) for i in range(20)]
    before, starts = dict((await h.rt.status())["submit"]), h.tool_starts()
    for u in users:
        assert (await h.rt.submit(inbound(u, "slow 60", message_id=f"kill-{u}"))).status == "accepted"
    await eventually(lambda: h.tool_starts() == starts + 20, 120, "20 slow tools to start")
    (victim,) = await host_pids(h, users)
    os.kill(victim, signal.SIGKILL)

    await eventually(lambda: all(h.sent(u) for u in users), 240, "20 replies after the crash")

    async def all_settled() -> bool:
        infos = await asyncio.gather(*(h.rt.session(key_of(u)) for u in users))
        return all(
            i is not None and i.pending == 0 and i.actor is not None and i.actor["active_turns"] == 0
            for i in infos
        )

    await eventually(all_settled, 120, "the retried messages to finish")
    # exactly one platform call per accepted message, and no tool started a second time
    assert {u: h.sent(u) for u in users} == {u: [f"tool: {INTERRUPTED_TEXT}; then: []"] for u in users}
    assert h.tool_starts() == starts + 20
    assert victim not in await host_pids(h, users)
    now = (await h.rt.status())["submit"]
    assert (now["retried"] - before["retried"], now["lost"], now["errors"]) == (20, 0, 0)

"""Placement at the live-session cap on real local Ray (docs/decisions.md#session-lifecycle),
packed mode (strict mode at the cap runs in test_host_lifecycle.py and test_session_runtime.py):
messages of a new session that must wait for an LRU passivation keep their arrival order, a
session whose turn runs is never the one passivated, and churn over the cap loses and reorders
nothing and starts no process once the host limit is reached.

Calls of one key pass the ingress process's ``SubmitPath`` in the order they were made (its
``KeyOrder`` takes the ticket before the first ``await``), so ``asyncio.gather`` of submits gives
the host's ``seq`` order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from tests.actors.router_churn import churn
from tests.actors.session_support import MASTER, Harness, eventually, inbound, key_of, running_runtime

pytestmark = pytest.mark.ray

CAP = 2


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    with running_runtime(
        tmp_path_factory.mktemp("churn"),
        fixtures_dir,
        max_live_sessions=CAP,
        idle_ttl_s=600,
        activation_wait_s=60.0,
    ) as harness:
        yield harness


async def reply(h: Harness, user: str, text: str) -> None:
    """Submit ``echo <text>`` for ``user`` and wait for the reply at the platform API."""
    before = len(h.sent(user))
    assert (await h.rt.submit(inbound(user, f"echo {text}"))).status == "accepted"
    await eventually(lambda: len(h.sent(user)) > before, 120, f"the reply to {user}")


async def live_keys(h: Harness) -> set[str]:
    return {s.session_key for s in await h.rt.sessions()}


async def test_concurrent_messages_of_a_new_session_at_the_cap_get_seqs_in_arrival_order(h: Harness) -> None:
    for user in ("60000", "60001"):  # the cap: two live, idle sessions
        await reply(h, user, f"hi {user}")
    user = "60002"
    texts = [f"m{i}" for i in range(5)]
    results = await asyncio.gather(*(h.rt.submit(inbound(user, f"echo {t}")) for t in texts))
    # the first waits for an LRU passivation; the later ones must not overtake it
    assert [(r.status, r.seq) for r in results] == [("accepted", i) for i in range(1, 6)]
    await eventually(lambda: len(h.sent(user)) == 5, 120, "five replies")
    assert h.sent(user) == texts
    assert key_of(user) in await live_keys(h)


async def test_a_session_whose_turn_runs_is_not_passivated_for_a_new_one(h: Harness) -> None:
    busy, idle, new = "60100", "60101", "60102"
    await reply(h, busy, f"hi {busy}")
    starts = h.tool_starts()
    # a follow-up with no turn running runs as a turn of its own: nothing is pending for the
    # session, but its core is not idle
    assert await h.rt.follow_up(key_of(busy), "slow 4", MASTER) == "started"
    await eventually(lambda: h.tool_starts() > starts, 120, "the follow-up's tool to start")
    await reply(h, idle, f"hi {idle}")  # the cap: ``busy`` (least recently used, running) and ``idle``
    await reply(h, new, "c")
    assert await live_keys(h) == {key_of(busy), key_of(new)}  # ``idle`` made room
    await eventually(lambda: len(h.sent(busy)) == 2, 120, "the follow-up's reply")
    assert (h.sent(new), h.sent(busy), h.sent(idle)) == (
        ["c"],
        [f"hi {busy}", "tool: slept 4; then: []"],
        [f"hi {idle}"],
    )


async def test_churn_at_the_cap_delivers_every_reply_in_order_and_starts_no_process(h: Harness) -> None:
    async def at_the_limit() -> dict[str, int] | None:
        sup = await h.rt.hosts.status.remote()
        return sup if sup["hosts"] == sup["most"] and not sup["starting"] else None

    before = await eventually(at_the_limit, 120, "every host the cap allows to run")
    users = [str(61000 + i) for i in range(8)]
    res = await churn(h, users, messages=4, think_ms=20)
    assert (res["in_order"], len(res["replies_ms"])) == (True, 32)
    status = await h.rt.status()
    assert (status["submit"]["errors"], status["submit"]["lost"]) == (0, 0)
    assert status["live_sessions"] <= CAP
    after = status["supervisor"]
    assert (after["created"], after["cold"], after["hosts"]) == (
        before["created"],
        before["cold"],
        before["hosts"],
    )


async def test_activations_waiting_for_room_leave_control_calls_free(h: Harness) -> None:
    # Both live sessions run a gated tool: no session is idle, so every activation waits on the
    # host for one. More of them than the control group has slots (64): had they run there, the
    # status call below would queue behind them until the gates open.
    gates = {user: f"cap-{user}" for user in ("64000", "64001")}
    for user, gate in gates.items():
        assert (await h.rt.submit(inbound(user, f"block {gate}"))).status == "accepted"
        await eventually(lambda g=gate: h.gate_waiting(g), 120, "the gated tool to start")
    (host,) = [x["handle"] for x in await h.rt.hosts.hosts.remote()]
    waiting = [host.activate.remote(key_of(f"6410{i:02d}"), 1, "no-router", True, 20.0) for i in range(70)]
    status = await host.status.remote()
    ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
    assert (status["live"], ready) == (CAP, [])  # answered while all 70 still wait
    for gate in gates.values():
        h.open_gate(gate)
    statuses = [(await ref)["status"] for ref in waiting]
    # each session whose turn ended made room for one waiting activation (and each activated one,
    # unused for 5 s, for another); the rest answered "full" after their 20 s
    assert set(statuses) <= {"activated", "full"} and statuses.count("activated") >= 2, statuses
    await eventually(lambda: all(h.sent(u) for u in gates), 120, "the gated replies")

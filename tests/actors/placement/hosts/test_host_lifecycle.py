"""Session lifecycle on session hosts, real local Ray (docs/decisions.md#session-lifecycle): a cap
of live sessions with LRU passivation of idle ones (nothing lost), idle-TTL passivation and
re-activation with an identical context, and a dead host replaced by the supervisor — in both host
modes (``packed``: one host holds the three sessions; ``strict``: a host process per live session,
at most three)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.actors.session_support import MODES, Harness, eventually, inbound, key_of, running_runtime

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", params=list(MODES))
def h(
    request: pytest.FixtureRequest,
    ray_session: None,
    tmp_path_factory: pytest.TempPathFactory,
    fixtures_dir: Path,
) -> Iterator[Harness]:
    with running_runtime(
        tmp_path_factory.mktemp(f"lifecycle-{request.param}"),
        fixtures_dir,
        max_live_sessions=3,
        idle_ttl_s=2.0,
        activation_wait_s=60.0,
        **MODES[request.param],
    ) as harness:
        yield harness


async def test_cap_of_three_with_five_active_sessions_passivates_lru_and_loses_nothing(h: Harness) -> None:
    users = [str(50000 + i) for i in range(5)]
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:  # every host's own count of its live sessions, read directly
            hosts = await h.rt.hosts.hosts.remote()
            rows = await asyncio.gather(*(x["handle"].status.remote() for x in hosts), return_exceptions=True)
            peak = max(peak, sum(r["live"] for r in rows if isinstance(r, dict)))
            await asyncio.sleep(0.02)

    watcher = asyncio.ensure_future(watch())
    try:
        results = await asyncio.gather(*(h.rt.submit(inbound(u, "slow 0.5")) for u in users))
        # the two sessions over the cap waited (bounded) for room instead of failing
        assert [r.status for r in results] == ["accepted"] * 5
        await eventually(lambda: all(h.sent(u) for u in users), 180, "five replies")
    finally:
        watcher.cancel()
    assert {u: h.sent(u) for u in users} == {u: ["tool: slept 0.5; then: []"] for u in users}
    status = await h.rt.status()
    assert 1 <= peak <= 3
    assert status["live_sessions"] == len(await h.rt.sessions()) <= 3
    assert status["shards"][0]["forgotten"] >= 2  # each passivation was told to the shard
    assert (status["submit"]["errors"], status["submit"]["lost"], status["submit"]["busy"]) == (0, 0, 0)


async def test_idle_ttl_passivation_then_reactivation_loads_an_identical_context(h: Harness) -> None:
    user = "51000"
    key = key_of(user)
    for text in ("first", "second"):
        assert (await h.rt.submit(inbound(user, text))).status == "accepted"
    await eventually(lambda: len(h.sent(user)) == 2, 120, "two replies")
    await eventually(lambda: _idle(h, key), 120, "turns to end")
    before = await h.rt.context(key)
    assert [m["content"] for m in before if m["role"] == "user"] == ["first", "second"]
    forgotten = (await h.rt.status())["shards"][0]["forgotten"]

    async def passivated() -> bool:
        return key not in {s.session_key for s in await h.rt.sessions()}

    await eventually(passivated, 120, "idle-TTL passivation")
    assert (await h.rt.status())["shards"][0]["forgotten"] >= forgotten + 1
    assert await h.rt.context(key) == []  # not live anywhere

    assert (await h.rt.submit(inbound(user, "echo third"))).status == "accepted"
    await eventually(lambda: len(h.sent(user)) == 3, 120, "the third reply")
    after = await h.rt.context(key)
    assert after[: len(before)] == before  # re-activated from SQL: the same context, message for message
    assert [m["content"] for m in after if m["role"] == "user"] == ["first", "second", "echo third"]
    assert h.sent(user) == ["re: first", "re: second", "third"]


async def _idle(h: Harness, key: str) -> bool:
    info = await h.rt.session(key)
    return (
        info is not None and info.pending == 0 and info.actor is not None and info.actor["active_turns"] == 0
    )


async def test_a_dead_host_is_replaced_by_the_supervisor(h: Harness) -> None:
    sup = h.rt.hosts
    await eventually(lambda: _settled(h), 120, "the supervisor to settle")
    before = await sup.status.remote()
    victim = next(p for p in await sup.host_pids.remote() if p is not None)
    os.kill(victim, signal.SIGKILL)

    seen: list[object] = []

    async def whole_again() -> bool:
        pids = await sup.host_pids.remote()
        status = await sup.status.remote()
        seen.append((pids, status))
        return (
            status["replaced"] == before["replaced"] + 1
            and len(pids) >= 1
            and None not in pids
            and victim not in pids
            and status["starting"] == 0
        )

    try:
        await eventually(whole_again, 120, "the hosts to be whole again")
    except AssertionError:
        raise AssertionError(f"victim {victim}; last observations {seen[-3:]}") from None
    # and a message still gets its answer
    user = "52000"
    assert (await h.rt.submit(inbound(user, "echo still here"))).status == "accepted"
    await eventually(lambda: h.sent(user), 120, "a reply after the replacement")
    assert h.sent(user) == ["still here"]
    assert await h.host_pid(user) != victim


async def _settled(h: Harness) -> bool:
    status = await h.rt.hosts.status.remote()
    return bool(status["hosts"] >= 1 and status["starting"] == 0)

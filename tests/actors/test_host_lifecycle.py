"""Session lifecycle on real local Ray (docs/decisions.md#session-lifecycle): warm-pool activation,
idle-TTL passivation and re-activation with an identical context, a cap of live sessions with LRU
passivation of idle ones (nothing lost)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.actors.session_support import Harness, eventually, inbound, key_of, running_runtime

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    with running_runtime(
        tmp_path_factory.mktemp("lifecycle"),
        fixtures_dir,
        warm_pool=2,
        max_live_sessions=3,
        idle_ttl_s=2.0,
        activation_wait_s=60.0,
    ) as harness:
        yield harness


async def test_cap_of_three_with_five_active_sessions_passivates_lru_and_loses_nothing(h: Harness) -> None:
    users = [str(50000 + i) for i in range(5)]
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, (await h.rt.status())["live_sessions"])
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    try:
        results = await asyncio.gather(*(h.rt.submit(inbound(u, "slow 0.5")) for u in users))
        # the two sessions over the cap waited (bounded) for a slot instead of failing
        assert [r.status for r in results] == ["accepted"] * 5
        await eventually(lambda: all(h.sent(u) for u in users), 180, "five replies")
    finally:
        watcher.cancel()
    assert {u: h.sent(u) for u in users} == {u: ["tool: slept 0.5; then: []"] for u in users}
    shard = (await h.rt.status())["shards"][0]
    assert peak <= 3
    assert shard["passivated_lru"] >= 2
    assert shard["errors"] == 0


async def test_idle_ttl_passivation_then_reactivation_loads_an_identical_context(h: Harness) -> None:
    user = "51000"
    key = key_of(user)
    for text in ("first", "second"):
        assert (await h.rt.submit(inbound(user, text))).status == "accepted"
    await eventually(lambda: len(h.sent(user)) == 2, 120, "two replies")
    await eventually(lambda: _idle(h, key), 120, "turns to end")
    before = await h.rt.context(key)
    assert [m["content"] for m in before if m["role"] == "user"] == ["first", "second"]
    pool_before = (await h.rt.status())["pool"]

    async def passivated() -> bool:
        return key not in {s.session_key for s in await h.rt.sessions()}

    await eventually(passivated, 120, "idle-TTL passivation")
    assert (await h.rt.status())["shards"][0]["passivated_idle"] >= 1

    assert (await h.rt.submit(inbound(user, "echo third"))).status == "accepted"
    await eventually(lambda: len(h.sent(user)) == 3, 120, "the third reply")
    after = await h.rt.context(key)
    assert after[: len(before)] == before  # re-activated from SQL: the same context, message for message
    assert [m["content"] for m in after if m["role"] == "user"] == ["first", "second", "echo third"]
    assert h.sent(user) == ["re: first", "re: second", "third"]
    pool_after = (await h.rt.status())["pool"]
    # the re-activation bound a pooled actor (warm) — the passivated actor went back to the pool
    assert pool_after["warm_acquired"] >= pool_before["warm_acquired"] + 1


async def _idle(h: Harness, key: str) -> bool:
    info = await h.rt.session(key)
    return (
        info is not None and info.pending == 0 and info.actor is not None and info.actor["active_turns"] == 0
    )


async def test_a_dead_warm_pool_member_is_replaced(h: Harness) -> None:
    import os
    import signal

    pool = h.rt.pool
    await eventually(lambda: _full(h), 120, "a full warm pool")
    victim = next(p for p in await pool.warm_pids.remote() if p is not None)
    os.kill(victim, signal.SIGKILL)

    seen: list[object] = []

    async def healthy_again() -> bool:
        pids = await pool.warm_pids.remote()
        seen.append((pids, await pool.status.remote()))
        # size 2 (+ up to one passivated actor kept as spare): whole again without the victim
        return len(pids) >= 2 and None not in pids and victim not in pids

    try:
        await eventually(healthy_again, 120, "the pool to be whole again")
    except AssertionError:
        raise AssertionError(f"victim {victim}; last observations {seen[-3:]}") from None


async def _full(h: Harness) -> bool:
    return bool((await h.rt.status())["pool"]["warm"] >= 2)


"""Placement state that survives a process or a passivation (docs/decisions.md#session-hosts): a
router shard that restarts (kill -9 of its process; Ray restarts it blank) adopts the sessions the
hosts hold for its keys before it places anything — a live session keeps its host and context and
is never placed a second time; and a redelivered event that arrives after its session was
passivated is still a duplicate (the inbound marker in the reloaded context)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.placement.runtime import SessionRuntime
from tests.actors.session_support import Harness, eventually, inbound, key_of, running_runtime

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    with running_runtime(tmp_path_factory.mktemp("restart"), fixtures_dir, min_hosts=2) as harness:
        yield harness


async def test_a_restarted_shard_adopts_live_sessions_instead_of_placing_them_again(h: Harness) -> None:
    users = [str(61000 + i) for i in range(6)]
    for u in users:
        assert (await h.rt.submit(inbound(u, f"{u} first"))).status == "accepted"
    await eventually(lambda: all(h.sent(u) == [f"re: {u} first"] for u in users), 120, "first replies")
    before = {s.session_key: (s.actor_id, s.session_id) for s in await h.rt.sessions()}
    assert set(before) == {key_of(u) for u in users}

    router = h.rt.routers[0]
    pid = await router.pid.remote()
    os.kill(pid, signal.SIGKILL)

    # A fresh handle (as a new ingress process): no cached placement, every message asks the shard.
    fresh = SessionRuntime.connect(h.config, prefix=h.rt.prefix)

    async def second(u: str) -> bool:
        try:  # a redelivery of the same event id, as a platform does after an error
            res = await fresh.submit(inbound(u, f"{u} second", message_id=f"second-{u}"))
        except Exception:  # the shard is still restarting
            return False
        return res.status in ("accepted", "duplicate")

    for u in users:
        await eventually(lambda u=u: second(u), 120, "the restarted shard answers")
    await eventually(
        lambda: all(h.sent(u) == [f"re: {u} first", f"re: {u} second"] for u in users), 120, "second replies"
    )
    after = {s.session_key: (s.actor_id, s.session_id) for s in await fresh.sessions()}
    assert after == before  # same host, same epoch: adopted, not activated a second time
    status = await router.status.remote()
    assert status["adopted"] == len(users) and status["placed"] == 0
    for u in users:
        ctx = await fresh.context(key_of(u))
        assert [m["content"] for m in ctx if m["role"] == "user"] == [f"{u} first", f"{u} second"]


async def test_a_redelivery_after_passivation_is_a_duplicate(h: Harness) -> None:
    user = "62000"
    msg = inbound(user, "once", message_id="redelivered-1")
    assert (await h.rt.submit(msg)).status == "accepted"
    await eventually(lambda: h.sent(user) == ["re: once"], 120, "the reply")
    await eventually(lambda: h.rt.passivate(key_of(user)), 60, "the passivation")
    assert key_of(user) not in {s.session_key for s in await h.rt.sessions()}
    assert (await h.rt.submit(msg)).status == "duplicate"  # re-activated from SQL, marker found
    assert (await h.rt.submit(inbound(user, "next"))).status == "accepted"
    await eventually(lambda: h.sent(user) == ["re: once", "re: next"], 120, "the next reply")


async def test_a_burst_of_new_sessions_spreads_over_the_hosts(h: Harness) -> None:
    # Ten chats write at once: every placement is asked before any host answered. Counting only
    # answered placements, all ten chose the host that was least loaded before the burst.
    users = [str(63000 + i) for i in range(10)]
    results = await asyncio.gather(*(h.rt.submit(inbound(u, f"{u} hello")) for u in users))
    assert [r.status for r in results] == ["accepted"] * len(users)
    await eventually(lambda: all(h.sent(u) == [f"re: {u} hello"] for u in users), 120, "the replies")
    pids = [await h.host_pid(u) for u in users]
    per_host = sorted(Counter(pids).values())
    assert len(per_host) == 2 and per_host[0] >= 3, per_host

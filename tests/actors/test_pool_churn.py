"""The warm pool at the live-session cap (real local Ray): each new session LRU-passivates an idle
one and takes over the victim's freshly passivated actor (the router's hand-off), so the churn
starts no new process and leaves the pool untouched (a cold actor costs ≈ 2.5 s of CPU on
this machine: docs/decisions.md#session-warm-pool)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.actors.session_support import Harness, eventually, inbound, running_runtime

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    with running_runtime(
        tmp_path_factory.mktemp("churn"), fixtures_dir, warm_pool=2, max_live_sessions=2, idle_ttl_s=600
    ) as harness:
        yield harness


async def test_lru_churn_at_the_cap_reuses_pooled_actors(h: Harness) -> None:

    async def reply(user: str) -> None:
        assert (await h.rt.submit(inbound(user, f"hi {user}"))).status == "accepted"
        await eventually(lambda: h.sent(user), 120, f"the reply to {user}")

    async def settled() -> dict[str, int] | None:
        pool = (await h.rt.status())["pool"]
        return pool if pool["warm"] >= pool["target"] and not pool["creating"] else None

    for user in ("53000", "53001"):  # the cap: two live sessions
        await reply(user)
    before = await eventually(settled, 180, "a full warm pool")
    churn = ["53002", "53003", "53004"]
    for user in churn:  # each one over the cap
        await reply(user)
    status = await h.rt.status()
    assert {u: h.sent(u) for u in churn} == {u: [f"re: hi {u}"] for u in churn}
    shard = status["shards"][0]
    # each new session took over the blank actor of its LRU victim (no pool release/acquire)
    assert (shard["passivated_lru"], shard["handoffs"]) == (3, 3)
    assert status["live_sessions"] == 2
    after = status["pool"]
    assert after["created"] == before["created"]  # no new process for the churn
    assert after["warm_acquired"] == before["warm_acquired"]
    assert after["warm"] == before["warm"]


async def test_a_session_actor_answers_in_both_concurrency_groups(h: Harness) -> None:
    """``ping`` (control group, after the warm-up) and ``ping_turn`` (turn group) — what the pool
    checks before it counts an actor as warm — answer from the same process."""
    import ray

    from actors.session_actor import SessionActor
    from tests.actors.session_scripts import ScriptedSetup

    actor = SessionActor.remote(h.config, ScriptedSetup(str(h.markers)), h.rt.delivery)  # type: ignore[attr-defined]
    try:
        pid = await actor.ping.remote()
        assert await actor.ping_turn.remote() == pid > 0
    finally:
        ray.kill(actor, no_restart=True)

"""Router admission at the live-session cap on real local Ray
(docs/decisions.md#session-lifecycle).

Ray does not order calls to an async actor, so the ordering tests drive the router *class*
in-process (``RouterActor.__ray_metadata__.modified_class``) on the test's event loop, against the
module's real warm pool, session actors, delivery actor and platform-API server: calls started
with ``asyncio.gather`` then reach the router in submission order. The end-to-end tests go
through ``SessionRuntime`` (Ray calls) and check that nothing is lost or reordered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.router import RouterActor
from runtime.session.control import ControlReply, ControlRequest
from tests.actors.router_churn import churn
from tests.actors.session_support import MASTER, Harness, eventually, inbound, key_of, running_runtime

pytestmark = pytest.mark.ray

CAP = 2


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    with running_runtime(
        tmp_path_factory.mktemp("router"),
        fixtures_dir,
        warm_pool=2,
        max_live_sessions=CAP,
        idle_ttl_s=600,
        activation_wait_s=60.0,
    ) as harness:
        yield harness


@contextlib.asynccontextmanager
async def local_router(h: Harness, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """A router shard (cap ``CAP``) living in this process, bound to the module's warm pool; its
    idle sessions are passivated at the end (their actors go back to the pool)."""
    # Ray's metrics backend is for actor processes; this process keeps prometheus-client.
    monkeypatch.setattr("actors.ray_metrics.install_ray_metrics", lambda: None)
    router = RouterActor.__ray_metadata__.modified_class(h.config, 0, 1, h.rt.pool_name)  # type: ignore[attr-defined]
    try:
        yield router
    finally:
        for s in await router.sessions():
            with contextlib.suppress(Exception):
                await router.passivate(s["session_key"])
        await router.shutdown()


async def reply(h: Harness, router: Any, user: str, text: str) -> None:
    """Submit ``echo <text>`` for ``user`` and wait for the reply at the platform API."""
    before = len(h.sent(user))
    assert (await router.submit(inbound(user, f"echo {text}")))["status"] == "accepted"
    await eventually(lambda: len(h.sent(user)) > before, 120, f"the reply to {user}")


async def test_concurrent_messages_of_a_new_session_at_the_cap_get_seqs_in_arrival_order(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with local_router(h, monkeypatch) as router:
        for user in ("60000", "60001"):  # the cap: two live, idle sessions
            await reply(h, router, user, f"hi {user}")
        user = "60002"
        results = await asyncio.gather(*(router.submit(inbound(user, f"echo m{i}")) for i in range(4)))
        # the first waits for an LRU passivation; the later ones must not overtake it
        assert results == [{"status": "accepted", "retry_after_s": None, "seq": i} for i in (1, 2, 3, 4)]
        await eventually(lambda: len(h.sent(user)) == 4, 120, "four replies")
        assert h.sent(user) == ["m0", "m1", "m2", "m3"]
        assert (router.counts["passivated_lru"], router.counts["errors"]) == (1, 0)


async def test_a_victim_that_refuses_passivation_is_skipped_for_another_idle_session(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with local_router(h, monkeypatch) as router:
        busy, other, new = "60100", "60101", "60102"
        for user in (busy, other):  # ``busy`` is the least recently used
            await reply(h, router, user, f"hi {user}")
        starts = h.tool_starts()
        # a follow-up with no turn running runs as a control turn: the router sees the session
        # idle (nothing pending) but its actor refuses to passivate while the turn runs
        asked = ControlRequest(kind="follow_up", session_key=key_of(busy), text="slow 5", sender_id=MASTER)
        assert await router.control(asked) == ControlReply(
            kind="follow_up", session_key=key_of(busy), result="started"
        )
        await eventually(lambda: h.tool_starts() > starts, 120, "the follow-up's tool to start")
        assert await router.submit(inbound(new, "echo c")) == {
            "status": "accepted",
            "retry_after_s": None,
            "seq": 1,
        }
        assert {s["session_key"] for s in await router.sessions()} == {key_of(busy), key_of(new)}
        assert (router.counts["passivated_lru"], router.counts["passivated"]) == (1, 1)
        await eventually(lambda: len(h.sent(new)) == 1 and len(h.sent(busy)) == 2, 120, "both replies")
        assert (h.sent(new), h.sent(busy)) == (["c"], ["hi 60100", "tool: slept 5; then: []"])


async def test_new_sessions_waiting_at_the_cap_are_admitted_oldest_first(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with local_router(h, monkeypatch) as router:
        bound: list[str] = []  # the order in which sessions got a slot (directory entries made)
        bind_new = router._bind_new

        def recording_bind_new(key: str, grant: Any) -> Any:
            bound.append(key)
            return bind_new(key, grant)

        monkeypatch.setattr(router, "_bind_new", recording_bind_new)
        holders = ["60200", "60201"]
        for user in holders:  # the cap: two sessions, each with a turn running (not idle)
            assert (await router.submit(inbound(user, "slow 1")))["status"] == "accepted"
        waiting = ["60202", "60203", "60204", "60205"]
        results = await asyncio.gather(*(router.submit(inbound(u, f"echo {u}")) for u in waiting))
        assert [r["status"] for r in results] == ["accepted"] * 4
        await eventually(lambda: all(h.sent(u) for u in waiting), 120, "four replies")
        # FIFO: each freed slot went to the oldest waiting session (the replies of sessions admitted
        # close together may reach the platform in either order: they run on different actors)
        assert [key.rsplit(":", 1)[1] for key in bound] == holders + waiting
        assert {u: h.sent(u) for u in waiting} == {u: [u] for u in waiting}


async def test_concurrent_ray_submits_of_one_new_session_at_the_cap_lose_and_reorder_nothing(
    h: Harness,
) -> None:
    for user in ("60300", "60301"):  # fill the cap with idle sessions (the real, remote router)
        assert (await h.rt.submit(inbound(user, f"echo hi {user}"))).status == "accepted"
    await eventually(lambda: h.sent("60300") and h.sent("60301"), 120, "two replies")
    user = "60302"
    texts = [f"n{i}" for i in range(5)]
    results = await asyncio.gather(*(h.rt.submit(inbound(user, f"echo {t}")) for t in texts))
    assert sorted((r.status, r.seq) for r in results) == [("accepted", i) for i in range(1, 6)]
    await eventually(lambda: len(h.sent(user)) == 5, 120, "five replies")
    by_seq = [t for _, t in sorted((r.seq or 0, t) for r, t in zip(results, texts, strict=True))]
    assert h.sent(user) == by_seq  # delivered in seq order, whichever order Ray ran the calls


async def test_churn_at_the_cap_delivers_every_reply_in_order(h: Harness) -> None:
    users = [str(61000 + i) for i in range(8)]
    res = await churn(h, users, messages=4, think_ms=20)
    assert (res["in_order"], len(res["replies_ms"])) == (True, 32)
    shard = (await h.rt.status())["shards"][0]
    assert shard["errors"] == 0
    assert shard["live"] <= CAP

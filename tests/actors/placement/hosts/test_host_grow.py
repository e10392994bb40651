"""Hosts started on demand for a burst of new sessions (docs/decisions.md#session-hosts), strict
mode (``sessions_per_host: 1``) on real local Ray: every placement that finds all hosts full
claims a slot of a host starting for it, so four new chats at once get four host processes and
none is passivated to make room for another while the host limit is not reached."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.actors.session_support import Harness, eventually, inbound, running_runtime

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    with running_runtime(
        tmp_path_factory.mktemp("grow"),
        fixtures_dir,
        sessions_per_host=1,
        max_live_sessions=8,
        idle_ttl_s=600,
        activation_wait_s=120.0,
    ) as harness:
        yield harness


async def test_a_burst_of_new_sessions_in_strict_mode_starts_a_host_for_each(h: Harness) -> None:
    users = [str(64000 + i) for i in range(4)]
    results = await asyncio.gather(*(h.rt.submit(inbound(u, f"{u} hello")) for u in users))
    assert [r.status for r in results] == ["accepted"] * len(users)
    await eventually(lambda: all(h.sent(u) == [f"re: {u} hello"] for u in users), 180, "the replies")
    pids = {await h.host_pid(u) for u in users}
    assert len(pids) == len(users)  # one process per live session
    hosts = await h.rt.hosts.hosts.remote()
    answers = await asyncio.gather(*(row["handle"].status.remote() for row in hosts))
    # all hosts joining one starting host made the others evict each other's fresh sessions
    assert sum(int(a["passivated"]) for a in answers) == 0
    assert sum(int(a["live"]) for a in answers) == len(users)

"""The structured-output capability probe runs once per model per TTL for the whole deployment,
not once per session host (docs/decisions.md#structured-capability-cache): two hosts on real local
Ray whose first turns need the same unknown model at the same moment probe it once; the other
host waits for the stored tier."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runtime.memory.db import Database
from runtime.session.capability_store import SqlCapabilityStore
from tests.actors.session_scripts import ProbedSetup
from tests.actors.session_support import eventually, inbound, running_runtime

pytestmark = pytest.mark.ray


def test_two_hosts_at_first_use_probe_the_model_once(
    ray_session: None, tmp_path: Path, fixtures_dir: Path
) -> None:
    markers = tmp_path / "markers"
    db_url = f"sqlite:///{tmp_path / 'sessionray.db'}"
    setup = ProbedSetup(str(markers), db_url)
    users = ["400000001", "400000002"]
    with running_runtime(
        tmp_path, fixtures_dir, setup=setup, min_hosts=2, sessions_per_host=1, max_live_sessions=2
    ) as h:

        async def run() -> list[int]:
            answers = await asyncio.gather(*(h.rt.submit(inbound(u, "hi")) for u in users))
            assert [a.status for a in answers] == ["accepted", "accepted"]
            for user in users:
                await eventually(lambda u=user: h.sent(u) == ["re: hi"], 60, f"{user}'s reply")
            return [await h.host_pid(u) for u in users]

        pids = asyncio.run(run())
    assert pids[0] != pids[1]  # two session hosts
    assert len(list(markers.glob("probe-*"))) == 1
    db = Database(db_url)
    try:
        rows = asyncio.run(SqlCapabilityStore(db).load_all())
    finally:
        db.dispose()
    assert [(r.model, r.tier, r.source) for r in rows] == [("script-model", "native", "probe")]

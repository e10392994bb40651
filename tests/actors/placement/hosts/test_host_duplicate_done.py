"""A host's ``duplicate`` answer says whether the message's reply is recorded (``done``): only
then may the inbox row be closed as handled (docs/decisions.md#inbox-durable). Found by the
chaos suite (host kill, strict mode): a redelivery answered ``duplicate`` while the first turn
still ran closed the row; that turn's host was then killed, and the reply was lost because the
inbox recovery never saw the row again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.placement.hosts.host import SessionHost
from runtime.config import Config, DatabaseConfig
from tests.actors.session_scripts import ScriptedSetup
from tests.actors.session_support import inbound, key_of

ROUTER = "sessionray-router-absent"
"""No such shard: the host's passivation notice finds nobody (it is fire-and-forget)."""


class _AcceptingDelivery:
    """Takes every reply (the turn ends as ``ok``); sends nothing."""

    async def deliver(self, job: Any) -> None:
        return None


@pytest.mark.usefixtures("ray_session")
async def test_a_duplicate_is_done_only_once_its_reply_is_recorded(tmp_path: Path) -> None:
    import ray

    config = Config(database=DatabaseConfig(url=f"sqlite:///{tmp_path / 'dup.db'}"))
    host = SessionHost.remote(  # type: ignore[attr-defined]
        config, ScriptedSetup(str(tmp_path / "markers")), _AcceptingDelivery(), 4, 0
    )
    try:
        await host.ping.remote()
        user = "30001"
        await host.activate.remote(key_of(user), 1, ROUTER)
        msg = inbound(user, "slow 3", "dup-slow")
        gen = host.submit.remote(msg, 1, 0)
        first = await (await gen.__anext__())
        assert first == {"status": "accepted", "seq": 1}
        # the turn runs (its tool takes 3 s): a redelivery, and a recovery re-submit, are duplicates
        # of a turn whose reply is not recorded yet
        again = await (await host.submit.remote(msg, 1, 0).__anext__())
        retry = await (await host.submit.remote(msg, 1, 1).__anext__())
        assert again == retry == {"status": "duplicate", "seq": None, "done": False}
        result = await (await gen.__anext__())
        assert (result.outcome, result.error) == ("ok", "")
        after = await (await host.submit.remote(msg, 1, 0).__anext__())
        assert after == {"status": "duplicate", "seq": None, "done": True}
    finally:
        ray.kill(host, no_restart=True)

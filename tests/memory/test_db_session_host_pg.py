"""The PostgreSQL connection budget (docs/decisions.md#memory-connection-budget) on a real
SessionHost (real Ray, real PostgreSQL): a host holds no connection once its warm-up ran; with
live sessions — however many, turns running at once — it holds at most ``HOST_SQL_THREADS``; it
keeps them while any session is live and closes them when its last session is passivated."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from actors.placement.hosts.host import SessionHost
from runtime.config import Config, DatabaseConfig
from runtime.memory.connection_budget import HOST_SQL_THREADS
from tests.actors.session_scripts import ScriptedSetup
from tests.actors.session_support import inbound, key_of
from tests.memory.pg_activity import connections, settled_connections, tagged
from tests.memory.pg_schema import create_schema, drop_schema

USERS = [str(20_000 + i) for i in range(6)]
"""More sessions than the host has SQL threads."""
ROUTER = "sessionray-router-absent"
"""No such shard: the host's passivation notice finds nobody (it is fire-and-forget)."""


class _AcceptingDelivery:
    """Takes every reply (the turn ends as ``ok``); sends nothing."""

    async def deliver(self, job: Any) -> None:
        return None


async def _turn(host: Any, user: str, text: str, epoch: int) -> tuple[str, Any]:
    """Submit one message and wait for its turn: (first answer's status, the TurnResult)."""
    gen = host.submit.remote(inbound(user, text, f"m-{user}-{text}"), epoch, 0)
    first = await (await gen.__anext__())
    result = await (await gen.__anext__())
    return first["status"], result


@pytest.mark.usefixtures("ray_session")
async def test_a_host_holds_at_most_its_sql_threads_and_none_without_live_sessions(
    pg_url: str, tmp_path: Path
) -> None:
    import ray

    schema_url, schema = create_schema(pg_url)
    url, name = tagged(schema_url)

    async def count(expected: int) -> int:
        return await asyncio.to_thread(settled_connections, pg_url, name, expected)

    config = Config(database=DatabaseConfig(url=url))
    host = SessionHost.remote(  # type: ignore[attr-defined]
        config, ScriptedSetup(str(tmp_path / "markers")), _AcceptingDelivery(), 16, 0
    )
    try:
        await host.ping.remote()  # the warm-up (create_tables, factory.prepare, SQL reads) ended
        assert await count(0) == 0

        infos = await asyncio.gather(*(host.activate.remote(key_of(u), 1, ROUTER) for u in USERS))
        assert sorted(i["session_id"] for i in infos) == sorted(f"{key_of(u)}#1" for u in USERS)
        assert [i["messages"] for i in infos] == [0] * len(USERS)
        turns = await asyncio.gather(*(_turn(host, u, "hello", 1) for u in USERS))
        assert [(status, r.outcome, r.error) for status, r in turns] == [("accepted", "ok", "")] * len(USERS)
        held = await asyncio.to_thread(connections, pg_url, name)
        assert 1 <= held <= HOST_SQL_THREADS == 4

        for user in USERS[:-1]:
            assert await host.passivate.remote(key_of(user), "admin") is True
        # one session is still live: the host keeps its pool (no new connection beyond the bound)
        assert 1 <= await asyncio.to_thread(connections, pg_url, name) <= HOST_SQL_THREADS
        assert (await host.status.remote())["live"] == 1

        assert await host.passivate.remote(key_of(USERS[-1]), "admin") is True
        assert await count(0) == 0  # the last passivation closed them

        again = await host.activate.remote(key_of(USERS[0]), 2, ROUTER)  # reconnects for the next session
        assert (again["session_id"], again["messages"]) == (f"{key_of(USERS[0])}#1", 4)  # the turn was stored
        roles = [m["role"] for m in await host.context_messages.remote(key_of(USERS[0]))]
        assert roles == ["custom", "user", "assistant", "custom"]
        assert 1 <= await asyncio.to_thread(connections, pg_url, name) <= HOST_SQL_THREADS
        assert await host.passivate.remote(key_of(USERS[0]), "admin") is True
        assert await count(0) == 0
    finally:
        ray.kill(host, no_restart=True)
        drop_schema(pg_url, schema)

"""The PostgreSQL connection budget (docs/decisions.md#memory-connection-budget) on a real
SessionActor (real Ray, real PostgreSQL): a blank actor in the pool holds no connection once its
warm-up ran, a live session holds exactly one (through its activation and a whole turn), and
passivation closes it again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from actors.session_actor import SessionActor
from runtime.config import Config, DatabaseConfig
from runtime.session.turn import TurnInput
from tests.actors.session_scripts import ScriptedSetup
from tests.memory.pg_activity import settled_connections, tagged
from tests.memory.pg_schema import create_schema, drop_schema

KEY = "onebot11:10001:private:20002"


class _AcceptingDelivery:
    """Takes every reply (the turn ends as ``ok``); sends nothing."""

    async def deliver(self, job: Any) -> None:
        return None


def _turn(seq: int, text: str) -> TurnInput:
    return TurnInput(
        seq=seq,
        session_key=KEY,
        platform="onebot11",
        bot_id="10001",
        message_id=f"m{seq}",
        scene_type="private",
        scene_id="20002",
        sender={"id": "20002", "name": "Alice", "roles": []},
        text=text,
        time_ms=1_700_000_000_000 + seq,
    )


@pytest.mark.usefixtures("ray_session")
async def test_pooled_actor_holds_no_connection_and_live_session_holds_one(
    pg_url: str, tmp_path: Path
) -> None:
    import ray

    schema_url, schema = create_schema(pg_url)
    url, name = tagged(schema_url)

    async def count(expected: int) -> int:
        return await asyncio.to_thread(settled_connections, pg_url, name, expected)

    config = Config(database=DatabaseConfig(url=url))
    actor = SessionActor.remote(config, ScriptedSetup(str(tmp_path / "markers")), _AcceptingDelivery())  # type: ignore[attr-defined]
    try:
        await actor.ping.remote()  # the warm-up (create_tables, factory.prepare, SQL reads) ended
        assert await count(0) == 0

        first = await actor.activate.remote(KEY)
        assert (first["session_id"], first["messages"]) == (f"{KEY}#1", 0)
        assert await count(1) == 1
        result = await actor.submit.remote(_turn(1, "hello"))
        assert (result.seq, result.message_id, result.outcome, result.error) == (1, "m1", "ok", "")
        assert await count(1) == 1

        assert (await actor.passivate.remote())["ok"] is True
        assert await count(0) == 0

        again = await actor.activate.remote(KEY)  # the same blank actor reconnects for its next session
        assert (again["session_id"], again["messages"]) == (f"{KEY}#1", 4)  # the turn was stored
        roles = [m["role"] for m in await actor.context_messages.remote(KEY)]
        assert roles == ["custom", "user", "assistant", "custom"]
        assert await count(1) == 1
        assert (await actor.passivate.remote())["ok"] is True
        assert await count(0) == 0
    finally:
        ray.kill(actor, no_restart=True)
        drop_schema(pg_url, schema)

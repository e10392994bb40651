"""Inbound over a OneBot reverse WebSocket keeps every webhook rule (real uvicorn, real sockets,
SQLite; an ``Event``-role socket, so no link actor is involved):

* an event that could not be stored (503 ``unavailable``) has no HTTP client to redeliver: it is
  submitted again in the background and taken once, the resubmit counted;
* a ``busy`` answer of the runtime is ``queued`` (the event is stored; the inbox recovery loop
  routes it: docs/decisions.md#inbox-durable), not resubmitted by the socket;
* an oversized frame, bad JSON and an event of another ``self_id`` are dropped and counted
  ``malformed`` — the socket stays open and the next event is taken;
* a heartbeat is ``ignored`` (and shows in ``/healthz``).

The runtime is a local stand-in with the hosts' dedup rule whose first answer to a chosen
message is ``busy``, and the first store of another chosen message fails as a locked SQLite file
does (the ingress's own handling is what is tested; busy on a real host and the recovery loop are
tested in tests/actors)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import websockets
from prometheus_client import REGISTRY
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from actors.inbound.ingress import build_app
from actors.placement.runtime import SubmitResult
from runtime.config import BotConfig, Config, DatabaseConfig, ServerConfig
from runtime.memory.db import Database
from runtime.memory.transcripts import TranscriptStore
from tests.actors.edge_support import serve_in_thread
from tests.actors.session_support import eventually
from tests.platforms.ws_support import REVERSE_BOT, TOKEN, TOKEN_ENV, event, meta

BUSY_ONCE = "83001"
STORE_FAILS_ONCE = "83004"
BUSY_USER = 200000003


class BusyOnceRuntime:
    """Takes each message id once; answers ``busy`` to the first submit of :data:`BUSY_ONCE`."""

    def __init__(self) -> None:
        self.submits: list[str] = []
        self.taken: list[str] = []

    async def submit(self, msg: Any) -> SubmitResult:
        self.submits.append(msg.message_id)
        if msg.message_id == BUSY_ONCE and self.submits.count(BUSY_ONCE) == 1:
            return SubmitResult(status="busy", retry_after_s=0.05)
        if msg.message_id in self.taken:
            return SubmitResult(status="duplicate")
        self.taken.append(msg.message_id)
        return SubmitResult(status="accepted", seq=len(self.taken))

    async def status(self) -> dict[str, Any]:
        return {"live": 0}


def inbound(outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "sessionray_inbound_messages_total", {"platform": "onebot11", "outcome": outcome}
    )
    return value or 0.0


def resubmits(outcome: str) -> float:
    return REGISTRY.get_sample_value("sessionray_onebot_ws_resubmits_total", {"outcome": outcome}) or 0.0


async def test_socket_events_follow_the_webhook_rules(
    tmp_path: Path, fixtures_dir: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    url = f"sqlite:///{tmp_path / 'ingress.db'}"
    db = Database(url)
    db.create_tables()
    config = Config(
        bots=[
            BotConfig(
                platform="onebot11", self_id=REVERSE_BOT, transport="ws-reverse", access_token_env=TOKEN_ENV
            )
        ],
        database=DatabaseConfig(url=url),
        server=ServerConfig(max_body_bytes=4096),
    )
    runtime = BusyOnceRuntime()
    before = {k: inbound(k) for k in ("accepted", "queued", "unavailable", "malformed", "ignored")}
    before_resubmits = {k: resubmits(k) for k in ("retry", "done")}
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Self-ID": REVERSE_BOT, "X-Client-Role": "Event"}
    app = build_app(runtime, config, transcripts=TranscriptStore(db))
    gate_store = app.state.ingress.gate.store
    store, failed = gate_store.store, []

    async def locked_once(**row: Any) -> Any:
        if row["message_id"] == STORE_FAILS_ONCE and not failed:
            failed.append(row["message_id"])
            raise OperationalError("INSERT", None, sqlite3.OperationalError("database is locked"))
        return await store(**row)

    monkeypatch.setattr(gate_store, "store", locked_once)
    with serve_in_thread(app) as base:
        ws_url = base.replace("http://", "ws://") + "/onebot/v11/ws/event"
        async with websockets.connect(ws_url, additional_headers=headers) as conn:
            await conn.send(meta(fixtures_dir, REVERSE_BOT, "heartbeat"))
            # (another chat: a queued message holds its own chat's later messages back)
            await conn.send(event(fixtures_dir, REVERSE_BOT, int(BUSY_ONCE), "busy first", user=BUSY_USER))
            await conn.send(event(fixtures_dir, REVERSE_BOT, int(STORE_FAILS_ONCE), "stored later"))
            await conn.send("x" * 5000)  # over server.max_body_bytes
            await conn.send("{not json")
            await conn.send(event(fixtures_dir, "1000000999", 83002, "another bot"))
            await conn.send(event(fixtures_dir, REVERSE_BOT, 83003, "after the bad ones"))
            await eventually(lambda: runtime.taken == ["83003", STORE_FAILS_ONCE] or None, 30, "both taken")
            async with httpx.AsyncClient() as client:
                health = (await client.get(base + "/healthz")).json()["onebot_ws"][REVERSE_BOT]
            assert (health["connected"], health["roles"], health["online"]) == (True, ["Event"], True)
        await eventually(lambda: resubmits("done") - before_resubmits["done"] == 1, 30, "resubmit counted")
        assert runtime.submits == [BUSY_ONCE, "83003", STORE_FAILS_ONCE]  # the busy one was not resubmitted
        assert resubmits("retry") - before_resubmits["retry"] == 1
        assert inbound("accepted") - before["accepted"] == 2
        assert inbound("queued") - before["queued"] == 1
        assert inbound("unavailable") - before["unavailable"] == 1
        assert inbound("malformed") - before["malformed"] == 3
        assert inbound("ignored") - before["ignored"] == 1
        rows = await TranscriptStore(db).scene("onebot11", REVERSE_BOT, "200000002")
        assert sorted(r.body for r in rows) == ["after the bad ones", "stored later"]  # each stored once
        busy_rows = await TranscriptStore(db).scene("onebot11", REVERSE_BOT, str(BUSY_USER))
        assert [r.body for r in busy_rows] == ["busy first"]
        with db.connection() as check:
            states = dict(check.execute(text("SELECT message_id, state FROM inbox")).all())
        assert states == {BUSY_ONCE: "stored", "83003": "stored", STORE_FAILS_ONCE: "stored"}
    db.dispose()


def test_frames_are_classified_by_shape() -> None:
    from runtime.platforms.onebot11_ws import is_api_response

    answer = json.loads('{"status": "ok", "retcode": 0, "data": null, "echo": "1"}')
    assert is_api_response(answer)
    assert not is_api_response({"post_type": "message", "echo": "1", "retcode": 0})
    assert not is_api_response({"status": "ok", "retcode": 0})
    assert not is_api_response(None)

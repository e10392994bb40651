"""OneBot WebSockets while ``sessionray serve`` starts (docs/decisions.md#ops-early-accept): the
ingress is built over the runtime stand-in (:class:`actors.serve.gate.RuntimeGate`) and served by
uvicorn on loopback in this loop, lifespan on — as serve does before Ray is up.

* a reverse socket accepted before the runtime is up has its events stored (``queued``), and no
  link actor is looked up, nor does the forward dialer look one up, until the runtime is attached;
* once it is attached, the reverse socket takes the bot's lease and carries an API call through
  the real link actor, and the forward dialer connects to its server.

Ray calls are seen by wrapping ``get_link`` (the one way into a link actor); the session's local
Ray is up, so a premature call would not fail here — it is the wrapper that tells.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
import ray
import uvicorn
import websockets

from actors.delivery.onebot_link import link_name
from actors.inbound import onebot_ws
from actors.inbound.ingress import build_app
from actors.placement.runtime import SubmitResult
from actors.serve.gate import RuntimeGate
from tests.actors.session_support import eventually
from tests.platforms.e2e_support import free_port
from tests.platforms.ws_support import FORWARD_BOT, REVERSE_BOT, TOKEN, event, ok_answer, ws_config

pytestmark = pytest.mark.ray

REVERSE, FORWARD = REVERSE_BOT, FORWARD_BOT


class TakesAll:
    """The runtime attached once "started": takes every message."""

    def __init__(self) -> None:
        self.submitted: list[str] = []

    async def submit(self, msg: Any) -> SubmitResult:
        self.submitted.append(msg.message_id)
        return SubmitResult(status="accepted", seq=len(self.submitted))


async def test_sockets_reach_ray_only_once_the_runtime_is_up(
    ray_session: None, tmp_path: Path, fixtures_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forward_port = free_port()
    dialled: list[str | None] = []

    async def forward_server(conn: Any) -> None:
        dialled.append(conn.request.headers.get("Authorization"))
        await conn.wait_closed()

    config = ws_config(tmp_path, f"ws://127.0.0.1:{forward_port}")
    gate = RuntimeGate(config)
    looked_up: list[tuple[str, bool]] = []  # (bot, runtime up at the time)
    real_get_link = onebot_ws.get_link

    def get_link(bot_id: str, prefix: str) -> Any:
        looked_up.append((bot_id, gate.ready))
        return real_get_link(bot_id, prefix)

    monkeypatch.setattr(onebot_ws, "get_link", get_link)
    app = build_app(gate, config)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning"))
    serving = asyncio.ensure_future(server.serve())
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Self-ID": REVERSE, "X-Client-Role": "Universal"}
    try:
        async with websockets.serve(forward_server, "127.0.0.1", forward_port):
            await eventually(lambda: server.started or None, 30, "uvicorn started")
            port = server.servers[0].sockets[0].getsockname()[1]
            async with websockets.connect(
                f"ws://127.0.0.1:{port}/onebot/v11/ws", additional_headers=headers
            ) as conn:
                await conn.send(event(fixtures_dir, REVERSE, 86001, "while starting"))
                rows = app.state.ingress.transcripts
                await eventually(lambda: _stored(rows, "while starting"), 30, "the early event stored")
                # the socket was served and its event stored: the old code had looked the link up by now
                assert looked_up == [] and dialled == []

                runtime = TakesAll()
                gate.attach(runtime)
                await eventually(lambda: _holder(REVERSE), 30, "the reverse socket holds the lease")
                await conn.send(
                    event(fixtures_dir, REVERSE, 86002, "once up", user=200000099)
                )  # another chat
                link = ray.get_actor(link_name(REVERSE), namespace="sessionray")
                frame = {"action": "send_private_msg", "params": {"user_id": 1, "message": "hi"}}
                answer_ref = link.call.remote(frame, 30.0)
                call = json.loads(await asyncio.wait_for(conn.recv(), 30))
                await conn.send(ok_answer(fixtures_dir, call["echo"], 4242))
                answer = await answer_ref
                await eventually(lambda: dialled or None, 30, "the forward dialer connected")
                await eventually(lambda: runtime.submitted or None, 30, "the event after the start taken")
        assert (call["action"], answer["state"], answer["response"]["data"]["message_id"]) == (
            "send_private_msg", "answered", 4242,
        )  # fmt: skip
        assert dialled[0] == f"Bearer {TOKEN}"
        assert runtime.submitted == ["86002"]  # the early one (queued) waits for the start-up recovery
        assert looked_up and all(up for _, up in looked_up)
        assert {bot for bot, _ in looked_up} == {REVERSE, FORWARD}
    finally:
        server.should_exit = True
        await serving
        for bot in (REVERSE, FORWARD):
            with contextlib.suppress(ValueError):  # ValueError: never created
                ray.kill(ray.get_actor(link_name(bot), namespace="sessionray"), no_restart=True)


async def _stored(transcripts: Any, text: str) -> bool | None:
    rows = await transcripts.scene("onebot11", REVERSE, "200000002")
    return True if any(r.body == text for r in rows) else None


async def _holder(bot: str) -> str | None:
    try:
        link = ray.get_actor(link_name(bot), namespace="sessionray")
    except ValueError:
        return None
    state = await link.state.remote()
    return state["holder"]  # type: ignore[no-any-return]

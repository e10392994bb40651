"""The main job with OneBot bots on WebSockets: real local Ray (router, hosts, scripted faux model,
a delivery actor, the bots' ``OneBotLink`` actors), the ingress served by uvicorn on 127.0.0.1
(lifespan on: the forward dialers run), and helpers for OneBot implementation stand-ins.

Access tokens come from environment variables set at import — before the session's ``ray.init`` —
so the delivery actor's worker process sees them, as workers of ``sessionray serve`` do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import uvicorn

from actors.delivery.onebot_link import link_name
from actors.delivery.pool import DeliverySettings, create_pool
from actors.inbound.ingress import build_app
from actors.placement.runtime import SessionRuntime
from runtime.config import BotConfig, Config, DatabaseConfig, RuntimeConfig
from runtime.memory.db import Database
from runtime.memory.transcripts import TranscriptStore
from tests.actors.session_scripts import ScriptedSetup
from tests.platforms.e2e_support import free_port

TOKEN_ENV = "SR_WS_ONEBOT_TOKEN"
TOKEN = "onebot-ws-access-token"
os.environ.setdefault(TOKEN_ENV, TOKEN)

REVERSE_BOT = "1000000101"
"""self_id of the ws-reverse bot (the recorded events are re-addressed to it)."""
FORWARD_BOT = "1000000102"
"""self_id of the ws-forward bot."""
USER = 200000002


@dataclass
class WsStack:
    """A running main job with one ws-reverse and (optionally) one ws-forward bot."""

    port: int
    config: Config
    transcripts: TranscriptStore

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/onebot/v11/ws"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def scene(self, bot_id: str, scene_id: str) -> list[tuple[str, str]]:
        """``(direction, body)`` of every transcript row of a scene, oldest first."""
        rows = await self.transcripts.scene("onebot11", bot_id, scene_id)
        return [(r.direction, r.body) for r in rows]


def ws_config(tmp: Path, forward_url: str | None) -> Config:
    bots = [
        BotConfig(
            platform="onebot11", self_id=REVERSE_BOT, transport="ws-reverse", access_token_env=TOKEN_ENV
        )
    ]
    if forward_url is not None:
        bots.append(
            BotConfig(
                platform="onebot11",
                self_id=FORWARD_BOT,
                transport="ws-forward",
                ws_url=forward_url,
                access_token_env=TOKEN_ENV,
            )
        )
    return Config(
        bots=bots,
        database=DatabaseConfig(url=f"sqlite:///{tmp / 'sessionray.db'}"),
        runtime=RuntimeConfig(min_hosts=1, router_shards=1, delivery_actors=1, max_live_sessions=32),
    )


@contextmanager
def ws_stack(tmp: Path, forward_url: str | None = None) -> Iterator[WsStack]:
    """Start everything (module docstring); stop it all, link actors included, afterwards."""
    port = free_port()
    config = ws_config(tmp, forward_url)
    settings = DeliverySettings(database_url=config.database.url, bots=config.bots, backoff_max_s=2.0)
    delivery = create_pool(settings, 1, prefix=f"ws-delivery-{uuid.uuid4().hex[:8]}", sweep_s=0)
    rt = SessionRuntime(prefix=f"ws-{uuid.uuid4().hex[:8]}")
    asyncio.run(
        rt.start(config, setup_factory=ScriptedSetup(str(tmp / "markers")), delivery=delivery, wait_warm=True)
    )
    db = Database(config.database.url)
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(rt, config),
            host="127.0.0.1",
            port=port,
            lifespan="on",
            log_level="warning",
            access_log=False,
        )
    )
    thread = threading.Thread(target=server.run, name="ws-ingress", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:  # start-up wait, not a timing assertion
        assert thread.is_alive() and time.monotonic() < deadline, "ingress did not start"
        time.sleep(0.02)
    try:
        yield WsStack(port, config, TranscriptStore(db))
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        asyncio.run(rt.stop())
        delivery.stop()
        db.dispose()
        for bot in config.bots:
            with contextlib.suppress(ValueError):  # ValueError: never created
                ray.kill(ray.get_actor(link_name(bot.self_id), namespace="sessionray"), no_restart=True)


def event(fixtures_dir: Path, bot_id: str, message_id: int, text: str, user: int = USER) -> str:
    """The recorded private-message event (unchanged on disk) re-addressed to ``bot_id``."""
    ev = json.loads((fixtures_dir / "onebot11" / "event_private_message_array.json").read_bytes())
    ev.update(
        self_id=int(bot_id),
        user_id=user,
        message_id=message_id,
        raw_message=text,
        message=[{"type": "text", "data": {"text": text}}],
    )
    ev["sender"]["user_id"] = user
    return json.dumps(ev, ensure_ascii=False)


def meta(fixtures_dir: Path, bot_id: str, name: str) -> str:
    """A recorded meta event (``event_meta_heartbeat.json``) re-addressed to ``bot_id``; ``name``
    ``lifecycle`` turns it into a ``lifecycle/connect`` event."""
    ev = json.loads((fixtures_dir / "onebot11" / "event_meta_heartbeat.json").read_bytes())
    ev["self_id"] = int(bot_id)
    if name == "lifecycle":
        ev = {k: ev[k] for k in ("time", "self_id", "post_type")}
        ev.update(meta_event_type="lifecycle", sub_type="connect")
    return json.dumps(ev)


def ok_answer(fixtures_dir: Path, echo: str, message_id: int) -> str:
    """The recorded NapCat answer (``api_response_ok_napcat.json``) with ``echo`` and a message id."""
    answer = json.loads((fixtures_dir / "onebot11" / "api_response_ok_napcat.json").read_bytes())
    answer["echo"] = echo
    answer["data"]["message_id"] = message_id
    return json.dumps(answer)


def reply_text(call: dict[str, Any]) -> str:
    """The text of a ``send_private_msg`` call's single text segment."""
    (seg,) = call["params"]["message"]
    assert seg["type"] == "text"
    return str(seg["data"]["text"])

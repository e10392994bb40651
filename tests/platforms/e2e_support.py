"""The whole main job for the end-to-end platform tests: real local Ray runtime (router, warm pool,
session actors with the scripted faux model), a delivery actor, the ingress app served by uvicorn
on 127.0.0.1, and the platform API stand-in (:mod:`tests.platform_api_server`).

Secrets come from environment variables, as in production; they are set when this module is
imported — at test collection, before the session's ``ray.init`` — so the delivery actors' worker
processes inherit them like workers of ``sessionray serve`` do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from actors.delivery.pool import DeliverySettings, create_pool
from actors.inbound.ingress import build_app
from actors.placement.runtime import SessionRuntime
from runtime.config import BotConfig, Config, DatabaseConfig, RuntimeConfig
from runtime.memory.db import Database
from runtime.memory.transcripts import TranscriptStore
from runtime.session.turn import SessionSetup
from tests.actors.session_scripts import ScriptedSetup
from tests.platform_api_server import PlatformApiServer

ENV = {
    "SR_E2E_ONEBOT_SECRET": "onebot-hmac-secret",
    "SR_E2E_ONEBOT_TOKEN": "onebot-access-token",
    "SR_E2E_TG_TOKEN": "1000000099:AAE2E-telegram-token",
    "SR_E2E_TG_SECRET": "telegram-webhook-secret",
    "SR_E2E_CONSOLE_MASTER": "console-master-token",
}
for _k, _v in ENV.items():
    os.environ.setdefault(_k, _v)

ONEBOT_BOT = "1000000001"
"""self_id of the NapCat-style fixtures (array form)."""
ONEBOT_CQ_BOT = "10001000"
"""self_id of the go-cqhttp doc fixture (CQ-string form)."""
TG_BOT = "1000000099"
TG_TOKEN = ENV["SR_E2E_TG_TOKEN"]
MASTER = "admin"


class ConsoleScriptedSetup(ScriptedSetup):
    """:class:`ScriptedSetup` plus the console live-events hook, as ``ConfigSetupFactory`` wires it
    (``runtime.session.console_events.console_event_hook``): console sessions post their tool
    calls to the ingress's ``/console/api/events``."""

    def __init__(self, marker_dir: str, config: Config) -> None:
        super().__init__(marker_dir)
        self.config = config

    def __call__(self, session_key: str) -> SessionSetup:
        from runtime.session.console_events import console_event_hook

        setup = super().__call__(session_key)
        return dataclasses.replace(setup, on_event=console_event_hook(self.config, session_key))


def onebot_headers(body: bytes) -> dict[str, str]:
    """``X-Signature`` of ``body`` with the configured OneBot secret."""
    digest = hmac.new(ENV["SR_E2E_ONEBOT_SECRET"].encode(), body, hashlib.sha1).hexdigest()
    return {"X-Signature": f"sha1={digest}", "Content-Type": "application/json"}


def telegram_headers() -> dict[str, str]:
    """The webhook secret-token header Telegram sends."""
    return {"X-Telegram-Bot-Api-Secret-Token": ENV["SR_E2E_TG_SECRET"], "Content-Type": "application/json"}


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (the ingress binds it right after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    """A running main job."""

    base_url: str
    api: PlatformApiServer
    rt: SessionRuntime
    config: Config
    transcripts: TranscriptStore
    markers: Path
    """Where the scripted ``sleep`` tool records each start (``<call id>.started``)."""

    def tool_starts(self) -> int:
        """How many times the scripted ``sleep`` tool started."""
        return len(list(self.markers.glob("*.started")))

    async def scene(self, platform: str, bot_id: str, scene_id: str) -> list[tuple[str, str]]:
        """``(direction, body)`` of every transcript row of a scene, oldest first."""
        rows = await self.transcripts.scene(platform, bot_id, scene_id)
        return [(r.direction, r.body) for r in rows]


def make_config(tmp: Path, api_base: str, port: int) -> Config:
    """Bots of every platform (two OneBot bots for the two fixture self_ids), SQLite in ``tmp``."""
    onebot = {
        "api_base": api_base,
        "secret_env": "SR_E2E_ONEBOT_SECRET",
        "access_token_env": "SR_E2E_ONEBOT_TOKEN",
        "masters": ["200000002"],
    }
    return Config(
        bots=[
            BotConfig(platform="onebot11", self_id=ONEBOT_BOT, **onebot),
            BotConfig(platform="onebot11", self_id=ONEBOT_CQ_BOT, **onebot),
            BotConfig(
                platform="telegram",
                self_id=TG_BOT,
                username="sessionray_bot",
                api_base=api_base,
                token_env="SR_E2E_TG_TOKEN",
                secret_env="SR_E2E_TG_SECRET",
            ),
            BotConfig(
                platform="console",
                self_id="console",
                api_base=f"http://127.0.0.1:{port}",
                masters=[MASTER],
                master_token_env="SR_E2E_CONSOLE_MASTER",
            ),
        ],
        database=DatabaseConfig(url=f"sqlite:///{tmp / 'sessionray.db'}"),
        runtime=RuntimeConfig(min_hosts=1, router_shards=1, delivery_actors=1, max_live_sessions=32),
    )


@contextmanager
def running_stack(tmp: Path, fixtures_dir: Path) -> Iterator[Stack]:
    """Start everything (see module docstring); stop it all afterwards."""
    port = free_port()
    with PlatformApiServer(fixtures_dir, vary_message_ids=True) as api:
        config = make_config(tmp, api.base_url, port)
        settings = DeliverySettings(database_url=config.database.url, bots=config.bots, backoff_max_s=2.0)
        delivery = create_pool(settings, 1, prefix=f"e2e-delivery-{uuid.uuid4().hex[:8]}", sweep_s=0)
        rt = SessionRuntime(prefix=f"e2e-{uuid.uuid4().hex[:8]}")
        asyncio.run(
            rt.start(
                config,
                setup_factory=ConsoleScriptedSetup(str(tmp / "markers"), config),
                delivery=delivery,
                wait_warm=True,
            )
        )
        db = Database(config.database.url)
        server = uvicorn.Server(
            uvicorn.Config(
                build_app(rt, config),
                host="127.0.0.1",
                port=port,
                lifespan="off",
                log_level="warning",
                access_log=False,
            )
        )
        thread = threading.Thread(target=server.run, name="e2e-ingress", daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:  # start-up wait, not a timing assertion
            assert thread.is_alive() and time.monotonic() < deadline, "ingress did not start"
            time.sleep(0.02)
        try:
            yield Stack(f"http://127.0.0.1:{port}", api, rt, config, TranscriptStore(db), tmp / "markers")
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            asyncio.run(rt.stop())
            delivery.stop()
            db.dispose()


def requests_to(api: PlatformApiServer, path: str, **match: Any) -> list[Any]:
    """JSON bodies of recorded requests to ``path`` whose top-level fields equal ``match``."""
    return [
        r.json
        for r in list(api.requests)
        if r.path == path and all(r.json.get(k) == v for k, v in match.items())
    ]

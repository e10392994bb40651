"""The stack of the Telegram long-polling tests: a real local Ray runtime (router, session hosts
with the scripted faux model whose ``sleep`` tool waits for a gate file), a delivery actor, the
:class:`~actors.inbound.telegram_poll.TelegramPoller` of one ``mode: polling`` bot, the ingress app under
uvicorn on 127.0.0.1 (``/healthz``), and the Bot API stand-in
(:mod:`tests.telegram_updates_server`) serving ``getUpdates`` and ``sendMessage``."""

from __future__ import annotations

import asyncio
import dataclasses
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
from actors.inbound.telegram_poll import start_pollers, stop_pollers
from actors.inbound.telegram_poll_status import poller_name
from actors.placement.runtime import SessionRuntime
from runtime.config import BotConfig, Config, DatabaseConfig, RuntimeConfig
from runtime.memory.db import Database
from runtime.memory.poll_offsets import PollOffsetStore
from runtime.memory.transcripts import TranscriptStore
from runtime.session.turn import SessionSetup
from tests.actors.session_scripts import ScriptedSetup, SleepArgs
from tests.platforms.e2e_support import TG_BOT, free_port
from tests.telegram_updates_server import TelegramUpdatesServer

POLL_TIMEOUT_S = 2
"""``poll_timeout_s`` of the polling bot (a long poll with nothing pending answers after it)."""
GATE = "open"
"""The gate file in the marker directory: the ``sleep`` tool returns once it exists."""


class GatedSetup(ScriptedSetup):
    """:class:`ScriptedSetup` whose ``sleep`` tool (``slow N``) writes ``<call id>.started`` and
    then waits until ``<marker_dir>/open`` exists (the test opens it), answering ``gate open``."""

    def __call__(self, session_key: str) -> SessionSetup:
        from runtime.agent.tools import AgentTool, AgentToolResult

        setup = super().__call__(session_key)
        marker_dir = Path(self.marker_dir)

        async def gated(call_id: str, params: SleepArgs, signal: Any, on_update: Any) -> AgentToolResult:
            (marker_dir / f"{call_id}.started").write_text(session_key)
            while not (marker_dir / GATE).exists():  # a wait for the test's gate, not a timing rule
                await asyncio.sleep(0.05)
            return AgentToolResult.text("gate open")

        return dataclasses.replace(setup, tools=[AgentTool("sleep", "Wait for the gate.", SleepArgs, gated)])


@dataclass
class PollStack:
    """A running polling stack."""

    base_url: str
    api: TelegramUpdatesServer
    rt: SessionRuntime
    config: Config
    transcripts: TranscriptStore
    offsets: PollOffsetStore
    markers: Path

    @property
    def poller(self) -> Any:
        """The bot's poller actor handle."""
        import ray

        return ray.get_actor(poller_name(TG_BOT, self.rt.prefix), namespace="sessionray")

    def sends(self, chat_id: int) -> list[str]:
        """Texts of every ``sendMessage`` to ``chat_id`` so far."""
        return [
            r.json["text"]
            for r in list(self.api.requests)
            if r.path.endswith("/sendMessage") and r.json.get("chat_id") == chat_id
        ]


def make_config(tmp: Path, api_base: str) -> Config:
    """One polling Telegram bot; a mailbox of one message per session (so a second message of a
    chat whose turn runs is refused ``busy``); SQLite in ``tmp``."""
    bot = BotConfig(
        platform="telegram",
        self_id=TG_BOT,
        username="sessionray_bot",
        api_base=api_base,
        token_env="SR_E2E_TG_TOKEN",
        mode="polling",
        poll_timeout_s=POLL_TIMEOUT_S,
    )
    return Config(
        bots=[bot],
        database=DatabaseConfig(url=f"sqlite:///{tmp / 'sessionray.db'}"),
        runtime=RuntimeConfig(
            min_hosts=1, router_shards=1, delivery_actors=1, max_live_sessions=32, mailbox_size=1
        ),
    )


@contextmanager
def running_poll_stack(tmp: Path, fixtures_dir: Path) -> Iterator[PollStack]:
    """Start everything (module docstring); stop it all afterwards."""
    port = free_port()
    with TelegramUpdatesServer(fixtures_dir) as api:
        config = make_config(tmp, api.base_url)
        settings = DeliverySettings(database_url=config.database.url, bots=config.bots, backoff_max_s=2.0)
        delivery = create_pool(settings, 1, prefix=f"poll-delivery-{uuid.uuid4().hex[:8]}", sweep_s=0)
        rt = SessionRuntime(prefix=f"poll-{uuid.uuid4().hex[:8]}")
        setup = GatedSetup(str(tmp / "markers"))
        asyncio.run(rt.start(config, setup_factory=setup, delivery=delivery, wait_warm=True))
        start_pollers(config, rt.prefix)
        db = Database(config.database.url)
        server = uvicorn.Server(
            uvicorn.Config(
                build_app(rt, config), host="127.0.0.1", port=port, lifespan="off", log_level="warning"
            )
        )
        thread = threading.Thread(target=server.run, name="poll-ingress", daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:  # start-up wait, not a timing assertion
            assert thread.is_alive() and time.monotonic() < deadline, "ingress did not start"
            time.sleep(0.02)
        try:
            yield PollStack(
                f"http://127.0.0.1:{port}",
                api,
                rt,
                config,
                TranscriptStore(db),
                PollOffsetStore(db),
                tmp / "markers",
            )
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            asyncio.run(stop_pollers(config, rt.prefix))
            asyncio.run(rt.stop())
            delivery.stop()
            db.dispose()


def update(update_id: int, chat_id: int, message_id: int, text: str, base: dict[str, Any]) -> dict[str, Any]:
    """The recorded private-chat update ``base`` with new ids and text (a user of ``chat_id``)."""
    msg = dict(base["message"])
    msg.update(
        message_id=message_id,
        text=text,
        chat={**msg["chat"], "id": chat_id},
        **{"from": {**msg["from"], "id": chat_id}},
    )
    return {"update_id": update_id, "message": msg}

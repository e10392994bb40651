"""Helpers of the session-runtime tests (CORE-ACTORS): a whole runtime per test module — router
shard(s), the host supervisor and its session hosts with the scripted model, EDGE's delivery pool
and the platform-API test server — plus inbound messages, the scripted gated tools' gates and
bounded polling.

:data:`MODES` are the two ways sessions share processes: ``packed`` (the default: many live
sessions per host) and ``strict`` (``sessions_per_host: 1``: each live session its own host
process). Module-scoped harness fixtures take one as their ``request.param``."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.placement.runtime import SessionRuntime
from runtime.config import BotConfig, Config, DatabaseConfig, RuntimeConfig
from runtime.platforms.base import InboundMessage, Sender
from tests.actors.edge_support import BOT_ID, delivery_pool
from tests.actors.session_scripts import ScriptedSetup
from tests.platform_api_server import PlatformApiServer

MASTER = "9000"
"""The bot's configured master."""

MODES: dict[str, dict[str, Any]] = {"packed": {}, "strict": {"sessions_per_host": 1}}
"""``runtime`` knobs of each host mode (see the module docstring)."""


def inbound(
    user: str, text: str, message_id: str | None = None, *, group: str | None = None
) -> InboundMessage:
    """A OneBot v11 private (or group) text message from ``user`` to the test bot."""
    return InboundMessage(
        platform="onebot11",
        bot_id=BOT_ID,
        message_id=message_id or uuid.uuid4().hex[:12],
        scene_type="group" if group else "private",
        scene_id=group or user,
        sender=Sender(id=user, name=f"user{user}"),
        text=text,
        segments=[{"type": "text", "data": {"text": text}}],
        time_ms=int(time.time() * 1000),
    )


def key_of(user: str) -> str:
    """Session key of ``user``'s private chat with the test bot."""
    return f"onebot11:{BOT_ID}:private:{user}"


@dataclass
class Harness:
    """A running runtime and what tests look at."""

    rt: SessionRuntime
    api: PlatformApiServer
    markers: Path
    config: Config

    def sent(self, user: str) -> list[str]:
        """Texts the platform API received for ``user``'s private chat, in arrival order."""
        out = []
        for r in list(self.api.requests):
            if r.path == "/send_private_msg" and str(r.json.get("user_id")) == user:
                out.append("".join(seg["data"].get("text", "") for seg in r.json["message"]))
        return out

    def tool_starts(self) -> int:
        """How many times the scripted ``sleep`` tool started (all sessions)."""
        return len(list(self.markers.glob("*.started")))

    def gate_waiting(self, gate: str) -> bool:
        """Whether a scripted gated tool (``block`` / ``ablock``) waits at (or passed) ``gate``."""
        return (self.markers / f"gate-{gate}.waiting").exists()

    def gate_done(self, gate: str) -> bool:
        """Whether the gated tool of ``gate`` returned."""
        return (self.markers / f"gate-{gate}.done").exists()

    def open_gate(self, gate: str) -> None:
        """Let the gated tool of ``gate`` return."""
        (self.markers / f"gate-{gate}.open").write_text("")

    async def host_pid(self, user: str) -> int:
        """Process id of the host of ``user``'s live private session.

        Raises:
            AssertionError: the session is not live.
        """
        info = await self.rt.session(key_of(user))
        assert info is not None and info.actor is not None, f"{user} is not live"
        return int(info.actor["pid"])


@contextmanager
def running_runtime(
    tmp_path: Path,
    fixtures_dir: Path,
    *,
    ai: dict[str, Any] | None = None,
    wait_warm: bool = True,
    setup: ScriptedSetup | None = None,
    **knobs: Any,
) -> Iterator[Harness]:
    """Start a runtime with ``runtime`` config ``knobs`` (one host ahead of need, one shard, one
    delivery actor by default) and the ``ai`` section ``ai`` (default: none), and stop it after.
    ``wait_warm=False`` returns before the first host answers (a test that sends no message);
    ``setup``: another scripted setup factory (its database is ``tmp_path / 'sessionray.db'``)."""
    db_url = f"sqlite:///{tmp_path / 'sessionray.db'}"
    knobs = {"min_hosts": 1, "router_shards": 1, "delivery_actors": 1, **knobs}
    with PlatformApiServer(fixtures_dir) as api, delivery_pool(db_url, api.base_url) as delivery:
        config = Config(
            bots=[BotConfig(platform="onebot11", self_id=BOT_ID, api_base=api.base_url, masters=[MASTER])],
            database=DatabaseConfig(url=db_url),
            runtime=RuntimeConfig(**knobs),
            **({"ai": ai} if ai is not None else {}),
        )
        markers = tmp_path / "markers"
        rt = SessionRuntime(prefix=f"test-{uuid.uuid4().hex[:8]}")
        setup = setup if setup is not None else ScriptedSetup(str(markers))
        asyncio.run(rt.start(config, setup_factory=setup, delivery=delivery, wait_warm=wait_warm))
        try:
            yield Harness(rt, api, markers, config)
        finally:
            asyncio.run(rt.stop())


async def eventually(pred: Callable[[], Any], timeout_s: float = 30.0, what: str = "condition") -> Any:
    """Poll ``pred`` (sync or async) every 20 ms until truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(0.02)


async def submit_until_accepted(rt: SessionRuntime, msg: InboundMessage, timeout_s: float = 60.0) -> int:
    """Submit, retrying after ``busy`` as a platform would; returns how many ``busy`` answers came."""
    busy = 0
    deadline = time.monotonic() + timeout_s
    while True:
        res = await rt.submit(msg)
        if res.status != "busy":
            assert res.status == "accepted", res
            return busy
        busy += 1
        assert time.monotonic() < deadline, "still busy"
        await asyncio.sleep(min(res.retry_after_s or 0.1, 0.1))

"""Helpers shared by EDGE's tests (delivery, ingress, CLI): bot configs, a delivery pool per test,
and a platform-API server that can hold a request on the wire (for the kill -9 test)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from actors.delivery.pool import DeliveryJob, DeliveryPool, DeliverySettings, create_pool
from runtime.reply.segments import Reply
from tests.platform_api_server import PlatformApiServer

BOT_ID = "10001"


def onebot_bot(api_base: str, **extra: Any) -> SimpleNamespace:
    """A ``bots:`` entry for OneBot v11 pointing at the test platform-API server."""
    return SimpleNamespace(platform="onebot11", self_id=BOT_ID, api_base=api_base, **extra)


def text_job(text: str, *, scene_id: str = "20002", reply_id: str | None = None) -> DeliveryJob:
    """A private-chat text reply to OneBot user ``scene_id``."""
    return DeliveryJob(
        reply_id=reply_id or uuid.uuid4().hex,
        session_key=f"onebot11:{BOT_ID}:private:{scene_id}",
        platform="onebot11",
        bot_id=BOT_ID,
        scene_type="private",
        scene_id=scene_id,
        reply_to=None,
        reply=Reply.of_text(text),
    )


def private_call(scene_id: str, text: str) -> dict[str, Any]:
    """The exact OneBot v11 JSON body of a private text send."""
    return {"user_id": int(scene_id), "message": [{"type": "text", "data": {"text": text}}]}


@contextmanager
def delivery_pool(
    db_url: str,
    api_base: str,
    size: int = 1,
    *,
    sweep_s: float = 0,
    bot: dict[str, Any] | None = None,
    **settings: Any,
) -> Iterator[DeliveryPool]:
    """``size`` delivery actors with a per-test name prefix (killed at the end); a 10 ms first
    back-off, 0.5 s at most, and no periodic sweep (only the one at each start) unless overridden;
    ``bot``: more fields of the OneBot ``bots:`` entry."""
    settings = {"backoff_base_s": 0.01, "backoff_max_s": 0.5, **settings}
    pool = create_pool(
        DeliverySettings(database_url=db_url, bots=[onebot_bot(api_base, **(bot or {}))], **settings),
        size,
        prefix=f"test-delivery-{uuid.uuid4().hex[:8]}",
        sweep_s=sweep_s,
    )
    try:
        yield pool
    finally:
        pool.stop()


class HoldingApiServer(PlatformApiServer):
    """A platform-API server whose first request is held until :meth:`release` (the send is then
    'on the wire': the platform has received it and not answered)."""

    def __init__(self, fixtures_dir: Path) -> None:
        super().__init__(fixtures_dir)
        self.received = threading.Event()
        self._release = threading.Event()
        self._held = False

    def release(self) -> None:
        """Let the held request (and every later one) answer."""
        self._release.set()

    def _answer(
        self, method: str, path: str, raw_headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        out = super()._answer(method, path, raw_headers, body)
        if not self._held:
            self._held = True
            self.received.set()
            self._release.wait(timeout=60)
        return out


# --------------------------------------------------------------------------- ingress harness

SECRET_ENV = "EDGE_TEST_ONEBOT_SECRET"
SECRET = "edge-test-secret"
TOKEN_ENV = "EDGE_TEST_ADMIN_TOKEN"
TOKEN = "edge-admin-token"
MASTER = "9000"


@contextmanager
def serve_in_thread(app: Any, loop: str = "asyncio") -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (free port) in a daemon thread; yields the base URL.
    ``loop``: uvicorn's loop setting (``sessionray serve`` uses ``uvloop``)."""
    import time

    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, loop=loop, lifespan="off", log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="edge-ingress", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class IngressHarness:
    """A running runtime behind a real ingress, and the platform-API server it sends to."""

    url: str
    api: PlatformApiServer
    runtime: Any
    config: Any
    db_url: str


@contextmanager
def running_ingress(tmp_path: Path, fixtures_dir: Path, **knobs: Any) -> Iterator[IngressHarness]:
    """The whole chain on real local Ray: ingress (uvicorn thread) → runtime (scripted model, see
    tests/actors/session_scripts.py) → delivery pool → platform-API server. The OneBot bot checks
    ``X-Signature`` with :data:`SECRET`; the admin token is :data:`TOKEN` in :data:`TOKEN_ENV`."""
    import asyncio
    import os

    from actors.inbound.ingress import build_app
    from actors.placement.runtime import SessionRuntime
    from runtime.config import BotConfig, Config, DatabaseConfig, RuntimeConfig, ServerConfig
    from tests.actors.session_scripts import ScriptedSetup

    os.environ[SECRET_ENV] = SECRET
    os.environ[TOKEN_ENV] = TOKEN
    db_url = f"sqlite:///{tmp_path / 'ingress.db'}"
    knobs = {"min_hosts": 1, "router_shards": 1, "delivery_actors": 1, **knobs}
    with PlatformApiServer(fixtures_dir) as api, delivery_pool(db_url, api.base_url) as delivery:
        config = Config(
            bots=[
                BotConfig(
                    platform="onebot11",
                    self_id=BOT_ID,
                    api_base=api.base_url,
                    masters=[MASTER],
                    secret_env=SECRET_ENV,
                    trigger="always",
                )
            ],
            database=DatabaseConfig(url=db_url),
            server=ServerConfig(admin_token_env=TOKEN_ENV),
            runtime=RuntimeConfig(**knobs),
        )
        rt = SessionRuntime(prefix=f"edge-{uuid.uuid4().hex[:8]}")
        asyncio.run(
            rt.start(
                config,
                setup_factory=ScriptedSetup(str(tmp_path / "markers")),
                delivery=delivery,
                wait_warm=True,
            )
        )
        try:
            with serve_in_thread(build_app(rt, config)) as url:
                yield IngressHarness(url, api, rt, config, db_url)
        finally:
            asyncio.run(rt.stop())


def onebot_event(fixtures_dir: Path, user: str, text: str, message_id: int) -> bytes:
    """The recorded private-message event (fixtures, unchanged on disk) re-addressed to the test bot."""
    event = json.loads((fixtures_dir / "onebot11" / "event_private_message_array.json").read_bytes())
    event.update(
        self_id=int(BOT_ID),
        user_id=int(user),
        message_id=message_id,
        raw_message=text,
        message=[{"type": "text", "data": {"text": text}}],
    )
    event["sender"]["user_id"] = int(user)
    return json.dumps(event).encode()


def signed(body: bytes, secret: str = SECRET) -> dict[str, str]:
    """OneBot v11 headers with ``X-Signature: sha1=<hmac-sha1 hex of body>``."""
    sig = hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()
    return {"Content-Type": "application/json", "X-Signature": f"sha1={sig}"}


def transcript_rows(db_url: str) -> list[tuple[str, str, str, str, str]]:
    """``(direction, message_id, scene_id, sender_id, body)`` of every ``im_transcripts`` row, by id."""
    from sqlmodel import select

    from runtime.memory.db import Database
    from runtime.memory.tables import ImTranscriptRow

    db = Database(db_url)
    try:
        with db.session() as s:
            rows = s.exec(select(ImTranscriptRow).order_by(ImTranscriptRow.id)).all()  # type: ignore[arg-type]
            return [(r.direction, r.message_id, r.scene_id, r.sender_id, r.body) for r in rows]
    finally:
        db.dispose()

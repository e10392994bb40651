"""The ingress when the database is momentarily unavailable: 503 + Retry-After, then the
platform's redelivery is taken once (real SQLite file locked by another connection, real HTTP).

The runtime here is a local stand-in that keeps the router's dedup rule (a message id it took is
answered ``duplicate``): the ingress's own rule — persist and route concurrently, answer 200 only
when both succeeded — is what is tested; the router's dedup is tested on Ray elsewhere."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx

from actors.ingress import build_app
from actors.runtime import SubmitResult
from runtime.config import BotConfig, Config, DatabaseConfig
from runtime.memory.db import Database
from runtime.memory.transcripts import TranscriptStore
from tests.actors.edge_support import BOT_ID, onebot_event, serve_in_thread


class DedupRuntime:
    """Takes each message id once (like a router shard)."""

    def __init__(self) -> None:
        self.taken: list[str] = []

    async def submit(self, msg: Any) -> SubmitResult:
        if msg.message_id in self.taken:
            return SubmitResult(status="duplicate")
        self.taken.append(msg.message_id)
        return SubmitResult(status="accepted", seq=len(self.taken))

    async def status(self) -> dict[str, Any]:
        return {"live": 0}


def test_locked_database_gives_503_then_the_redelivery_is_taken_once(
    tmp_path: Path, fixtures_dir: Path
) -> None:
    db_file = tmp_path / "ingress.db"
    url = f"sqlite:///{db_file}"
    db = Database(url, busy_timeout_ms=20, write_retry_s=0.2)
    db.create_tables()
    config = Config(
        bots=[BotConfig(platform="onebot11", self_id=BOT_ID, api_base="http://127.0.0.1:9")],
        database=DatabaseConfig(url=url),
    )
    runtime = DedupRuntime()
    body = onebot_event(fixtures_dir, "40404", "hello while locked", 777001)
    hook = f"/webhooks/onebot11/{BOT_ID}"
    with serve_in_thread(build_app(runtime, config, transcripts=TranscriptStore(db))) as base:
        other = sqlite3.connect(db_file, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another writer holds the file
        try:
            first = httpx.post(base + hook, content=body, timeout=30)
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert first.status_code == 503
        assert first.headers["Retry-After"] == "1"
        assert first.json() == {"status": "unavailable", "retry_after_s": 1}
        second = httpx.post(base + hook, content=body, timeout=30)
        assert (second.status_code, second.json()) == (200, {"status": "duplicate"})
        third = httpx.post(base + hook, content=body, timeout=30)
        assert (third.status_code, third.json()) == (200, {"status": "duplicate"})
    assert runtime.taken == ["777001"]  # one turn
    with sqlite3.connect(db_file) as check:
        rows = check.execute("SELECT message_id, direction, body FROM im_transcripts").fetchall()
    assert rows == [("777001", "inbound", "hello while locked")]  # stored once, by the redelivery

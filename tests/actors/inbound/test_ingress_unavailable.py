"""The ingress when the database is momentarily unavailable: 503 + Retry-After with nothing
stored or routed, then the platform's redelivery is stored and routed once (real SQLite file
locked by another connection, real HTTP).

The runtime here is a local stand-in that keeps the host's dedup rule (a message id it took is
answered ``duplicate``): the ingress's own rule — store the message (inbox + transcript row)
before anything else, 503 only when that failed — is what is tested
(docs/decisions.md#inbox-durable); the hosts' dedup is tested on Ray elsewhere."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx

from actors.inbound.ingress import build_app
from actors.placement.runtime import SubmitResult
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
        assert runtime.taken == []  # nothing stored, so nothing routed
        second = httpx.post(base + hook, content=body, timeout=30)
        assert (second.status_code, second.json()) == (200, {"status": "accepted"})
        third = httpx.post(base + hook, content=body, timeout=30)
        assert (third.status_code, third.json()) == (200, {"status": "duplicate"})  # the inbox had it
    assert runtime.taken == ["777001"]  # one turn
    with sqlite3.connect(db_file) as check:
        rows = check.execute("SELECT message_id, direction, body FROM im_transcripts").fetchall()
        inbox = check.execute("SELECT message_id, session_key FROM inbox").fetchall()
    assert rows == [("777001", "inbound", "hello while locked")]  # stored once, by the redelivery
    assert inbox == [("777001", f"onebot11:{BOT_ID}:private:40404")]

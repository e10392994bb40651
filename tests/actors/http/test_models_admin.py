"""``GET /admin/models`` and ``sessionray models``: each configured model's structured-output
tier, its source and age from the shared ``model_capabilities`` rows
(docs/decisions.md#structured-capability-cache).
The admin routes run in a real uvicorn server on loopback; the CLI runs as its own OS process."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

from actors.http.admin import admin_routes
from runtime.config import parse_config
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.reply.capability import CapabilityRecord
from runtime.session.capability_store import SqlCapabilityStore
from tests.actors.edge_support import serve_in_thread

ROOT = Path(__file__).resolve().parents[3]
TOKEN_ENV, TOKEN = "MODELS_ADMIN_TEST_TOKEN", "models-secret"


class StubRuntime:
    def __init__(self, config: Any) -> None:
        self.config = config


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Database]]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    url = f"sqlite:///{tmp_path / 'admin.db'}"
    cfg = parse_config(
        {
            "database": {"url": url},
            "ai": {
                "default_model": "local/qwen",
                "providers": {
                    "local": {
                        "api": "openai-completions",
                        "models": [
                            {"id": "qwen"},
                            {"id": "pinned", "structured_tier": "prompt"},
                            {"id": "new"},
                        ],
                    }
                },
            },
        }
    )
    db = Database(url)
    db.create_tables()
    app = Starlette(routes=admin_routes(StubRuntime(cfg), TOKEN_ENV, repository=ContextRepository(db)))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}", db
    srv.should_exit = True
    thread.join(10)
    db.dispose()


def seed(db: Database) -> None:
    now = int(time.time() * 1000)
    rec = CapabilityRecord(
        "local", "qwen", "tool", "downgrade", now - 300_000, "2 off-schema answers", "prose"
    )
    asyncio.run(SqlCapabilityStore(db).save(rec))


def test_admin_models_lists_tier_source_and_age(server: tuple[str, Database]) -> None:
    url, db = server
    seed(db)
    resp = httpx.get(url + "/admin/models", headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status_code == 200
    rows = resp.json()["models"]
    assert [(r["model"], r["tier"], r["source"]) for r in rows] == [
        ("local/qwen", "tool", "downgrade"),
        ("local/pinned", "prompt", "config"),
        ("local/new", None, None),
    ]
    assert 300 <= rows[0]["age_s"] < 3600 and rows[1]["age_s"] is None
    assert [(r["default"], r["note"]) for r in rows] == [
        (True, "default"),
        (False, ""),
        (False, "probed at first use"),
    ]
    assert rows[0]["reason"] == "2 off-schema answers"
    assert httpx.get(url + "/admin/models").status_code == 401


def test_sessionray_models_prints_the_table(server: tuple[str, Database]) -> None:
    url, db = server
    seed(db)
    env = {**os.environ, TOKEN_ENV: TOKEN}
    base = [sys.executable, "-m", "actors.cli.main", "models", "--url", url, "--token-env", TOKEN_ENV]
    out = subprocess.run(base, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{'MODEL':<32} {'TIER':<8} {'SOURCE':<10} {'AGE':<8} NOTE",
        f"{'local/qwen':<32} {'tool':<8} {'downgrade':<10} {'5 min':<8} default",
        f"{'local/pinned':<32} {'prompt':<8} {'config':<10} -",
        f"{'local/new':<32} {'unknown':<8} {'-':<10} {'-':<8} probed at first use",
    ]
    raw = subprocess.run([*base, "--json"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert json.loads(raw.stdout)["models"][0]["tier"] == "tool"


def test_sessionray_models_on_the_defaults_lists_the_builtin_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no model configured (``make run``'s embedded defaults) ``sessionray models`` names the
    built-in offline model, its tier and that it is never probed — not a bare header."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    env = {**os.environ, TOKEN_ENV: TOKEN}
    url = f"sqlite:///{tmp_path / 'admin.db'}"
    db = Database(url)
    db.create_tables()
    cfg = parse_config({"database": {"url": url}})
    app = Starlette(routes=admin_routes(StubRuntime(cfg), TOKEN_ENV, repository=ContextRepository(db)))
    with serve_in_thread(app) as base:
        cmd = [sys.executable, "-m", "actors.cli.main", "models", "--url", base, "--token-env", TOKEN_ENV]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
        raw = subprocess.run([*cmd, "--json"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    db.dispose()
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"{'MODEL':<32} {'TIER':<8} {'SOURCE':<10} {'AGE':<8} NOTE",
        f"{'builtin/sessionray-builtin':<32} {'native':<8} {'built-in':<10} {'-':<8} "
        "default; built-in offline model, not an LLM: answers every tier, never probed",
    ]
    (row,) = json.loads(raw.stdout)["models"]
    assert (row["model"], row["api"], row["tier"], row["source"], row["default"]) == (
        "builtin/sessionray-builtin",
        "faux",
        "native",
        "built-in",
        True,
    )

"""The ``ai.agent`` knobs through a real ``sessionray serve`` (issue 17, item 4;
docs/decisions.md#agent-iteration-budget, docs/decisions.md#reply-fixed-failure,
docs/decisions.md#session-extra-tools).

One ``sessionray serve --config <tmp>/sessionray.yaml`` process for the whole module: its own local
Ray, SQLite in a temporary folder, a OneBot v11 bot whose platform API is the stand-in
(``tests/platform_api_server.py``). The configuration (built through ``runtime.config``, so a
misspelt key fails here) sets ``ai.agent.max_iterations``, ``failure_text``, ``pre_tools``,
``deferred_tasks`` and ``delegate``, and makes the default model a scripted faux provider named by
``ai.providers.knobs.script`` (docs/decisions.md#faux-script-from-config;
``tests/actors/serve_knobs_script.py`` says what it answers). Each test sends one private message,
signed as OneBot does, from its own user (its own session) to the webhook and asserts the exact
API calls the stand-in receives.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from runtime.config import parse_config
from tests.deploy.harness import SESSIONRAY, Proc, free_port, wait_for
from tests.platform_api_server import PlatformApiServer

ROOT = Path(__file__).resolve().parents[3]
BOT = "1000000001"  # self_id of the recorded OneBot v11 events
SECRET_ENV, SECRET = "SR_KNOBS_ONEBOT_SECRET", "knobs-onebot-secret"
SCRIPT = "tests.actors.serve_knobs_script"
MAX_ITERATIONS = 3
FAILURE_TEXT = "出错了，请再试一次。"
READY_TIMEOUT_S = 300  # a cold local Ray on a loaded 2-core machine
REPLY_TIMEOUT_S = 60


def knobs_config(root: Path, api_base: str, port: int) -> dict[str, Any]:
    """The ``sessionray.yaml`` of the module (module docstring), validated by the config model and
    dumped from it (only the keys set here)."""
    data = {
        "bots": [{"platform": "onebot11", "self_id": BOT, "api_base": api_base, "secret_env": SECRET_ENV}],
        "database": {"url": f"sqlite:///{root}/knobs.db"},
        "server": {"host": "127.0.0.1", "port": port},
        "runtime": {"router_shards": 1, "delivery_actors": 1, "min_hosts": 1},
        "ai": {
            "default_model": "knobs/chat",
            "providers": {
                "knobs": {
                    "api": "faux",
                    "script": f"{SCRIPT}:answer",
                    "models": [{"id": "chat", "structured_tier": "native"}],
                }
            },
            "python_tools": [f"{SCRIPT}:PING"],
            "agent": {
                "max_iterations": MAX_ITERATIONS,
                "failure_text": FAILURE_TEXT,
                "pre_tools": [f"{SCRIPT}:who_asked"],
                "deferred_tasks": {"square": "tests.session.agent_code:square"},
                "delegate": True,
            },
        },
    }
    dumped: dict[str, Any] = parse_config(data, "knobs").model_dump(mode="json", exclude_unset=True)
    return dumped


@dataclass
class Serve:
    """The running ``sessionray serve`` and its platform API stand-in."""

    base_url: str
    api: PlatformApiServer
    proc: Proc

    def say(self, user: int, text: str, message_id: int) -> None:
        """POST a signed private message event of ``user`` to the OneBot webhook."""
        body = json.dumps(
            {
                "self_id": int(BOT),
                "user_id": user,
                "time": int(time.time()),
                "message_id": message_id,
                "message_type": "private",
                "sub_type": "friend",
                "sender": {"user_id": user, "nickname": f"u{user}", "card": ""},
                "raw_message": text,
                "font": 14,
                "message": [{"type": "text", "data": {"text": text}}],
                "message_format": "array",
                "post_type": "message",
            }
        ).encode()
        digest = hmac.new(SECRET.encode(), body, hashlib.sha1).hexdigest()
        resp = httpx.post(
            f"{self.base_url}/webhooks/onebot11/{BOT}",
            content=body,
            headers={"X-Signature": f"sha1={digest}", "Content-Type": "application/json"},
            timeout=30,
        )
        assert (resp.status_code, resp.json()) == (200, {"status": "accepted"}), resp.text

    def sends_to(self, user: int, n: int) -> list[Any]:
        """The JSON bodies of the stand-in's ``/send_private_msg`` calls for ``user``, once there
        are ``n`` of them (polled; fails after :data:`REPLY_TIMEOUT_S`)."""

        def sends() -> list[Any]:
            calls = [r.json for r in list(self.api.requests) if r.path == "/send_private_msg"]
            return [c for c in calls if c["user_id"] == user]

        wait_for(f"{n} send(s) to {user}", lambda: len(sends()) >= n, REPLY_TIMEOUT_S, 0.05, self.proc.output)
        return sends()


@pytest.fixture(scope="module")
def serve(fixtures_dir: Path) -> Iterator[Serve]:
    root = Path(tempfile.mkdtemp(prefix="srknobs-", dir="/tmp"))  # short: Ray socket paths
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SESSIONRAY_"))}
    env |= {"PYTHONPATH": str(ROOT), "RAY_TMPDIR": str(root), SECRET_ENV: SECRET}
    api = PlatformApiServer(fixtures_dir, vary_message_ids=True).start()
    proc: Proc | None = None
    try:
        port = free_port()
        config_file = root / "sessionray.yaml"
        config_file.write_text(
            yaml.safe_dump(knobs_config(root, api.base_url, port), allow_unicode=True), encoding="utf-8"
        )
        argv = [SESSIONRAY, "serve", "--config", str(config_file), "--metrics-export-port", str(free_port())]
        proc = Proc("serve", argv, env, root / "serve.log", cwd=root, stop_signal=signal.SIGINT)
        base_url = f"http://127.0.0.1:{port}"
        started = proc

        def healthy() -> bool:
            if not started.alive():
                pytest.fail(f"sessionray serve exited\n{started.output()}")
            return httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200

        wait_for("sessionray serve /healthz", healthy, READY_TIMEOUT_S, 0.1, proc.output)
        yield Serve(base_url, api, proc)
    finally:
        if proc is not None:
            proc.popen.send_signal(signal.SIGINT)  # Ctrl-C: serve stops the runtime, then Ray
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=60)
            proc.stop(grace_s=5)  # whatever of its process session is left
        api.stop()
        shutil.rmtree(root, ignore_errors=True)


def text_send(user: int, text: str) -> dict[str, Any]:
    """The exact OneBot v11 body of a private text send (a private answer quotes nothing)."""
    return {"user_id": user, "message": [{"type": "text", "data": {"text": text}}]}


def test_max_iterations_ends_a_tool_loop_with_the_budget_summary(serve: Serve) -> None:
    serve.say(300001, "loop", 91001)
    # three LLM calls, each asking for one more ping; then the summary call in the reply schema
    assert serve.sends_to(300001, 1) == [text_send(300001, "budget spent after: pong 1, pong 2, pong 3")]


def test_a_failing_model_sends_the_configured_failure_text(serve: Serve) -> None:
    serve.say(300002, "fail", 91002)
    assert serve.sends_to(300002, 1) == [text_send(300002, FAILURE_TEXT)]


def test_the_model_sees_the_pre_tool_output(serve: Serve) -> None:
    serve.say(300003, "pre", 91003)
    assert serve.sends_to(300003, 1) == [text_send(300003, "pre-tools said: [who_asked] 300003 asked 'pre'")]


def test_a_deferred_task_result_arrives_as_its_own_message(serve: Serve) -> None:
    serve.say(300004, "deferred 12", 91004)
    started = "started deferred task square; its result will be sent to the chat as a separate message"
    assert serve.sends_to(300004, 2) == [
        text_send(300004, f"run_deferred_task: {started}"),
        text_send(300004, "144"),
    ]


def test_delegate_runs_the_sub_agent(serve: Serve) -> None:
    serve.say(300005, "delegate add 2 and 3", 91005)
    assert serve.sends_to(300005, 1) == [text_send(300005, "delegate: helper did: add 2 and 3")]

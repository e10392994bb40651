"""OneBot v11 over WebSocket from the first second of a real ``sessionray serve`` process
(docs/decisions.md#ops-early-accept, docs/decisions.md#security-socket-bots-no-webhook), with the
built-in model and NapCat-like stand-ins on loopback (tests/actors/onebot_impl.py):

* a ``ws-reverse`` bot whose implementation dials ``/onebot/v11/ws`` one second after serve
  started — before ``ready``, as NapCat does — and sends three messages at once;
* a ``ws-forward`` bot whose server is up from the start, and one whose server is down until
  serve is ready (nothing listens at its ``ws_url`` meanwhile).

Serve must not end (nor start a second Ray: exactly one Ray session directory), and every message
is answered exactly once over its socket; unsigned webhook POSTs for the WebSocket bots are
answered 404 and nothing is stored. SIGTERM then stops it with exit 0 and no traceback. One
module fixture runs the start; waits poll with deadlines.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests.actors.onebot_impl import Impl
from tests.actors.serve.test_serve_restart import ray_pids_of, stored, wait_ready
from tests.deploy.harness import SESSIONRAY, Proc, free_port, wait_for

TOKEN_ENV = "ONEBOT_WS_SERVE_TEST_TOKEN"
TOKEN = "serve-ws-access-token"
REVERSE, FORWARD_UP, FORWARD_DOWN = "1000000201", "1000000202", "1000000203"
USER = 200000201
GRACE_S = 10.0
STOP_MARGIN_S = 40.0
ANSWER_TIMEOUT_S = 300


@dataclass
class Started:
    """What one start of serve with the three WebSocket bots showed."""

    impls: dict[str, Impl]
    dialled_before_ready: bool
    """The reverse socket's handshake succeeded before serve printed ``ready``."""
    webhooks: dict[str, tuple[int, Any]]
    """An unsigned group-message webhook POST per WebSocket bot: (status, body)."""
    webhook_stored: bool
    exit_code: int | None
    log: str
    ray_sessions: list[str]
    """Ray session directories under the run's ``RAY_TMPDIR``."""


def write_config(path: Path, port: int, db: Path, up: Impl, down: Impl) -> None:
    bots: list[dict[str, Any]] = [
        {"self_id": REVERSE, "transport": "ws-reverse"},
        {"self_id": FORWARD_UP, "transport": "ws-forward", "ws_url": up.url},
        {"self_id": FORWARD_DOWN, "transport": "ws-forward", "ws_url": down.url},
    ]
    bots = [{"platform": "onebot11", "access_token_env": TOKEN_ENV, **bot} for bot in bots]
    runtime = {"router_shards": 1, "delivery_actors": 1, "min_hosts": 1, "shutdown_grace_s": GRACE_S}
    body = {"bots": bots, "database": {"url": f"sqlite:///{db}"}, "runtime": runtime,
            "server": {"host": "127.0.0.1", "port": port}}  # fmt: skip
    path.write_text(yaml.safe_dump(body))


def group_event(fixtures_dir: Path, bot_id: str, message_id: int) -> dict[str, Any]:
    """The recorded group message re-addressed to ``bot_id``, mentioning it first."""
    ev = json.loads((fixtures_dir / "onebot11" / "event_group_message_array.json").read_bytes())
    ev["message"] = [{"type": "at", "data": {"qq": bot_id}}, *ev["message"]]
    return dict(ev) | {"self_id": int(bot_id), "message_id": message_id}


def cleanup(root: Path) -> None:
    """Kill whatever of the run's Ray (and its keeper) is still running."""
    pids = ray_pids_of(str(root / "rt"))
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if "actors.raylife.keeper" in " ".join(proc.cmdline()) and str(root) in " ".join(proc.cmdline()):
                pids.append(proc.pid)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def started(fixtures_dir: Path) -> Iterator[Started]:
    root = Path(tempfile.mkdtemp(prefix="srws-", dir="/tmp"))  # short: Ray socket paths
    port, metrics_port = free_port(), free_port()
    db = root / "sessionray.db"
    impls = {
        REVERSE: Impl(fixtures_dir, REVERSE, TOKEN, USER),
        FORWARD_UP: Impl(fixtures_dir, FORWARD_UP, TOKEN, USER + 1).listen(),
        FORWARD_DOWN: Impl(fixtures_dir, FORWARD_DOWN, TOKEN, USER + 2),  # listens once serve is ready
    }
    write_config(root / "sessionray.yaml", port, db, impls[FORWARD_UP], impls[FORWARD_DOWN])
    impls[REVERSE].say("early one", "early two", "early three")
    impls[FORWARD_UP].say("up one", "up two")
    impls[FORWARD_DOWN].say("down one", "down two")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SESSIONRAY_"))}
    env |= {"PYTHONPATH": str(Path(__file__).parents[3]), "RAY_TMPDIR": str(root / "rt"), TOKEN_ENV: TOKEN}
    argv = [SESSIONRAY, "serve", "--config", str(root / "sessionray.yaml"),
            "--metrics-export-port", str(metrics_port)]  # fmt: skip
    serve = Proc("serve", argv, env, root / "serve.log", cwd=root)
    try:
        time.sleep(1.0)  # NapCat dials about a second after the start (its own schedule, not ours)
        impls[REVERSE].dial(f"ws://127.0.0.1:{port}/onebot/v11/ws")
        wait_for("the reverse socket", lambda: impls[REVERSE].connections, 120, 0.05, serve.output)
        dialled_before_ready = "sessionray: ready" not in serve.log.read_text(errors="replace")
        wait_ready(serve)
        impls[FORWARD_DOWN].listen()
        impls[REVERSE].say("late one")
        impls[FORWARD_UP].say("up late")

        def all_answered() -> bool:
            if not serve.alive():
                pytest.fail(f"serve exited\n{serve.output()}")
            return all(impl.answered_all() for impl in impls.values())

        wait_for("every message answered", all_answered, ANSWER_TIMEOUT_S, 0.2, serve.output)
        webhooks = {}
        for n, bot in enumerate((REVERSE, FORWARD_UP)):
            r = httpx.post(f"http://127.0.0.1:{port}/webhooks/onebot11/{bot}",
                           json=group_event(fixtures_dir, bot, 95000 + n), timeout=30)  # fmt: skip
            webhooks[bot] = (r.status_code, r.json())
        webhook_stored = stored(db, 95000) or stored(db, 95001)
        serve.popen.send_signal(signal.SIGTERM)
        code = serve.popen.wait(timeout=GRACE_S + STOP_MARGIN_S)
        sessions = sorted(p.name for p in (root / "rt" / "ray").glob("session_2*"))
        yield Started(impls, dialled_before_ready, webhooks, webhook_stored, code,
                      serve.log.read_text(errors="replace"), sessions)  # fmt: skip
    finally:
        serve.stop(grace_s=GRACE_S + STOP_MARGIN_S)
        for impl in impls.values():
            impl.stop()
        cleanup(root)
        shutil.rmtree(root, ignore_errors=True)


def test_the_reverse_socket_came_before_ready(started: Started) -> None:
    assert started.dialled_before_ready  # the start-up race this module is about was exercised


def test_every_message_is_answered_exactly_once_over_its_socket(started: Started) -> None:
    texts = {
        REVERSE: ["early one", "early two", "early three", "late one"],
        FORWARD_UP: ["up one", "up two", "up late"],
        FORWARD_DOWN: ["down one", "down two"],
    }
    for bot, sent in texts.items():
        assert Counter(started.impls[bot].replies()) == Counter(f"You said: {t}" for t in sent), bot


def test_serve_neither_crashed_nor_started_a_second_ray(started: Started) -> None:
    assert started.exit_code == 0, started.log[-3000:]
    assert "Traceback" not in started.log and "ray.init twice" not in started.log
    assert "sessionray: stopped" in started.log
    assert len(started.ray_sessions) == 1, started.ray_sessions


def test_a_websocket_bot_has_no_webhook_route(started: Started) -> None:
    assert started.webhooks == {
        bot: (
            404,
            {"error": f"bot onebot11/{bot} takes its events over its WebSocket ({transport}): no webhook"},
        )
        for bot, transport in ((REVERSE, "ws-reverse"), (FORWARD_UP, "ws-forward"))
    }
    assert not started.webhook_stored


def test_a_ray_call_before_serves_own_ray_init_fails_loudly(tmp_path: Path) -> None:
    # the serve process forbids Ray's auto-init: a Ray call made before serve's own ray.init (a
    # bug like the dialer's) raises instead of starting a second local Ray that races it
    script = (
        "import sys\n"
        "from actors.serve.main import main\n"
        "code = main(['--config', sys.argv[1]])\n"  # a missing file: exits before Ray (2)
        "import ray\n"
        "from actors.delivery.onebot_link import get_link\n"
        "try:\n"
        "    get_link('1')\n"
        "except ray.exceptions.RaySystemError as exc:\n"
        "    print(code, 'refused:', exc, ray.is_initialized())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SESSIONRAY_"))}
    env |= {"PYTHONPATH": str(Path(__file__).parents[3]), "RAY_TMPDIR": str(tmp_path / "rt")}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "missing.yaml")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.stdout.strip() == (
        "2 refused: System error: Ray has not been started yet. You can start Ray with 'ray.init()'. False"
    ), out.stdout + out.stderr
    assert not (tmp_path / "rt").exists()  # no Ray was started

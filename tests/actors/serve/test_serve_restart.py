"""Restarts of a real ``sessionray serve`` process (docs/decisions.md#ops-ray-outlives-driver,
docs/decisions.md#ops-stale-ray, docs/decisions.md#ops-early-accept,
docs/decisions.md#ops-graceful-shutdown), with a OneBot v11 bot whose platform API is the
in-process stand-in and the built-in model:

* ``kill -9`` of the driver leaves its local Ray running (a head of its own, ``ray start``); a new
  serve with the same configuration joins it — the same session directory and head, none of its
  processes stopped, no ``ray start`` — and a message posted while it starts is answered once;
* ``kill -9`` of that driver, then a serve with a changed configuration: the instance was started
  from another fingerprint, so the new serve stops exactly its processes (an unrelated Ray
  instance, ``ray start --head`` with its own temp dir and ports, is untouched), opens its port
  before its own Ray is up (a message is stored and answered ``queued`` while the runtime starts),
  becomes ready without Ray's "timed out during startup", and answers the message once;
* SIGTERM with a turn in flight: the listener closes at once (connections refused), the turn ends
  and its reply reaches the platform before the process exits 0, within the grace plus a margin;
  the Ray instance and its runtime are left running (a planned restart,
  docs/decisions.md#ops-planned-restart), and the next serve with the same configuration joins
  them — none of their processes stopped — and answers a message once; SIGINT of that serve
  stops everything: its Ray, its record and the keeper.

One module fixture runs the three serves (and the unrelated head); the SIGTERM test stops the
last and restarts it. Waits poll with deadlines; the durations are measured and printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from tests.deploy.harness import SESSIONRAY, Proc, RayCluster, free_port, session_members, wait_for
from tests.platform_api_server import PlatformApiServer

BOT = "1000000001"  # self_id of the recorded OneBot v11 events
GRACE_S = 20.0
STOP_MARGIN_S = 40.0
"""Stopping the runtime and Ray after the grace: a few seconds, far more on a loaded machine."""
READY_TIMEOUT_S = 480  # a cold local Ray on a loaded 2-core machine
RAY_START_TIMEOUT = "The current node timed out during startup"


@dataclass
class Restarted:
    """What the fixture saw (times in seconds after the SIGKILL of the driver before)."""

    root: Path
    api: PlatformApiServer
    serve: Proc
    """The last serve (started after the configuration changed)."""
    port: int
    db: Path
    joined: Proc
    """The serve that joined the first one's instance."""
    joined_record: dict[str, Any]
    first_record: dict[str, Any]
    first_pids: list[int]
    """Processes of the first instance when its driver was killed."""
    joined_pids_alive: list[int]
    """Those still running once the joining serve was ready."""
    joined_ready_after_s: float
    leftovers: list[int]
    """Processes of the instance still running after the joining serve was killed."""
    stored_after_s: float
    """The first answer to a webhook for which the message was stored (the last serve)."""
    first_answer: tuple[int, dict[str, Any]]
    ready_after_s: float
    answers: list[tuple[int, dict[str, Any]]]
    head_before: set[int]
    head_after: set[int]
    old_record_left: bool
    """The joined instance's record file was still there once the last serve was ready."""
    new_record: Path
    config: Path
    metrics_port: int


def event(message_id: int, text: str) -> dict[str, Any]:
    """A private OneBot v11 message to the bot (the recorded event with another id and text)."""
    base = json.loads(
        (Path(__file__).parents[2] / "fixtures/onebot11/event_private_message_array.json").read_text()
    )
    return base | {
        "message_id": message_id,
        "raw_message": text,
        "message": [{"type": "text", "data": {"text": text}}],
    }


def stored(db: Path, message_id: int) -> bool:
    """The inbound transcript row of ``message_id`` is in the SQLite file."""
    if not db.exists():
        return False
    with sqlite3.connect(db) as conn:
        try:
            rows = conn.execute(
                "SELECT COUNT(*) FROM im_transcripts WHERE message_id = ? AND direction = 'inbound'",
                (str(message_id),),
            ).fetchone()
        except sqlite3.OperationalError:  # the table is not there yet
            return False
    return bool(rows[0])


def post(port: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """POST the webhook; None when the port refuses the connection."""
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/webhooks/onebot11/{BOT}", json=body, timeout=30)
    except httpx.ConnectError:
        return None
    return r.status_code, r.json()


def replies_to(api: PlatformApiServer, needle: str) -> list[Any]:
    """Bodies of the platform sends whose text contains ``needle``."""
    return [r.json for r in api.requests if r.path == "/send_private_msg" and needle in json.dumps(r.json)]


def ray_pids_of(session_dir: str) -> list[int]:
    """Live processes with a file open under ``session_dir`` (every Ray process of that instance
    keeps its logs open there)."""
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any(
                f.path.startswith(session_dir + "/") for f in proc.open_files()
            ):
                out.append(proc.pid)
        except psutil.Error:
            continue
    return out


def start_serve(name: str, root: Path, config: Path, metrics_port: int) -> Proc:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SESSIONRAY_"))}
    env |= {"PYTHONPATH": str(Path(__file__).parents[3]), "RAY_TMPDIR": str(root / "rt")}
    argv = [SESSIONRAY, "serve", "--config", str(config), "--metrics-export-port", str(metrics_port)]
    return Proc(name, argv, env, root / f"{name}.log", cwd=root, stop_signal=signal.SIGINT)


def wait_ready(serve: Proc) -> None:
    """Until ``serve`` printed ``ready``; fails at once when it exits or Ray's start timed out."""

    def ready() -> bool:
        text = serve.log.read_text(errors="replace")
        if RAY_START_TIMEOUT in text or not serve.alive():
            pytest.fail(f"{serve.name} did not start\n{serve.output()}")  # not caught by wait_for
        return "sessionray: ready" in text

    wait_for(f"{serve.name} ready", ready, READY_TIMEOUT_S, interval_s=0.1, diagnostics=serve.output)


def wait_ray_up(serve: Proc, root: Path) -> tuple[Path, str]:
    """Until ``serve``'s local Ray runs: its record (``actors.raylife.stale``) names the session
    directory. Returns the record file and the session directory."""
    record = root / "rt" / "ray" / f"sessionray-serve-{serve.popen.pid}.json"

    def session_dir() -> str | None:
        if not serve.alive():
            pytest.fail(f"{serve.name} exited\n{serve.output()}")
        try:
            return json.loads(record.read_text()).get("session_dir")  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    found = wait_for(
        f"{serve.name}'s Ray", session_dir, READY_TIMEOUT_S, interval_s=0.1, diagnostics=serve.output
    )
    return record, str(found)


def write_config(path: Path, port: int, db: Path, api: PlatformApiServer, **runtime: Any) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "bots": [{"platform": "onebot11", "self_id": BOT, "api_base": api.base_url}],
                "database": {"url": f"sqlite:///{db}"},
                "server": {"host": "127.0.0.1", "port": port},
                "runtime": {
                    "router_shards": 1,
                    "delivery_actors": 1,
                    "min_hosts": 1,
                    "shutdown_grace_s": GRACE_S,
                    **runtime,
                },
            }
        )
    )


def answer_until_stored(port: int, db: Path, body: dict[str, Any], serve: Proc) -> list[tuple[int, Any]]:
    """POST ``body`` until one answer came back with the message stored; returns the answers."""
    answers: list[tuple[int, dict[str, Any]]] = []

    def answered_and_stored() -> bool:
        answer = post(port, body)
        if answer is not None:
            answers.append(answer)
        return answer is not None and stored(db, body["message_id"])

    wait_for(
        f"{serve.name} to store a message",
        answered_and_stored,
        120,
        interval_s=0.05,
        diagnostics=serve.output,
    )
    return answers


def answered(
    api: PlatformApiServer, port: int, body: dict[str, Any], answers: list[Any], serve: Proc
) -> None:
    """Until the reply to ``body`` reached the platform (redelivered until a 200, as a platform would)."""

    def done() -> bool:
        if answers[-1][0] != 200:
            answer = post(port, body)
            if answer is not None:
                answers.append(answer)
        return bool(replies_to(api, body["raw_message"]))

    wait_for("the reply to the message stored while starting", done, 180, diagnostics=serve.output)


@pytest.fixture(scope="module")
def restarted(fixtures_dir: Path) -> Iterator[Restarted]:
    root = Path(tempfile.mkdtemp(prefix="srrs-", dir="/tmp"))  # short: Ray socket paths
    api = PlatformApiServer(fixtures_dir).start()
    port, metrics_port = free_port(), free_port()
    db = root / "sessionray.db"
    config = root / "sessionray.yaml"
    write_config(config, port, db, api)
    (root / "other").mkdir()
    other = RayCluster(root / "other")
    serves: list[Proc] = []
    try:
        serves.append(first := start_serve("serve-a", root, config, metrics_port))
        other.start_head({"unrelated": 1}, num_cpus=1, dashboard=False)  # meanwhile serve-a starts
        first_record_path, session_dir = wait_ray_up(first, root)  # the crash comes while its runtime starts
        head_before = set(session_members(other.nodes[0].sid))
        first_record = json.loads(first_record_path.read_text())
        first_pids = [p for p in ray_pids_of(session_dir) if p != first.popen.pid]  # the instance's

        os.kill(first.popen.pid, signal.SIGKILL)
        killed = time.monotonic()
        first.popen.wait(timeout=30)
        serves.append(joined := start_serve("serve-b", root, config, metrics_port))
        body = event(9000, "hello to the joined instance")
        joined_answers = answer_until_stored(port, db, body, joined)
        wait_ready(joined)
        joined_ready_after = time.monotonic() - killed
        joined_pids_alive = [
            p for p in first_pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
        ]
        answered(api, port, body, joined_answers, joined)
        joined_record_path = root / "rt" / "ray" / f"sessionray-serve-{joined.popen.pid}.json"
        joined_record = json.loads(joined_record_path.read_text())

        write_config(config, port, db, api, replay_window_s=601)  # another fingerprint
        os.kill(joined.popen.pid, signal.SIGKILL)
        killed = time.monotonic()
        joined.popen.wait(timeout=30)
        leftovers = ray_pids_of(session_dir)
        serves.append(second := start_serve("serve-c", root, config, metrics_port))
        body = event(9001, "hello after the crash")
        answers = answer_until_stored(port, db, body, second)
        stored_after = time.monotonic() - killed
        first_answer = answers[-1]
        wait_ready(second)
        ready_after = time.monotonic() - killed
        answered(api, port, body, answers, second)
        [new_record] = (root / "rt" / "ray").glob(f"sessionray-serve-{second.popen.pid}.json")
        old_record_left = joined_record_path.exists()
        print(  # the restart figures (pytest -s shows them)
            f"\nrestart after SIGKILL, same configuration: joined, ready {joined_ready_after:.1f} s; "
            f"changed configuration: message stored {stored_after:.1f} s, ready {ready_after:.1f} s; "
            f"{len(leftovers)} leftovers of the old Ray stopped"
        )
        yield Restarted(
            root, api, second, port, db, joined, joined_record, first_record, first_pids, joined_pids_alive,
            joined_ready_after, leftovers, stored_after, first_answer, ready_after, answers, head_before,
            set(session_members(other.nodes[0].sid)), old_record_left, new_record, config, metrics_port,
        )  # fmt: skip
    finally:
        for proc in reversed(serves):
            proc.stop(grace_s=GRACE_S + STOP_MARGIN_S)
        other.stop()
        api.stop()


def test_a_new_serve_with_the_same_configuration_joins_the_killed_drivers_ray(restarted: Restarted) -> None:
    log = restarted.joined.log.read_text(errors="replace")
    assert "joining the local Ray of a sessionray serve that ended" in log
    assert "sessionray: the local Ray of a sessionray serve that died" not in log  # nothing stopped
    assert restarted.first_pids and restarted.joined_pids_alive == restarted.first_pids
    first, joined = restarted.first_record, restarted.joined_record
    assert joined["session_dir"] == first["session_dir"] and joined["head_pid"] == first["head_pid"]
    assert joined["gcs_address"] == first["gcs_address"] and joined["fingerprint"] == first["fingerprint"]
    assert len(replies_to(restarted.api, "You said: hello to the joined instance")) == 1
    # a plain ray.init() of another program does not find sessionray's heads (`ray start` names
    # its head there; serve puts the file back as it was: none)
    assert not (restarted.root / "rt" / "ray" / "ray_current_cluster").exists()


def test_a_changed_configuration_stops_what_the_killed_driver_left_and_nothing_else(
    restarted: Restarted,
) -> None:
    log = restarted.serve.log.read_text(errors="replace")
    assert restarted.leftovers, "the killed driver left no Ray process (nothing to clean up)"
    assert [
        p for p in restarted.leftovers if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
    ] == []
    assert "sessionray: the local Ray of a sessionray serve that died" in log
    assert "joining the local Ray" not in log
    assert RAY_START_TIMEOUT not in log
    assert not restarted.old_record_left
    # the unrelated instance keeps every process it had
    assert restarted.head_before <= restarted.head_after


def test_the_local_head_runs_no_dashboard_api_server_and_its_agent_does_not_look_for_one(
    restarted: Restarted,
) -> None:
    # docs/decisions.md#ops-single-machine-profile: `ray start --head` without Ray's dashboard API
    # server (≈ 77 MiB); the head records an address in its place, so the dashboard agent, which
    # asks for one at start and then every second until it exists, finds it at once
    session_dir = json.loads(restarted.new_record.read_text())["session_dir"]
    commands = []
    for pid in ray_pids_of(session_dir):
        with contextlib.suppress(psutil.Error):
            commands.append(" ".join(psutil.Process(pid).cmdline()))
    assert any("DashboardAgent" in c or "dashboard/agent.py" in c for c in commands), commands
    assert not [c for c in commands if "dashboard/dashboard.py" in c]  # the API server's script
    agent_log = (Path(session_dir) / "logs" / "dashboard_agent.log").read_text(errors="replace")
    assert "Loaded" in agent_log and "modules" in agent_log  # the agent started its modules
    assert "Get dashboard http address failed" not in agent_log


def test_the_port_stores_and_answers_before_ray_is_up(restarted: Restarted) -> None:
    # stored and answered while the runtime was starting: 200 queued (the start-up recovery routes it)
    assert restarted.first_answer == (200, {"status": "queued"})
    assert restarted.stored_after_s < restarted.ready_after_s
    assert len(replies_to(restarted.api, "You said: hello after the crash")) == 1
    assert restarted.answers[-1][0] == 200


def test_sigterm_lets_the_turn_in_flight_deliver_then_exits_0_and_the_next_serve_joins(
    restarted: Restarted,
) -> None:
    serve, api, root = restarted.serve, restarted.api, restarted.root
    assert post(restarted.port, event(9002, "count to 3 slowly")) == (200, {"status": "accepted"})
    record = json.loads(restarted.new_record.read_text())
    pids = [p for p in ray_pids_of(record["session_dir"]) if p != serve.popen.pid]
    signalled = time.monotonic()
    serve.popen.send_signal(signal.SIGTERM)

    def listener_closed() -> bool:
        return "stopping: listener closed" in serve.log.read_text(errors="replace")

    wait_for("the listener to close", listener_closed, 30, interval_s=0.05, diagnostics=serve.output)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", restarted.port), timeout=5).close()
    code = serve.popen.wait(timeout=GRACE_S + STOP_MARGIN_S)
    took = time.monotonic() - signalled
    log = serve.log.read_text(errors="replace")
    print(f"\nSIGTERM with a turn in flight: exit {code} after {took:.1f} s")
    assert code == 0, serve.output()
    assert len(replies_to(api, "counted to 3: 1 2 3")) == 1  # delivered before the exit
    assert "sessionray: stopping: turns: 1 in flight, 1 ended, 0 cut off" in log
    assert "sessionray: stopping: runtime and Ray left running for the next start" in log
    assert "sessionray: stopped" in log and "Traceback" not in log
    assert restarted.new_record.exists()  # the instance stays named for the next start
    assert pids and [p for p in pids if not psutil.pid_exists(p)] == []

    restarted_at = time.monotonic()
    again = start_serve("serve-d", root, restarted.config, restarted.metrics_port)
    try:
        wait_ready(again)
        ready_s = time.monotonic() - restarted_at
        log = again.log.read_text(errors="replace")
        print(f"planned restart (SIGTERM, then serve): ready {ready_s:.1f} s after the start")
        assert "joining the local Ray of a sessionray serve that ended" in log
        assert "sessionray: the local Ray of a sessionray serve that died" not in log  # nothing stopped
        assert [p for p in pids if not psutil.pid_exists(p)] == []
        joined = json.loads((root / "rt" / "ray" / f"sessionray-serve-{again.popen.pid}.json").read_text())
        assert joined["session_dir"] == record["session_dir"] and joined["head_pid"] == record["head_pid"]
        assert not restarted.new_record.exists()  # the joining serve's record names the instance now
        body = event(9003, "hello after a planned restart")
        answers = answer_until_stored(restarted.port, restarted.db, body, again)
        answered(api, restarted.port, body, answers, again)
        assert len(replies_to(api, "You said: hello after a planned restart")) == 1
    finally:
        again.popen.send_signal(signal.SIGINT)  # Ctrl-C: everything stops
        code = again.popen.wait(timeout=GRACE_S + STOP_MARGIN_S)
        again.stop()
    log = again.log.read_text(errors="replace")
    assert code == 0 and "stopping Ray" in log and "Traceback" not in log, again.output()
    assert list((root / "rt" / "ray").glob("sessionray-serve-*.json")) == []  # forgotten
    assert ray_pids_of(str(root / "rt" / "ray")) == []  # and stopped

    def keepers() -> list[int]:
        found = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                line = " ".join(proc.cmdline())
                if "actors.raylife.keeper" in line and str(root) in line and proc.status() != "zombie":
                    found.append(proc.pid)
        return found

    wait_for("the keeper to end with its instance", lambda: not keepers(), 30)

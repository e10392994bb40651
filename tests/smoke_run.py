"""The README's ``make run``, as a new user runs it, end to end (run by ``.ci/run`` after the suite,
with ``HOME`` an empty directory): ``python -m tests.smoke_run [--timeout-s S]``.

1. ``make run`` in the repository root (free ports through ``RUN_ARGS``, everything else as the
   README says: embedded defaults, local Ray, SQLite under ``./data``), in a process group of its
   own as a terminal would run it;
2. waits for ``sessionray: ready``;
3. sends one console message the way the browser does (``POST /webhooks/console/console``) while
   listening on the browser's reply stream (``GET /console/api/stream``), and waits for the
   built-in model's answer on it;
4. Ctrl-C: SIGINT to the process group; waits for ``sessionray: stopped``;
5. checks that no process of that run's Ray instance is left (nothing with its session directory
   open or on its command line, no keeper).

Every wait is bounded; the whole run by ``--timeout-s`` (default 600). Exit 0 when every step
passed, 1 otherwise, with one ``smoke: …`` line per step and the tail of the output on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil

from actors.raylife.stale import ray_temp_root

ROOT = Path(__file__).resolve().parents[1]
BOT = "console"
USER = "smoke"


class SmokeFailed(Exception):
    """A step did not pass; the message says which and why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def say(line: str) -> None:
    print(f"smoke: {line}", flush=True)


def until(what: str, check: Callable[[], object], deadline: float, interval_s: float = 0.2) -> object:
    """Poll ``check`` until it returns a truthy value (returned) or ``deadline`` (monotonic) passes."""
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise SmokeFailed(f"timed out waiting for {what}")


def serve_pid(make: subprocess.Popen[bytes]) -> int | None:
    """The ``sessionray serve`` process ``make run`` started."""
    try:
        for child in psutil.Process(make.pid).children(recursive=True):
            if "serve" in child.cmdline() and any(a.endswith("sessionray") for a in child.cmdline()):
                return child.pid
    except psutil.Error:
        return None
    return None


def ask_console(port: int, text: str, timeout_s: float) -> str:
    """Send ``text`` as the browser does and return the first reply on the browser's stream."""
    base = f"http://127.0.0.1:{port}"
    body = {"message_id": f"c-{uuid.uuid4()}", "user": USER, "scene": "private", "text": text,
            "time_ms": int(time.time() * 1000)}  # fmt: skip
    timeout = httpx.Timeout(timeout_s, connect=10)
    with httpx.Client(base_url=base, timeout=timeout) as client, client.stream(
        "GET", "/console/api/stream", params={"user": USER}
    ) as stream:
        if stream.status_code != 200:
            raise SmokeFailed(f"GET /console/api/stream answered {stream.status_code}")
        posted = client.post(f"/webhooks/console/{BOT}", json=body)
        if posted.status_code != 200:
            raise SmokeFailed(f"POST /webhooks/console/{BOT} answered {posted.status_code}: {posted.text}")
        say(f"message sent: {posted.json()}")
        deadline = time.monotonic() + timeout_s
        for line in stream.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event.get("type") == "reply":
                    return json.dumps(event, ensure_ascii=False)
            if time.monotonic() > deadline:
                break
    raise SmokeFailed("no reply on the console stream")


def instance_processes(session_dir: str) -> list[str]:
    """Live processes of the Ray instance whose session directory is ``session_dir``, and keepers."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            line = " ".join(proc.cmdline())
            if session_dir in line or any(f.path.startswith(session_dir + "/") for f in proc.open_files()):
                found.append(f"{proc.pid} ({line[:80]})")
        except psutil.Error:
            continue
    return found


def run(timeout_s: float, log: Path) -> None:
    """The steps of the module docstring; raises :class:`SmokeFailed`."""
    deadline = time.monotonic() + timeout_s
    port, metrics = free_port(), free_port()
    argv = ["make", "--no-print-directory", "run", f"RUN_ARGS=--port {port} --metrics-export-port {metrics}"]
    say(f"{' '.join(argv[:3])} in {ROOT} (HOME={os.environ.get('HOME')}), HTTP port {port}")
    with log.open("wb") as out:
        make = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    session_dir = ""
    try:
        started = time.monotonic()

        def ready() -> bool:
            if make.poll() is not None:
                raise SmokeFailed(f"make run exited {make.returncode} before ready")
            return "sessionray: ready" in log.read_text(errors="replace")

        until("sessionray: ready", ready, deadline)
        say(f"ready after {time.monotonic() - started:.1f} s")
        pid = serve_pid(make)
        record = ray_temp_root() / f"sessionray-serve-{pid}.json"
        session_dir = str(json.loads(record.read_text()).get("session_dir") or "") if record.is_file() else ""
        if not session_dir:
            raise SmokeFailed(f"no record of the local Ray at {record}")
        reply = ask_console(port, "hello from the smoke test", max(10.0, deadline - time.monotonic()))
        if "hello from the smoke test" not in reply:
            raise SmokeFailed(f"the reply does not answer the message: {reply}")
        say(f"console answered: {reply[:160]}")
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGINT)  # Ctrl-C in the terminal
        try:
            make.wait(timeout=max(30.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            raise SmokeFailed("make run did not stop after SIGINT") from None
    text = log.read_text(errors="replace")
    if "sessionray: stopped" not in text or "Traceback" in text:
        raise SmokeFailed("serve did not stop cleanly after SIGINT")
    say("stopped after SIGINT")
    try:
        until("the run's Ray to be gone", lambda: not instance_processes(session_dir), deadline)
    except SmokeFailed:
        raise SmokeFailed(f"Ray processes of the run left: {instance_processes(session_dir)}") from None
    say(f"no Ray process of the run is left ({session_dir})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.smoke_run", description=__doc__.splitlines()[0])
    p.add_argument("--timeout-s", type=float, default=600.0, help="bound on the whole run (default 600)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="smoke-") as tmp:
        log = Path(tmp) / "make-run.log"
        try:
            run(args.timeout_s, log)
        except (SmokeFailed, OSError, httpx.HTTPError, ValueError) as exc:
            say(f"FAILED: {exc}")
            print("\n".join(log.read_text(errors="replace").splitlines()[-60:]), flush=True)
            return 1
    say("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The stale-Ray clean-up (actors/raylife/stale.py, docs/decisions.md#ops-stale-ray) on real processes
that stand in for a crashed driver's leftovers, without Ray: exactly the dead driver's processes
are stopped — a recorded pid with the same start time, a Ray process with a file open in its
session directory or naming it, and their children — and nothing else: not a process of another
session directory, not a reused pid, not the instance of a driver that still runs.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from actors.raylife.port_holders import describe_process, port_holders_text
from actors.raylife.stale import LocalRayRun, clear_stale_ray, record_local_ray, run_file, stop_instance

LISTEN = "import socket, time\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\ns.listen()\ntime.sleep(120)\n"
"""A process that listens on a free loopback port."""
HOLD = "import sys, time\nf = open(sys.argv[1], 'a')\ntime.sleep(120)\n"
"""A process that keeps ``argv[1]`` open (as a Ray daemon keeps its log files open)."""


def started(pid: int) -> float:
    return round(psutil.Process(pid).create_time(), 2)


def wait_until(what: str, check: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started_procs: list[subprocess.Popen[bytes]] = []
    yield started_procs
    for p in started_procs:
        for child in psutil.Process(p.pid).children(recursive=True) if p.poll() is None else []:
            child.kill()
        p.kill()
        p.wait()


def spawn(
    procs: list[subprocess.Popen[bytes]], *argv: str, title: str | None = None
) -> subprocess.Popen[bytes]:
    """A Python process; ``title``: its ``argv[0]`` (Ray's workers and agents show ``ray::…``)."""
    p = subprocess.Popen(
        [title or sys.executable, *argv], executable=sys.executable, stdin=subprocess.DEVNULL
    )
    procs.append(p)
    return p


def holding(
    procs: list[subprocess.Popen[bytes]], path: Path, title: str | None = None
) -> subprocess.Popen[bytes]:
    """A process that holds ``path`` open, as a Ray daemon keeps its logs open."""
    path.parent.mkdir(parents=True, exist_ok=True)
    p = spawn(procs, "-c", HOLD, str(path), title=title)
    wait_until(f"{path} open", lambda: any(f.path == str(path) for f in psutil.Process(p.pid).open_files()))
    return p


def dead_driver() -> tuple[int, float]:
    """The pid and start time of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    when = started(p.pid)
    p.wait()
    return p.pid, when


def write_record(root: Path, run: LocalRayRun) -> Path:
    path = run_file(root, run.driver_pid)
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(run)))
    return path


def alive_pid(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def alive(p: subprocess.Popen[bytes]) -> bool:
    return alive_pid(p.pid)


def test_only_the_dead_drivers_instance_is_stopped(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    root = tmp_path / "ray"
    pid, when = dead_driver()
    session = root / f"session_2026-01-01_00-00-00_000001_{pid}"
    other_session = root / "session_2026-01-01_00-00-00_000002_1"

    # e.g. the raylet: found by pid + start time; it listens on a recorded port
    recorded = spawn(procs, "-c", LISTEN)
    wait_until("a listener", lambda: psutil.Process(recorded.pid).net_connections(kind="tcp"))
    [conn] = psutil.Process(recorded.pid).net_connections(kind="tcp")
    agent = holding(procs, session / "logs" / "dashboard_agent.log", title="ray::DashboardAgent")
    worker = holding(procs, session / "logs" / "worker.out", title="ray::IDLE")
    other = holding(procs, other_session / "logs" / "raylet.out", title="ray::raylet")  # another instance
    reused = spawn(procs, "-c", "import time; time.sleep(120)")  # a pid recorded with another start
    tail = holding(procs, session / "logs" / "raylet.out")  # an operator's `tail -f`: not Ray

    run = LocalRayRun(
        driver_pid=pid,
        driver_started=when,
        uid=os.getuid(),
        temp_root=str(root),
        session_dir=str(session),
        processes=[
            (recorded.pid, started(recorded.pid), "raylet"),
            (reused.pid, started(reused.pid) - 5, "x"),
        ],
        ports=[conn.laddr.port],
    )
    dead_record = write_record(root, run)
    live = LocalRayRun(os.getpid(), started(os.getpid()), os.getuid(), str(root), str(other_session), [], [])
    live_record = write_record(root, live)

    [cleared] = clear_stale_ray(root, term_wait_s=2.0)

    assert cleared.driver_pid == pid
    assert cleared.session_dirs == [str(session)]
    stopped = sorted(int(name.split()[0]) for name in cleared.stopped)
    assert stopped == sorted([recorded.pid, agent.pid, worker.pid])
    assert cleared.left == [] and cleared.busy_ports == []
    for p in (recorded, agent, worker):
        wait_until(f"{p.pid} reaped", lambda p=p: p.poll() is not None)
    assert port_holders_text(conn.laddr.port) is None  # its port is free again
    assert [alive(p) for p in (other, reused, tail)] == [True] * 3
    assert not dead_record.exists() and live_record.exists()


def test_children_of_a_leftover_are_stopped(tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    root = tmp_path / "ray"
    pid, when = dead_driver()
    session = root / f"session_2026-01-01_00-00-00_000003_{pid}"
    log = session / "logs" / "raylet.out"
    log.parent.mkdir(parents=True)
    script = (
        "import subprocess, sys, time\n"
        "f = open(sys.argv[1], 'a')\n"
        "c = subprocess.Popen([sys.argv[2], '-c', 'import time; time.sleep(120)'])\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        ["ray::raylet", "-c", script, str(log), sys.executable],
        executable=sys.executable,
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    procs.append(parent)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    write_record(root, LocalRayRun(pid, when, os.getuid(), str(root), str(session), [], []))

    [cleared] = clear_stale_ray(root, term_wait_s=2.0)

    assert sorted(int(n.split()[0]) for n in cleared.stopped) == sorted([parent.pid, child])
    wait_until("the leftover's child gone", lambda: not alive_pid(child))


def test_a_driver_killed_during_ray_start_is_found_by_its_session_name(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    root = tmp_path / "ray"
    pid, when = dead_driver()
    head_pid, _ = dead_driver()  # the `ray start --head` process: Ray names the session after it
    # written once the head process was spawned: no session directory yet
    write_record(root, LocalRayRun(pid, when, os.getuid(), str(root), head_pid=head_pid))
    session = root / f"session_2026-01-01_00-00-00_000004_{head_pid}"
    gcs = holding(procs, session / "logs" / "gcs_server.out", title="ray::gcs")
    older = root / f"session_2026-01-01_00-00-00_000005_{head_pid}"  # an earlier process with that pid
    older.mkdir(parents=True)
    os.utime(older, (when - 3600, when - 3600))
    of_driver = holding(procs, root / f"session_2026-01-01_00-00-00_000006_{pid}" / "x.out", title="ray::y")

    [cleared] = clear_stale_ray(root, term_wait_s=2.0)

    assert cleared.session_dirs == [str(session)]
    assert [int(n.split()[0]) for n in cleared.stopped] == [gcs.pid]
    assert alive(of_driver)  # named after the driver, not after its head: not this instance


def test_record_names_the_instances_processes_their_ports_and_what_it_shares(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    session = tmp_path / "session_x"
    server = spawn(procs, "-c", LISTEN + f"# {session}/logs", title="ray::gcs_server")  # names it
    wait_until("a listener", lambda: psutil.Process(server.pid).net_connections(kind="tcp"))
    [conn] = psutil.Process(server.pid).net_connections(kind="tcp")
    other = spawn(procs, "-c", LISTEN, title="ray::other")  # another instance's

    path = record_local_ray(
        str(session), root=tmp_path, gcs_address="127.0.0.1:1", fingerprint="f", env={"T": "secret"}
    )

    run = json.loads(path.read_text())
    assert path == tmp_path / f"sessionray-serve-{os.getpid()}.json"
    assert path.stat().st_mode & 0o777 == 0o600  # it holds the shared secrets
    assert run["driver_pid"] == os.getpid() and run["session_dir"] == str(session)
    assert [[p[0], p[1]] for p in run["processes"]] == [[server.pid, started(server.pid)]]
    assert other.pid not in [p[0] for p in run["processes"]]
    assert conn.laddr.port in run["ports"]
    assert (run["gcs_address"], run["fingerprint"], run["env"]) == ("127.0.0.1:1", "f", {"T": "secret"})
    assert clear_stale_ray(tmp_path) == []  # this driver runs: its instance is left alone
    assert alive(server) and path.exists()


def test_port_holder_is_named_with_pid_and_command() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        text = port_holders_text(port)
    me = psutil.Process()
    cmd = " ".join(" ".join(me.cmdline()).split())  # one space between words
    assert text == f"pid {me.pid}: {cmd if len(cmd) <= 120 else cmd[:119] + '…'}"
    assert describe_process(me.pid) == text
    assert port_holders_text(port) is None  # closed: nobody listens


def test_a_failed_head_start_is_stopped_before_the_retry(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    root = tmp_path / "ray"
    head = spawn(procs, "-c", "import time; time.sleep(120)")  # stands in for `ray start --head`
    mine = root / f"session_2026-01-01_00-00-00_000006_{head.pid}"  # Ray names it after the head
    raylet = holding(procs, mine / "logs" / "raylet.out", title="ray::raylet")
    other = holding(
        procs, root / "session_2026-01-01_00-00-00_000007_1" / "logs" / "raylet.out", title="ray::x"
    )

    stopped = stop_instance(LocalRayRun.of_head(head.pid, root))

    assert sorted(int(n.split()[0]) for n in stopped) == sorted([head.pid, raylet.pid])
    wait_until("the half-started raylet gone", lambda: not alive(raylet) and not alive(head))
    assert alive(other)

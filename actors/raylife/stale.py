"""The local Ray instance a ``sessionray serve`` started, recorded so that the next start can stop
what a crashed driver left behind (docs/decisions.md#ops-stale-ray).

Why: Ray's daemons are tied to the driver that started them (the kernel kills most of them when it
dies), but not all: after ``kill -9`` of the driver its ``ray::DashboardAgent`` and
``ray::RuntimeEnvAgent`` live on for about a minute, holding the metrics export port and the agent
ports, and a new local Ray cannot start meanwhile.

The record is one small JSON file per driver, ``sessionray-serve-<pid>.json`` in Ray's temp
directory (:func:`ray_temp_root`), written before ``ray.init`` (the driver's pid and start time:
Ray names its session directory ``session_<date>_<driver pid>``) and again once Ray runs (the
session directory, the pids and start times of the driver's Ray processes, their listening ports).
A clean stop removes it (:func:`forget_local_ray`).

At start-up, :func:`clear_stale_ray` reads every record of this user whose driver is dead and
stops exactly that instance's leftovers: this user's processes that are a recorded pid with the
same start time, or a Ray process (a ``ray::…`` worker or agent, a binary or script of the Ray
package) whose command line or open files are under that instance's session directory, and their
children (a ``tail -f`` of its logs is not a Ray process and is left alone). Nothing else is
signalled — no other user's process, no other Ray instance, never ``ray stop``. It waits until
the recorded ports have no listener among the stopped processes, then removes the record.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from actors.raylife.port_holders import listeners

__all__ = [
    "Cleared",
    "LocalRayRun",
    "clear_stale_ray",
    "dead_records",
    "forget_local_ray",
    "leftovers",
    "process_runs",
    "ray_temp_root",
    "read_record",
    "record_local_ray",
    "run_file",
    "stop_instance",
    "write_record",
]

log = logging.getLogger("sessionray.stale_ray")

RUN_PREFIX = "sessionray-serve-"
"""Record files are ``<ray temp root>/sessionray-serve-<driver pid>.json``."""


def ray_temp_root() -> Path:
    """Ray's temp directory for a local instance, by Ray's own rule (``ray.init`` without
    ``_temp_dir``): ``$RAY_TMPDIR/ray``, else on Linux ``$TMPDIR/ray``, else ``/tmp/ray``."""
    base = os.environ.get("RAY_TMPDIR") or (
        os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None
    )
    return Path(base or "/tmp") / "ray"


def run_file(root: Path | None = None, pid: int | None = None) -> Path:
    """The record file of driver ``pid`` (default: this process) under ``root`` (default
    :func:`ray_temp_root`)."""
    return (root or ray_temp_root()) / f"{RUN_PREFIX}{os.getpid() if pid is None else pid}.json"


def _started(proc: psutil.Process) -> float:
    return round(proc.create_time(), 2)


def process_runs(pid: int, started: float) -> bool:
    """True while process ``pid`` with start time ``started`` (as recorded) runs — a reused pid
    is another process, and a zombie has exited."""
    try:
        proc = psutil.Process(pid)
        return _started(proc) == started and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@dataclass(frozen=True)
class LocalRayRun:
    """What one driver recorded about its local Ray (times: process start, Unix seconds)."""

    driver_pid: int
    driver_started: float
    uid: int
    temp_root: str
    session_dir: str | None = None
    processes: list[tuple[int, float, str]] = field(default_factory=list)
    """``(pid, start time, name)`` of each process the driver had started (all descendants)."""
    ports: list[int] = field(default_factory=list)
    """TCP ports those processes listened on."""
    head_pid: int | None = None
    """The ``ray start --head`` process (:mod:`actors.raylife.head`): Ray names the session directory
    after it."""
    gcs_address: str | None = None
    """What the driver passed to ``ray.init(address=…)``; the next serve joins it from there."""
    fingerprint: str | None = None
    """:func:`actors.raylife.head.instance_fingerprint` of the configuration and code it runs."""
    env: dict[str, str] = field(default_factory=dict)
    """Secrets the instance's workers share with the driver (the console API token, a generated
    admin token): a serve that joins the instance uses the same (the file is ``0600``)."""

    @classmethod
    def capture(cls, temp_root: Path, session_dir: str | None = None, **extra: Any) -> LocalRayRun:
        """This process as the driver; with ``session_dir``, the instance's processes (those
        :func:`leftovers` finds for it: the head started by ``ray start`` is not this process's
        child) and their listening ports too. ``extra``: the other fields."""
        me = psutil.Process()
        run = cls(me.pid, _started(me), os.getuid(), str(temp_root), session_dir, **extra)
        if not session_dir:
            return run
        procs: list[tuple[int, float, str]] = []
        ports: set[int] = set()
        for proc in leftovers(run):
            with contextlib.suppress(psutil.Error):
                procs.append((proc.pid, _started(proc), proc.name()))
                ports.update(
                    c.laddr.port
                    for c in proc.net_connections(kind="tcp")
                    if c.status == psutil.CONN_LISTEN and c.laddr
                )
        return replace(run, processes=procs, ports=sorted(ports))

    @classmethod
    def of_head(cls, head_pid: int, temp_root: Path | None = None) -> LocalRayRun:
        """This process as the driver of the head ``ray start`` process ``head_pid`` is starting."""
        me = psutil.Process()
        procs = []
        with contextlib.suppress(psutil.Error):
            procs.append((head_pid, _started(psutil.Process(head_pid)), "ray start"))
        root = str(temp_root or ray_temp_root())
        return cls(me.pid, _started(me), os.getuid(), root, processes=procs, head_pid=head_pid)

    def driver_alive(self) -> bool:
        """True while the recorded driver runs (same pid *and* start time; a zombie is dead)."""
        return process_runs(self.driver_pid, self.driver_started)

    def session_dirs(self) -> list[str]:
        """The recorded session directory; before Ray had started, the directories Ray names after
        the driver (``session_*_<pid>``) created since the driver started."""
        if self.session_dir:
            return [self.session_dir]
        found = []
        named_after = self.head_pid or self.driver_pid
        for path in Path(self.temp_root).glob(f"session_*_{named_after}"):
            with contextlib.suppress(OSError):
                if (
                    path.is_dir()
                    and not path.is_symlink()
                    and path.stat().st_mtime >= self.driver_started - 1
                ):
                    found.append(str(path))
        return found


def record_local_ray(session_dir: str | None = None, root: Path | None = None, **extra: Any) -> Path:
    """Write (atomically, mode ``0600``) this driver's record; call it before Ray starts (no
    ``session_dir``), once the head process is spawned (``head_pid``) and again once Ray runs.
    ``extra``: the other :class:`LocalRayRun` fields. Returns the file.

    Raises:
        OSError: it cannot be written.
    """
    root = root or ray_temp_root()
    root.mkdir(parents=True, exist_ok=True)
    return write_record(LocalRayRun.capture(root, session_dir, **extra), root)


def write_record(run: LocalRayRun, root: Path | None = None) -> Path:
    """Write ``run`` as this driver's record (atomically, mode ``0600``). Raises ``OSError``."""
    path = run_file(root)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(asdict(run)))
    tmp.replace(path)
    return path


def forget_local_ray(root: Path | None = None) -> None:
    """Remove this driver's record (its Ray was shut down)."""
    with contextlib.suppress(OSError):
        run_file(root).unlink()


@dataclass
class Cleared:
    """One dead driver's instance that :func:`clear_stale_ray` handled."""

    driver_pid: int
    session_dirs: list[str]
    stopped: list[str]
    """``pid (name)`` of each process stopped."""
    left: list[str]
    """Processes still running after SIGKILL (the record is kept)."""
    busy_ports: list[int]
    """Recorded ports that still had a listener when the wait ended."""
    seconds: float


def read_record(path: Path) -> LocalRayRun | None:
    try:
        if path.stat().st_uid != os.getuid():
            return None
        data = json.loads(path.read_text())
        run = LocalRayRun(**data)
    except (OSError, ValueError, TypeError):
        return None
    procs = [(int(p), float(s), str(n)) for p, s, n in run.processes]
    return replace(run, processes=procs) if run.uid == os.getuid() else None


def dead_records(root: Path | None = None) -> list[tuple[Path, LocalRayRun]]:
    """``(file, record)`` of every record of this user under ``root`` (default
    :func:`ray_temp_root`) whose driver is dead."""
    found = []
    for path in sorted((root or ray_temp_root()).glob(f"{RUN_PREFIX}*.json")):
        run = read_record(path)
        if run is not None and not run.driver_alive():
            found.append((path, run))
    return found


def _protected() -> set[int]:
    """This process and its ancestors: never signalled."""
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents())}


def _ray_package() -> str | None:
    """Where the ``ray`` package is installed (found without importing it)."""
    spec = importlib.util.find_spec("ray")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return os.path.realpath(locations[0]) + os.sep if locations else None


def _is_ray(cmdline: list[str], package: str | None) -> bool:
    """A Ray process: a worker or agent (``ray::…`` process title), a module of the Ray package run
    with ``-m`` (``ray.util.client.server``), or a binary or script of the Ray package
    (``gcs_server``, ``raylet``, ``dashboard.py``, ``log_monitor.py`` …)."""
    if not cmdline:
        return False
    if cmdline[0].startswith("ray::"):
        return True
    if len(cmdline) > 2 and cmdline[1] == "-m" and cmdline[2].startswith("ray."):  # the Ray client server
        return True
    return package is not None and any(os.path.realpath(a).startswith(package) for a in cmdline[:3] if a)


def _under(proc: psutil.Process, cmdline: list[str], dirs: list[str]) -> bool:
    """``proc`` names one of ``dirs`` in its command line or has a file open under one."""
    prefixes = tuple(d.rstrip("/") + "/" for d in dirs)
    if any(p in arg for arg in cmdline for p in prefixes):
        return True
    return any(f.path.startswith(prefixes) for f in proc.open_files())


def leftovers(run: LocalRayRun) -> list[psutil.Process]:
    """This user's processes that belong to ``run``'s Ray instance (see the module docstring)."""
    recorded = {(pid, started) for pid, started, _ in run.processes}
    dirs = run.session_dirs()
    keep_out = _protected()
    package = _ray_package()
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        if proc.pid in keep_out:
            continue
        try:
            if proc.uids().real != run.uid:
                continue
            if (proc.pid, _started(proc)) in recorded:
                found[proc.pid] = proc
                continue
            cmdline = proc.cmdline()
            if dirs and _is_ray(cmdline, package) and _under(proc, cmdline, dirs):
                found[proc.pid] = proc
        except psutil.Error:
            continue
    for proc in list(found.values()):
        with contextlib.suppress(psutil.Error):
            for child in proc.children(recursive=True):
                if child.pid not in keep_out:
                    found.setdefault(child.pid, child)
    return sorted(found.values(), key=lambda p: p.pid)


def _name(proc: psutil.Process) -> str:
    try:
        cmd = proc.cmdline()
        return f"{proc.pid} ({os.path.basename(cmd[0]) if cmd else proc.name()})"
    except psutil.Error:
        return str(proc.pid)


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running (a zombie has exited: its sockets and files are closed)."""
    alive = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
    return alive


def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    alive = _running(procs)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = _running(alive)
    return alive


def _stop(procs: list[psutil.Process], term_wait_s: float, kill_wait_s: float) -> list[psutil.Process]:
    """SIGTERM, then SIGKILL what is left after ``term_wait_s``; returns what still runs."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    alive = _wait_gone(procs, term_wait_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return _wait_gone(alive, kill_wait_s)


def _held(ports: list[int], pids: set[int | None]) -> list[int]:
    """Those of ``ports`` that one of ``pids`` still listens on."""
    table = listeners()
    return [p for p in ports if table.get(p, set()) & pids]


def clear_stale_ray(
    root: Path | None = None,
    *,
    keep: Path | None = None,
    term_wait_s: float = 0.5,
    kill_wait_s: float = 5.0,
    port_wait_s: float = 5.0,
) -> list[Cleared]:
    """Stop the leftovers of every local Ray whose recording driver (this user's) is dead, wait
    until their recorded ports have no listener (at most ``port_wait_s`` seconds), and remove each
    record whose processes are all gone. Records of live drivers are left alone.

    Args:
        root: Where the records are (default :func:`ray_temp_root`).
        keep: The record of the instance this start joins (:func:`actors.raylife.head.find_adoptable`).
        term_wait_s, kill_wait_s: Seconds to wait after SIGTERM, then after SIGKILL.

    Returns:
        One :class:`Cleared` per dead driver's record (an empty ``stopped``: nothing was left).
    """
    out: list[Cleared] = []
    for path, run in dead_records(root):
        if keep is not None and path == keep:
            continue
        started = time.monotonic()
        procs = leftovers(run)
        names = [_name(p) for p in procs]
        left = _stop(procs, term_wait_s, kill_wait_s) if procs else []
        # a socket is closed when the last process holding it exits: wait for any holder among
        # the stopped processes (a listener that is not theirs is the pre-flight's to name)
        ours: set[int | None] = {p.pid for p in procs}
        deadline = time.monotonic() + port_wait_s
        busy = _held(run.ports, ours) if procs else []
        while busy and time.monotonic() < deadline:
            time.sleep(0.05)
            busy = _held(busy, ours)
        if not left:
            with contextlib.suppress(OSError):
                path.unlink()
        out.append(
            Cleared(
                run.driver_pid,
                run.session_dirs(),
                names,
                [_name(p) for p in left],
                busy,
                round(time.monotonic() - started, 2),
            )
        )
    return out


def stop_instance(run: LocalRayRun, term_wait_s: float = 0.5) -> list[str]:
    """Stop the processes of ``run``'s instance (:func:`leftovers`): a clean stop of this driver's
    own head, or what a ``ray start`` that failed half-way started before it is tried again.
    Returns ``pid (name)`` of each process stopped."""
    procs = leftovers(run)
    _stop(procs, term_wait_s, 5.0)
    return [_name(p) for p in procs]

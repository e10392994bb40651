"""What the embedded defaults cost doing nothing (issue 30, item 3): ``measure_idle`` starts
``sessionray serve --dev-admin-token`` (what ``make run`` starts) in a fresh directory, times it to
``sessionray: ready``, lets it settle, then reads over ``idle_s`` seconds of idleness

* the PSS of every process of the instance (``Pss`` of ``/proc/<pid>/smaps_rollup``, MiB: shared
  pages split between the processes sharing them, so the sum is what the instance costs the
  machine) — the serve process and its children, and every process of its Ray instance (found by
  its session directory on the command line or among the open files, as ``tests/smoke_run.py``
  does; the keeper names it with ``--session-dir``);
* their CPU (``/proc/<pid>/stat`` user + system ticks at the start and the end of the window, in
  cores: CPU seconds / wall seconds; a process that started meanwhile counts from 0);

then sends SIGINT (Ctrl-C) and checks that no process of the instance is left.

Run alone: ``python -m tests.bench.idle [--runs N] [--idle-s S] [-- serve options]`` prints a
table per process of the last run and min/median over the runs. CPU figures on a machine shared
with other work are noisy: take several runs and read the minimum.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil

from actors.raylife.stale import ray_temp_root
from tests.bench.procs import cpu_ticks

__all__ = ["IdleRunFailed", "measure_idle", "measure_once", "pss_mib"]

ROOT = Path(__file__).resolve().parents[2]
SERVE = Path(sys.executable).parent / "sessionray"
READY_LINE = "sessionray: ready"
STOPPED_LINE = "sessionray: stopped"


class IdleRunFailed(RuntimeError):
    """The instance did not get ready, did not stop on SIGINT, or left processes behind."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pss_mib(pid: int) -> float:
    """Proportional set size of ``pid`` in MiB (``Pss`` of ``/proc/<pid>/smaps_rollup``); 0.0 when
    the process is gone or not readable."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    return sum(int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("Pss:")) / 1024


def _label(proc: psutil.Process) -> str:
    """A short name: Ray's process title (``ray::SessionHost``), a Ray binary, or the module run."""
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return "?"
    if not argv:
        return proc.name()
    head = argv[0]
    if head.startswith("ray::"):
        return head.split()[0]
    if "-m" in argv[:3]:
        return argv[argv.index("-m") + 1]
    for arg in argv[:4]:
        if arg.endswith(".py") or "/ray/" in arg:
            return Path(arg).name
    return " ".join(Path(a).name for a in argv[:3])[:40]


def instance_pids(serve_pid: int, session_dir: str) -> dict[int, str]:
    """Pid → label of every live process of the instance: ``serve_pid`` and its descendants, and
    every process naming ``session_dir`` on its command line or holding a file under it open."""
    found: dict[int, str] = {}
    try:
        serve = psutil.Process(serve_pid)
        for proc in [serve, *serve.children(recursive=True)]:
            found[proc.pid] = _label(proc)
    except psutil.Error:
        pass
    if not session_dir:
        return found
    for proc in psutil.process_iter():
        if proc.pid in found:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            line = " ".join(proc.cmdline())
            if session_dir in line or any(f.path.startswith(session_dir + "/") for f in proc.open_files()):
                found[proc.pid] = _label(proc)
        except psutil.Error:
            continue
    return found


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], deadline: float) -> bool:
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return True
        if proc.poll() is not None:
            return text in log.read_text(errors="replace")
        time.sleep(0.05)
    return False


def _session_dir(serve_pid: int, deadline: float) -> str:
    record = ray_temp_root() / f"sessionray-serve-{serve_pid}.json"
    while time.monotonic() < deadline:
        if record.is_file():
            session_dir = json.loads(record.read_text()).get("session_dir")
            if session_dir:
                return str(session_dir)
        time.sleep(0.1)
    raise IdleRunFailed(f"no record of the local Ray at {record}")


def _window(serve_pid: int, session_dir: str, idle_s: float) -> tuple[dict[int, str], dict[int, int], float]:
    """Over ``idle_s``: ``(processes, CPU ticks spent per pid, wall seconds)``."""
    pids = instance_pids(serve_pid, session_dir)
    before = cpu_ticks(list(pids))
    t0 = time.monotonic()
    time.sleep(idle_s)
    wall = time.monotonic() - t0
    pids.update(instance_pids(serve_pid, session_dir))
    after = cpu_ticks(list(pids))
    return pids, {p: after[p] - before.get(p, 0) for p in after}, wall


def _stop(proc: subprocess.Popen[bytes], log: Path, session_dir: str, timeout_s: float) -> list[str]:
    """SIGINT to the serve's process group; returns the processes of the instance still alive
    once serve stopped (waits up to ``timeout_s`` for them to go)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise IdleRunFailed("serve did not stop after SIGINT") from None
    if STOPPED_LINE not in log.read_text(errors="replace"):
        raise IdleRunFailed(f"serve exited {proc.returncode} without {STOPPED_LINE!r}")
    deadline = time.monotonic() + timeout_s
    left = instance_pids(proc.pid, session_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = instance_pids(proc.pid, session_dir)
    return [f"{pid} {label}" for pid, label in left.items()]


def measure_once(
    idle_s: float = 30.0,
    settle_s: float = 5.0,
    serve_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """One start → idle → stop of ``sessionray serve --dev-admin-token`` in a fresh temporary
    directory (embedded defaults, SQLite under its ``./data``); free HTTP and metrics ports.

    Args:
        idle_s: Length of the idle window, in seconds.
        settle_s: Wait after ``ready`` before the window opens (host warm-up), in seconds.
        serve_args: More ``sessionray serve`` options.
        env: Variables added to this process's environment for serve.
        timeout_s: Bound on reaching ``ready`` and on stopping, each, in seconds.

    Returns:
        ``{"ready_s", "idle_pss_mib", "idle_cores", "processes": [{"pid", "name", "pss_mib",
        "cores"}], "left": [...]}``.

    Raises:
        IdleRunFailed: not ready in time, no Ray record, no clean stop, or processes left.
    """
    argv = [str(SERVE), "serve", "--dev-admin-token", "--port", str(_free_port()),
            "--metrics-export-port", str(_free_port()), *serve_args]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="idle-bench-") as tmp:
        log = Path(tmp) / "serve.log"
        with log.open("wb") as out:
            t0 = time.monotonic()
            proc = subprocess.Popen(argv, cwd=tmp, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, **(env or {})})  # fmt: skip
        session_dir = ""
        try:
            if not _wait_for(log, READY_LINE, proc, t0 + timeout_s):
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                code = proc.poll()
                what = f"exited {code}" if code is not None else f"not ready in {timeout_s:.0f} s"
                raise IdleRunFailed(f"serve {what}:\n{tail}")
            ready_s = time.monotonic() - t0
            session_dir = _session_dir(proc.pid, time.monotonic() + 30)
            time.sleep(settle_s)
            pids, ticks, wall = _window(proc.pid, session_dir, idle_s)
            tick_s = 1 / os.sysconf("SC_CLK_TCK")
            rows: list[dict[str, Any]] = [
                {
                    "pid": p,
                    "name": name,
                    "pss_mib": round(pss_mib(p), 1),
                    "cores": round(ticks.get(p, 0) * tick_s / wall, 4),
                }
                for p, name in pids.items()
                if psutil.pid_exists(p)
            ]
        finally:
            left = _stop(proc, log, session_dir, timeout_s)
    if left:
        raise IdleRunFailed(f"processes of the instance left after SIGINT: {left}")
    return {
        "ready_s": round(ready_s, 2),
        "idle_pss_mib": round(sum(float(r["pss_mib"]) for r in rows), 1),
        "idle_cores": round(sum(float(r["cores"]) for r in rows), 4),
        "processes": sorted(rows, key=lambda r: -float(r["pss_mib"])),
        "left": left,
    }


def measure_idle(runs: int = 1, **kwargs: Any) -> dict[str, Any]:
    """:func:`measure_once` ``runs`` times (keyword arguments passed on). Returns the medians as
    ``idle_pss_mib`` / ``idle_cores`` / ``ready_s``, the minimums under ``"min"``, every run's
    figures under ``"runs"`` and the last run's ``"processes"`` (the ``cost`` bench section's keys).

    Raises:
        IdleRunFailed: a run failed (see :func:`measure_once`).
    """
    done = [measure_once(**kwargs) for _ in range(max(1, runs))]
    keys = ("idle_pss_mib", "idle_cores", "ready_s")
    out: dict[str, Any] = {k: round(statistics.median(float(r[k]) for r in done), 4) for k in keys}
    out["min"] = {k: min(float(r[k]) for r in done) for k in keys}
    out["runs"] = [{k: r[k] for k in (*keys, "processes")} | {"count": len(r["processes"])} for r in done]
    out["processes"] = done[-1]["processes"]
    out["process_count"] = len(done[-1]["processes"])
    return out


def _print(result: dict[str, Any]) -> None:
    print(f"{'pid':>8}  {'process':<32} {'PSS MiB':>8} {'cores':>7}")
    for row in result["processes"]:
        print(f"{row['pid']:>8}  {row['name'][:32]:<32} {row['pss_mib']:>8.1f} {row['cores']:>7.4f}")
    for i, run in enumerate(result["runs"], 1):
        print(f"run {i}: {run['count']} processes, PSS {run['idle_pss_mib']:.1f} MiB, "
              f"{run['idle_cores']:.4f} cores idle, ready {run['ready_s']:.2f} s")  # fmt: skip
    low = result["min"]
    print(f"median: PSS {result['idle_pss_mib']:.1f} MiB, {result['idle_cores']:.4f} cores, "
          f"ready {result['ready_s']:.2f} s | min: PSS {low['idle_pss_mib']:.1f} MiB, "
          f"{low['idle_cores']:.4f} cores, ready {low['ready_s']:.2f} s")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.bench.idle", description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="start/idle/stop cycles (default 3)")
    p.add_argument("--idle-s", type=float, default=30.0, help="idle window, seconds (default 30)")
    p.add_argument("--settle-s", type=float, default=5.0, help="wait after ready, seconds (default 5)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("serve_args", nargs="*", help="more `sessionray serve` options (after --)")
    args = p.parse_args(argv)
    try:
        result = measure_idle(
            args.runs, idle_s=args.idle_s, settle_s=args.settle_s, serve_args=args.serve_args
        )
    except IdleRunFailed as exc:
        print(f"idle: FAILED: {exc}", flush=True)
        return 1
    print(json.dumps(result, indent=2)) if args.json else _print(result)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())

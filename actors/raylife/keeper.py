"""The keeper of a local head that ``sessionray serve`` started (docs/decisions.md#ops-ray-outlives-driver):
a small process, in the head's own session, that stops the instance once no live serve has named
it for ``--keep-s`` seconds — a driver killed with ``kill -9`` and not started again does not leave
a Ray instance (and its session hosts) running for ever.

Every ``--poll-s`` seconds it reads the records (:mod:`actors.raylife.stale`) under ``--root``: a
record of a live driver naming ``--session-dir`` resets the clock. It exits when the instance's
raylet (``--raylet-pid`` with ``--raylet-started``) is gone — a clean stop, or a serve that stopped
it — and after stopping the instance itself (its processes, then every dead driver's record that
names it). Usage: ``python -m actors.raylife.keeper --root R --session-dir D --raylet-pid P
--raylet-started T --keep-s S``.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from actors.raylife.repo_root import REPO_ROOT
from actors.raylife.stale import RUN_PREFIX, LocalRayRun, process_runs, read_record, stop_instance

__all__ = ["main", "spawn_keeper"]


def _records(root: Path, session_dir: str) -> list[tuple[Path, LocalRayRun]]:
    found = []
    for path in root.glob(f"{RUN_PREFIX}*.json"):
        run = read_record(path)
        if run is not None and run.session_dir == session_dir:
            found.append((path, run))
    return found


def keep(root: Path, session_dir: str, raylet: tuple[int, float], keep_s: float, poll_s: float) -> str:
    """The keeper's loop (see the module docstring). Returns why it ended: ``"gone"`` or
    ``"stopped"``."""
    named_at = time.monotonic()
    while process_runs(*raylet):
        records = _records(root, session_dir)
        if any(run.driver_alive() for _, run in records):
            named_at = time.monotonic()
        elif time.monotonic() - named_at >= keep_s:
            stop_instance(replace(LocalRayRun.capture(root), session_dir=session_dir))  # this process's
            for path, run in _records(root, session_dir):
                if not run.driver_alive():
                    with contextlib.suppress(OSError):
                        path.unlink()
            return "stopped"
        time.sleep(poll_s)
    return "gone"


def spawn_keeper(root: Path, session_dir: str, raylet: tuple[int, float], keep_s: float) -> int:
    """Start the keeper in a session of its own (it outlives this process); returns its pid."""
    argv = [
        sys.executable, "-m", "actors.raylife.keeper", "--root", str(root), "--session-dir", session_dir,
        "--raylet-pid", str(raylet[0]), "--raylet-started", str(raylet[1]), "--keep-s", str(keep_s),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=REPO_ROOT,
    )
    return proc.pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m actors.raylife.keeper")
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--session-dir", required=True)
    parser.add_argument("--raylet-pid", required=True, type=int)
    parser.add_argument("--raylet-started", required=True, type=float)
    parser.add_argument("--keep-s", required=True, type=float)
    parser.add_argument("--poll-s", default=5.0, type=float)
    args = parser.parse_args(argv)
    keep(args.root, args.session_dir, (args.raylet_pid, args.raylet_started), args.keep_s, args.poll_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The processes of one chaos topology, found through ``/proc``.

Every process a scenario's ``sessionray serve`` starts — the driver, Ray's own processes (GCS,
raylet, agents) and every Ray worker — inherits the environment variable :data:`MARK_ENV` with
the scenario's unique value, so the harness finds its own processes (and never another Ray
instance on the machine) by reading ``/proc/<pid>/environ``. A Ray worker's process title
(``/proc/<pid>/cmdline`` after Ray's ``setproctitle``) names its actor class: ``ray::SessionHost``,
``ray::DeliveryActor``, ``ray::RouterActor``, ``ray::HostSupervisor`` (``ray::SessionHost.submit``
while it runs a method).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

__all__ = ["MARK_ENV", "alive", "kill_all", "marked", "titled"]

MARK_ENV = "SESSIONRAY_CHAOS_RUN"


def marked(mark: str) -> dict[int, str]:
    """pid → process title (``cmdline`` with NULs as spaces) of every live process whose
    environment holds ``SESSIONRAY_CHAOS_RUN=<mark>``."""
    needle = f"{MARK_ENV}={mark}".encode()
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            if needle not in env.split(b"\0"):
                continue
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != "Z":
            out[int(entry.name)] = title
    return out


def titled(mark: str, actor_class: str) -> list[int]:
    """Pids of ``mark``'s Ray workers running an actor of ``actor_class`` (e.g. ``"SessionHost"``),
    in pid order."""
    prefix = f"ray::{actor_class}"
    return sorted(
        pid for pid, title in marked(mark).items() if title == prefix or title.startswith(prefix + ".")
    )


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_all(mark: str, timeout_s: float = 10.0) -> int:
    """SIGKILL every process of ``mark`` (repeated until none is left or ``timeout_s`` passed: a
    raylet may start a worker meanwhile); returns how many were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while (pids := marked(mark)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.1)
    return len(killed)

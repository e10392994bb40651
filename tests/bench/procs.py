"""Processes of a running sessionray topology and what they cost (tests/bench/bench_hosts.py).

Roles are found through Ray's GCS actor table (``ray._private.state.actors()``: class name and
pid of every ALIVE actor of *this* Ray cluster — other clusters on the machine are not counted;
``make bench`` runs alone on its own cluster) and the local node's own processes (gcs_server,
raylet, monitor, log_monitor, dashboard). The driver (which hosts the ingress) and the load
process are added by the caller.
"""

from __future__ import annotations

import os
from pathlib import Path

from actors.placement.hosts.support import process_uss_mib

__all__ = ["ROLE_OF_CLASS", "Roles", "cpu_ms_per_msg", "cpu_ticks", "memory_mib", "ray_roles", "rss_mib"]

Roles = dict[str, list[int]]
"""role name → process ids."""

ROLE_OF_CLASS = {
    "SessionHost": "hosts",
    "RouterActor": "router",
    "DeliveryActor": "delivery",
    "HostSupervisor": "supervisor",
}
"""Actor class → role; any other actor class counts as ``other actors``."""


def ray_roles() -> Roles:
    """Pids of every ALIVE actor by role (:data:`ROLE_OF_CLASS`) plus ``ray system`` (the local
    node's own processes). Ray must be initialized in this process."""
    import ray

    roles: Roles = {}
    for actor in ray._private.state.actors().values():
        if actor.get("State") == "ALIVE" and actor.get("Pid"):
            role = ROLE_OF_CLASS.get(str(actor.get("ActorClassName")), "other actors")
            roles.setdefault(role, []).append(int(actor["Pid"]))
    node = ray._private.worker._global_node
    system = [p.process.pid for procs in node.all_processes.values() for p in procs if p.process]
    roles["ray system"] = system
    return roles


def rss_mib(pid: int | str = "self") -> float:
    """Resident set size of ``pid`` in MiB (``Rss`` of ``/proc/<pid>/smaps_rollup``); 0.0 when
    the process is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    return sum(int(line.split()[1]) for line in text.splitlines() if line.startswith("Rss:")) / 1024


def memory_mib(roles: Roles) -> dict[str, dict[str, float]]:
    """Per role ``{"processes", "rss_mib", "uss_mib"}`` (sums over its pids) and a ``total`` entry."""
    out: dict[str, dict[str, float]] = {}
    for role, pids in roles.items():
        out[role] = {
            "processes": len(pids),
            "rss_mib": round(sum(rss_mib(p) for p in pids), 1),
            "uss_mib": round(sum(process_uss_mib(p) for p in pids), 1),
        }
    out["total"] = {k: round(sum(v[k] for v in out.values()), 1) for k in ("processes", "rss_mib", "uss_mib")}
    return out


def cpu_ticks(pids: list[int]) -> dict[int, int]:
    """User + system CPU clock ticks of each live pid (``/proc/<pid>/stat`` utime + stime)."""
    out: dict[int, int] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = int(fields[11]) + int(fields[12])
    return out


def cpu_ms_per_msg(
    roles: Roles, before: dict[int, int], after: dict[int, int], messages: int
) -> dict[str, float]:
    """CPU milliseconds per message of each role between two :func:`cpu_ticks` readings (a pid
    missing in ``before`` started meanwhile and counts from 0), plus ``total``."""
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    out = {
        role: round(sum(after.get(p, 0) - before.get(p, 0) for p in pids) * tick_ms / max(messages, 1), 2)
        for role, pids in roles.items()
    }
    out["total"] = round(sum(out.values()), 2)
    return out

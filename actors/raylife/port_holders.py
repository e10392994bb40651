"""Which process listens on a TCP port: named in the pre-flight's "port in use" problems and
waited for by the stale-Ray clean-up (:mod:`actors.raylife.stale`; docs/decisions.md#ops-stale-ray).

Linux and macOS through psutil (already installed with Ray). A listener of another user is seen
without its pid when this user may not read that process's file descriptors; it is then named as
"a process of another user". Nothing here imports Ray.
"""

from __future__ import annotations

import os

import psutil

__all__ = ["describe_process", "listener_pids", "listeners", "port_holders_text"]


def listeners() -> dict[int, set[int | None]]:
    """Every TCP port with a socket in LISTEN state → the pids listening there (``None`` for a
    process this user cannot see). One pass over the system's socket table; an error reading it
    (no permission at all) is answered ``{}``."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return {}
    found: dict[int, set[int | None]] = {}
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr:
            found.setdefault(c.laddr.port, set()).add(c.pid)
    return found


def listener_pids(port: int) -> list[int | None]:
    """Pids of the processes listening on TCP ``port`` (any address), in pid order, ``None`` last
    for a listener this user cannot see; ``[]``: nobody listens."""
    return sorted(listeners().get(port, set()), key=lambda p: (p is None, p or 0))


def describe_process(pid: int) -> str:
    """``pid 1234: ray::DashboardAgent``: the pid and its command line (at most 120 characters),
    plus ``, user alice`` for another user's process; ``pid 1234: user alice`` when the command
    line is not readable; ``pid 1234: gone`` when it exited."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return f"pid {pid}: gone"
    except psutil.Error:
        return f"pid {pid}"
    try:
        cmd = " ".join(" ".join(proc.cmdline()).split()) or proc.name()  # Ray pads its titles
    except psutil.NoSuchProcess:
        return f"pid {pid}: gone"
    except psutil.Error:
        return f"pid {pid}: user {_username(proc)}"
    cmd = cmd if len(cmd) <= 120 else cmd[:119] + "…"
    mine = _uid(proc) in (None, os.getuid())
    return f"pid {pid}: {cmd}" + ("" if mine else f", user {_username(proc)}")


def port_holders_text(port: int) -> str | None:
    """Who listens on ``port``: ``pid 1234: ray::DashboardAgent``, several joined by ``; ``, a
    listener this user cannot see as ``a process of another user``; None when no listener is
    seen (the port may be in TIME_WAIT or reserved)."""
    pids = listener_pids(port)
    if not pids:
        return None
    return "; ".join(describe_process(p) if p is not None else "a process of another user" for p in pids)


def _uid(proc: psutil.Process) -> int | None:
    try:
        return int(proc.uids().real)
    except (psutil.Error, AttributeError):
        return None


def _username(proc: psutil.Process) -> str:
    try:
        return str(proc.username())
    except (psutil.Error, KeyError):
        return "?"

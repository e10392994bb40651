"""The local Ray of ``sessionray serve``: a head node started by ``ray start --head`` in a session of
its own, so that it outlives a driver killed with ``kill -9`` and the next serve joins it with its
session hosts, router shards and delivery actors still running (docs/decisions.md#ops-ray-outlives-driver).

* :func:`start_head` starts the head and returns its address; Ray's fixed 30 s start-up deadline
  missed on a busy machine stops what that start left and tries once more.
* :func:`instance_fingerprint` names what the actors of an instance were started from (the
  configuration, the code, the interpreter and Ray): a new serve joins a dead driver's instance
  only when the fingerprints match; any other is stopped (:mod:`actors.raylife.stale`).
* :func:`find_adoptable` picks that instance among the records of dead drivers;
  :func:`plan_local_ray` (what ``sessionray serve`` calls before its pre-flight) picks it, stops
  every other dead driver's instance and hands the shared secrets over.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.raylife.repo_root import REPO_ROOT
from actors.raylife.stale import (
    LocalRayRun,
    clear_stale_ray,
    dead_records,
    process_runs,
    ray_temp_root,
    stop_instance,
)

__all__ = [
    "RAY_START_TIMEOUT",
    "LocalRayPlan",
    "RayHeadError",
    "find_adoptable",
    "gcs_answers",
    "instance_fingerprint",
    "plan_local_ray",
    "start_head",
]

log = logging.getLogger("sessionray.serve")

RAY_START_TIMEOUT = "The current node timed out during startup"
"""Ray's error when a new local node did not register within its fixed 30 s."""
START_WAIT_S = 180.0
"""Longest wait for ``ray start --head`` to return (a cold start on a loaded 2-core machine)."""
SINGLE_NODE_OPTIONS = ("--no-monitor",)
"""``ray start`` options of the local head that drop what one machine does not use
(docs/decisions.md#ops-single-machine-profile): no autoscaler monitor (nothing to scale on one
node)."""
SINGLE_NODE_ENV = {
    "RAY_metrics_report_interval_ms": "5000",
    "RAY_num_workers_soft_limit": "0",
    "RAY_prestart_worker_first_driver": "0",
}
"""Ray system settings of the local head (environment of ``ray start``; one set in the environment
wins): actor metrics reported every 5 s; no idle worker kept or started ahead (every sessionray
process is a named actor with a process of its own, so a prestarted worker only idles: ≈ 43 MiB
each, one per CPU by default; docs/decisions.md#ops-single-machine-profile)."""
NO_API_SERVER = "127.0.0.1:9"
"""What the local head records as its dashboard address in place of the API server it does not
start: the discard port, nothing listens there. Ray's dashboard agent asks for that address once
a second, logging a traceback each time, until the record exists; a client of the dashboard's HTTP
API (`ray list`, job submission) is refused at once."""
HEAD_LAUNCHER = "\n".join(
    (
        "import ray.scripts.scripts as cli, ray._private.node as node, ray._private.ray_constants as rc",
        "cli.get_ray_client_dependency_error = lambda: ImportError('no Ray Client on one node')",
        "def no_api_server(self, **_):",
        "    self.get_gcs_client().internal_kv_put(",
        f"        rc.DASHBOARD_ADDRESS.encode(), b'{NO_API_SERVER}', True, rc.KV_NAMESPACE_DASHBOARD)",
        "node.Node.start_api_server = no_api_server",
        "cli.main()",
    )
)
"""``python -c`` code of ``ray start`` (docs/decisions.md#ops-single-machine-profile):

* Ray 2.60's CLI starts a Ray Client server (≈ 49 MiB) whenever its dependencies import and refuses
  port 0; sessionray joins by the GCS address and never uses it, so the CLI is told it is not
  installed;
* Ray 2.60 starts its dashboard's API server (≈ 77 MiB, ≈ 2.5 s of the start) even with
  ``--include-dashboard=false``: its HTTP API (state listing, job submission) serves nothing
  sessionray uses on one machine (the actors' metrics leave
  by the dashboard agent, which stays), so the head records :data:`NO_API_SERVER` instead."""
_SKIPPED_DIRS = frozenset({".git", ".venv", "venv", "build", "node_modules", "tests", "__pycache__"})


class RayHeadError(RuntimeError):
    """``ray start --head`` failed; the message is one line: what happened, the last line of its
    output (Ray's error) and the file holding all of it."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def last_error(output: str, limit: int = 300) -> str:
    """The last non-blank line of ``output`` (a Python error's ``Type: message`` line), cut to
    ``limit`` characters; ``"(no output)"`` when there is none."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    if not lines:
        return "(no output)"
    line = lines[-1]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def start_head(metrics_port: int, on_spawn: Callable[[int], None], log_path: Path | None = None) -> str:
    """Start a local head node: GCS on a free port, no dashboard UI nor API server
    (:data:`HEAD_LAUNCHER`), no Ray Client server, monitor or idle worker (:data:`SINGLE_NODE_OPTIONS`,
    :data:`SINGLE_NODE_ENV`), its metrics agent
    on ``metrics_port``, in a new session (a Ctrl-C of the terminal or the death of this process
    does not reach it). Ray's ``ray_current_cluster`` file is left as it was (another program's
    ``ray.init()`` does not find this head). ``on_spawn(pid)`` is called with the ``ray start``
    process's pid at once (Ray names the session directory after it: the record must know it
    before Ray runs).

    Returns:
        The GCS address (``127.0.0.1:<port>``) for ``ray.init(address=…)``.

    Raises:
        RayHeadError: ``ray start`` failed twice on the start-up deadline, failed otherwise, or
            did not return within :data:`START_WAIT_S`; what it started is stopped first.
    """
    log_path = log_path or ray_temp_root() / f"sessionray-head-{os.getpid()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ}
    for key, value in SINGLE_NODE_ENV.items():
        env.setdefault(key, value)  # the operator's own RAY_* setting wins
    # `ray start` names its head in <temp>/ray/ray_current_cluster, where a plain ray.init() of any
    # other program of this user would find it and join (or fail on it once it is stopped): the
    # file is put back as it was; sessionray joins its head by the address in its own record
    current = ray_temp_root() / "ray_current_cluster"
    before = current.read_bytes() if current.is_file() else None
    for attempt in (1, 2):
        port = _free_port()
        cmd = [
            sys.executable, "-c", HEAD_LAUNCHER, "start", "--head",
            f"--port={port}", "--include-dashboard=false", f"--metrics-export-port={metrics_port}",
            "--min-worker-port=0", "--max-worker-port=0", "--disable-usage-stats", *SINGLE_NODE_OPTIONS,
        ]  # fmt: skip
        with open(log_path, "wb") as out:  # a file, not a pipe: the daemons keep their stdout
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        on_spawn(proc.pid)
        try:
            code: int | None = proc.wait(timeout=START_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        finally:
            _put_back(current, before)
        if code == 0:
            return f"127.0.0.1:{port}"
        output = _tail(log_path)
        stop_instance(LocalRayRun.of_head(proc.pid))
        if attempt == 1 and RAY_START_TIMEOUT in output:
            print(
                "sessionray: Ray's local node missed Ray's 30 s start-up deadline (a busy machine?); "
                "stopped what it started, starting it once more",
                flush=True,
            )
            continue
        what = "did not return" if code is None else f"exited {code}"
        raise RayHeadError(f"`ray start --head` {what}: {last_error(output)} (its output: {log_path})")
    raise AssertionError("unreachable")


def _put_back(path: Path, content: bytes | None) -> None:
    """Restore ``path`` to ``content`` (None: no file)."""
    try:
        if content is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(content)
    except OSError as exc:
        log.warning("could not restore %s: %r", path, exc)


def _source_files() -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(REPO_ROOT):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS and not d.startswith("."))
        found += [Path(dirpath) / f for f in sorted(filenames) if f.endswith((".py", ".md"))]
    return found


def instance_fingerprint(config: Any) -> str:
    """A digest of what an instance's actors run: the configuration (every key), the ``.py`` and
    ``.md`` files of the repository (path, size, modification time), the interpreter and Ray's
    version. Code installed outside the repository is not covered (docs/operations.md)."""
    digest = hashlib.sha256()
    dumped = config.model_dump(mode="json") if hasattr(config, "model_dump") else config
    digest.update(json.dumps(dumped, sort_keys=True, default=str).encode())
    for path in _source_files():
        try:
            st = path.stat()
        except OSError:
            continue
        digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    digest.update(f"{sys.executable}:{importlib.metadata.version('ray')}".encode())
    return digest.hexdigest()[:32]


def gcs_answers(address: str, timeout_s: float = 1.0) -> bool:
    """The GCS at ``host:port`` accepts a TCP connection."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except (OSError, ValueError):
        return False
    return True


def _raylet_runs(run: LocalRayRun) -> bool:
    return any(name == "raylet" and process_runs(pid, started) for pid, started, name in run.processes)


def find_adoptable(fingerprint: str, root: Path | None = None) -> tuple[Path, LocalRayRun] | None:
    """The newest record of a dead driver (this user's) whose instance was started from
    ``fingerprint`` and still runs (its raylet alive, its GCS answering); None if there is none.

    Returns:
        ``(record file, record)``.
    """
    candidates = sorted(dead_records(root), key=lambda item: item[1].driver_started, reverse=True)
    for path, run in candidates:
        if run.fingerprint != fingerprint or not run.gcs_address or not run.session_dir:
            continue
        if _raylet_runs(run) and gcs_answers(run.gcs_address):
            return path, run
    return None


@dataclass
class LocalRayPlan:
    """What ``sessionray serve`` does about its local Ray (:func:`plan_local_ray`)."""

    fingerprint: str
    adopt: tuple[Path, LocalRayRun] | None
    """The dead driver's instance to join, or None: start a head."""
    admin_token: str | None = None
    """The admin token that instance's serve had generated (``--dev-admin-token``), restored."""


def plan_local_ray(
    config: Any, admin_token_env: str | None, environ: MutableMapping[str, str] | None = None
) -> LocalRayPlan:
    """Before the pre-flight: find a dead driver's instance to join (same fingerprint), stop every
    other dead driver's leftovers (docs/decisions.md#ops-stale-ray), and put the joined instance's
    shared secrets into ``environ`` (default ``os.environ``) where the operator set none. One
    ``sessionray: …`` line per instance found."""
    env = os.environ if environ is None else environ
    fingerprint = instance_fingerprint(config)
    adopt = find_adoptable(fingerprint)
    for found in clear_stale_ray(keep=adopt[0] if adopt else None):
        where = ", ".join(found.session_dirs) or "its session directory is gone"
        what = (
            f"stopped {len(found.stopped)} process(es): {', '.join(found.stopped)}"
            if found.stopped
            else "nothing of it still ran"
        )
        print(
            f"sessionray: the local Ray of a sessionray serve that died (pid {found.driver_pid}; {where}): "
            f"{what} in {found.seconds:.1f} s",
            flush=True,
        )
        if found.left or found.busy_ports:
            left = ", ".join(found.left) or "none"
            log.warning("still running after SIGKILL: %s; ports still held: %s", left, found.busy_ports)
    plan = LocalRayPlan(fingerprint, adopt)
    if adopt is None:
        return plan
    run = adopt[1]
    print(
        f"sessionray: joining the local Ray of a sessionray serve that ended (pid {run.driver_pid}; "
        f"{run.session_dir}): same configuration and code, its actors kept running",
        flush=True,
    )
    for key, value in run.env.items():
        if key not in env:
            env[key] = value
            if key == admin_token_env:
                plan.admin_token = value
    return plan

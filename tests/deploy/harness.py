"""Process harness for the deploy tests: real `ray start` nodes, `sessionray serve` and Debian's
`prometheus`, each run as a subprocess in its OWN process session.

Why sessions: `ray stop` kills every Ray process on the machine (it matches process names), which
would take down the test session's own Ray instance (the `ray_session` fixture) and anything else
running here. Instead each node is started with `ray start --block` as the leader of a new session
(`start_new_session=True`); every Ray daemon and worker of that node inherits the session id, so
teardown signals exactly the processes whose session id is the leader's pid — nothing else.

Token auth (Ray 2.60, docs/decisions.md#ops-ray-pitfalls): every process of a test cluster gets
`RAY_AUTH_MODE=token` and the same random `RAY_AUTH_TOKEN`, so a second node, `ray status` and the
sessionray driver can join, and nothing depends on ~/.ray/auth_token.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
_RAY_DAEMONS = {"ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent"}
SESSIONRAY = str(VENV_BIN / "sessionray")


_GIVEN: set[int] = set()
"""Ports :func:`free_port` returned in this process: never returned twice (the kernel may hand a
just-closed port out again, and Ray refuses a node whose components were given the same port)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (outside Ray's worker range 10002–19999), never one
    this process was given before."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not 10002 <= port <= 19999 and port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise RuntimeError("no free port outside 10002-19999")


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 0.25,
              diagnostics: Callable[[], str] = lambda: "") -> Any:
    """Poll ``check`` until it returns a truthy value (returned); fail with ``what`` after
    ``timeout_s`` seconds, appending ``diagnostics()`` (e.g. a log tail)."""
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # keep polling; report the last error on timeout
            last_exc = exc
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last error: {last_exc!r})\n"
                         f"{diagnostics()}")


def process_title(pid: int) -> str | None:
    """The first word of ``pid``'s command line (Ray sets it to ``ray::<ActorClass>...`` for an
    actor process); None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return None


def session_members(sid: int) -> list[int]:
    """Pids of live (non-zombie) processes whose session id is ``sid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(entry))
    return out


class Proc:
    """One subprocess started as the leader of a new process session, output to ``log``.
    ``stop_signal`` is what :meth:`stop` sends first (SIGINT for a local ``sessionray serve``:
    its SIGTERM leaves its Ray running for a restart, docs/decisions.md#ops-planned-restart)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path,
                 cwd: Path | None = None, stop_signal: signal.Signals = signal.SIGTERM) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.stop_signal = stop_signal
        self._log_file = log.open("wb")
        self.popen = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self._log_file,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        self.sid = self.popen.pid

    def alive(self) -> bool:
        """True while the leader process runs."""
        return self.popen.poll() is None

    def output(self, tail: int = 60) -> str:
        """The last ``tail`` lines of the process's output."""
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return f"--- {self.name} ({self.log}) ---\n" + "\n".join(lines[-tail:])

    def stop(self, grace_s: float = 5.0) -> None:
        """``stop_signal`` to every process of the session, SIGKILL what is left after ``grace_s``, reap."""
        for sig, wait_s in ((self.stop_signal, grace_s), (signal.SIGKILL, 5.0)):
            for pid in session_members(self.sid):
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait_s
            while session_members(self.sid) and time.monotonic() < deadline:
                if self.popen.poll() is not None:  # leader reaped; wait for the rest of the session
                    time.sleep(0.1)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(timeout=0.1)
            if not session_members(self.sid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)
        self._log_file.close()


class RayCluster:
    """A Ray cluster of `ray start --block` nodes on this machine, under ``root`` (short path:
    Ray's unix socket paths must stay under ~107 bytes).

    Args:
        root: Directory for the temp dir and logs (the head's ``--temp-dir``).
        metrics_interval_ms: ``RAY_metrics_report_interval_ms`` for every process.
    """

    def __init__(self, root: Path, metrics_interval_ms: int = 1000) -> None:
        self.root = root
        self.temp_dir = root / "ray"
        self.token = secrets.token_hex(16)
        self.gcs_port = free_port()
        self.dashboard_port = free_port()
        self.nodes: list[Proc] = []
        self.metrics_ports: list[int] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            RAY_metrics_report_interval_ms=str(metrics_interval_ms),
            RAY_USAGE_STATS_ENABLED="0",
            PYTHONPATH=str(ROOT),
        )

    @property
    def address(self) -> str:
        """The head's GCS address (what `ray start --address` and RAY_ADDRESS take).

        127.0.0.2, not 127.0.0.1: Ray replaces "127.0.0.1"/"localhost" in an address by the
        machine's outward IP (``resolve_ip_for_localhost``), so joining would depend on that
        interface; another loopback address is kept as given (the GCS listens on every
        address)."""
        return f"127.0.0.2:{self.gcs_port}"

    def client_env(self, **extra: str) -> dict[str, str]:
        """Environment for a driver/CLI joining this cluster (RAY_ADDRESS set, so
        ``address="auto"`` resolves to this cluster and not to another Ray on the machine)."""
        return {**self.env, "RAY_ADDRESS": self.address, **extra}

    def _start_node(self, name: str, args: list[str], resources: dict[str, float], num_cpus: int) -> Proc:
        """Start one node and wait for "Ray runtime started". Ray gives a raylet a hard-coded 30 s
        to register with the GCS; on an overloaded machine that can fail, so a node whose
        `ray start` exits with that timeout, or refuses a port given twice, is started again with
        new ports (at most 3 attempts)."""
        for attempt in range(1, 4):
            metrics_port = free_port()
            argv = [
                RAY, "start", "--block", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                f"--num-cpus={num_cpus}", f"--resources={json.dumps(resources)}",
                f"--metrics-export-port={metrics_port}", f"--node-manager-port={free_port()}",
                f"--object-manager-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
                f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}",
                "--object-store-memory=100000000", *args,
            ]
            node = Proc(name, argv, self.env, self.root / f"{name}-{attempt}.log")

            def started(node: Proc = node) -> bool | None:
                if "Ray runtime started" in node.log.read_text(errors="replace"):
                    return True
                return None if node.alive() else False

            state = wait_for(f"ray node {name} to start", lambda started=started: started() is not None,
                             timeout_s=180, diagnostics=node.output) and started()
            if state:
                self.nodes.append(node)
                self.metrics_ports.append(metrics_port)
                return node
            node.stop(grace_s=2)
            log_text = node.log.read_text(errors="replace")
            retry = "timed out during startup" in log_text or "is trying to use a port number" in log_text
            if not retry or attempt == 3:  # a port taken since it was drawn: draw new ones
                raise AssertionError(f"{name} exited with {node.popen.returncode}\n{node.output()}")
        raise AssertionError("unreachable")

    def start_head(self, resources: dict[str, float], num_cpus: int = 2, dashboard: bool = True) -> Proc:
        """`ray start --head`; with ``dashboard`` (Prometheus service discovery needs it)."""
        return self._start_node("head", [
            "--head", f"--port={self.gcs_port}", f"--temp-dir={self.temp_dir}",
            f"--include-dashboard={str(dashboard).lower()}",
            f"--dashboard-port={self.dashboard_port}", f"--ray-client-server-port={free_port()}",
        ], resources, num_cpus)

    def add_worker(self, name: str, resources: dict[str, float], num_cpus: int = 2) -> Proc:
        """`ray start --address=<head>` for one more node on this machine."""
        return self._start_node(name, [f"--address={self.address}"], resources, num_cpus)

    @property
    def service_discovery_file(self) -> Path:
        """Ray's Prometheus file_sd file (written by the dashboard on the head)."""
        return self.temp_dir / "prom_metrics_service_discovery.json"

    def ray_cli(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a `ray` CLI command against this cluster (token env set)."""
        return subprocess.run([RAY, *args], env=self.client_env(), capture_output=True, text=True,
                              timeout=timeout_s)

    def actor_processes(self) -> dict[str, list[tuple[int, str]]]:
        """Node name → ``(pid, process title)`` of every Ray actor process of that node (Ray sets
        the title to ``ray::<ActorClass>...``); nodes are told apart by their process session."""
        out: dict[str, list[tuple[int, str]]] = {}
        for node in self.nodes:
            rows = []
            for pid in session_members(node.sid):
                title = process_title(pid)
                if title is not None and title.startswith("ray::") and title not in _RAY_DAEMONS:
                    rows.append((pid, title))
            out[node.name] = sorted(rows)
        return out

    def logs(self) -> str:
        """Tails of every node's output, and whether the head's GCS still runs and which
        addresses its port answers on (for failure messages)."""
        return "\n".join([*(n.output() for n in self.nodes), self.gcs_state()])

    def gcs_state(self) -> str:
        """``gcs_server`` processes of the head's session, and a TCP connect to the GCS port on
        :attr:`address` and on the address Ray puts in place of 127.0.0.1 (the node's outward IP)."""
        lines = ["--- GCS ---"]
        if self.nodes:
            for pid in session_members(self.nodes[0].sid):
                if "gcs_server" in (process_title(pid) or ""):
                    lines.append(f"gcs_server pid {pid} alive")
        hosts = [self.address.rsplit(":", 1)[0]]
        with contextlib.suppress(Exception):
            from ray._private.services import get_node_ip_address

            hosts.append(get_node_ip_address())
        for host in hosts:
            try:
                with socket.create_connection((host, self.gcs_port), timeout=3):
                    lines.append(f"{host}:{self.gcs_port} accepts connections")
            except OSError as exc:
                lines.append(f"{host}:{self.gcs_port} does not: {exc!r}")
        return "\n".join(lines)

    def stop(self) -> None:
        """Stop every node (workers first), killing only this cluster's process sessions."""
        for node in reversed(self.nodes):
            node.stop()

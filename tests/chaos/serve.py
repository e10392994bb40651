"""One chaos topology: a real ``sessionray serve`` subprocess on its own data directory.

:class:`Topology` writes a configuration (one OneBot v11 bot with ``trigger: always`` per
platform API given — ``10001``, ``10002``, … —, each sending to its own; no model in ``ai:``, so
the built-in model answers with zero think time, and group mentions are not coalesced; SQLite
under ``<dir>/data``; ``runtime:`` knobs as given), picks an HTTP port and a Ray metrics export
port once (a restarted serve uses the same ones, so the load keeps its URL) and runs
``sessionray serve`` with:

* the working directory ``<dir>`` and ``RAY_TMPDIR=<dir>/ray`` — a serve restarted after a
  kill -9 of the driver meets the old instance's leftovers as an operator's would;
* :data:`tests.chaos.procs.MARK_ENV` set to the topology's own mark, inherited by every process
  Ray starts: the harness finds (:meth:`Topology.pids`) and finally kills (:meth:`Topology.close`)
  exactly its own processes. ``ray stop`` is never run (other Ray instances share the machine);
* no ``RAY_*``/``SESSIONRAY_*`` variables of the caller except an admin token of its own.

The serve's stdout and stderr go to ``<dir>/serve-<n>.log`` (one file per start).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import yaml

from tests.chaos.procs import MARK_ENV, kill_all, titled

__all__ = ["ROOT", "ServeExited", "Topology", "free_port"]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
BOT_ID = "10001"
READY = "sessionray: ready"
ADMIN_TOKEN = "chaos-admin-token"


class ServeExited(RuntimeError):
    """``sessionray serve`` exited before it printed ``ready`` (``code``: its exit code)."""

    def __init__(self, code: int | None, tail: str) -> None:
        super().__init__(f"sessionray serve exited with {code} before ready:\n{tail}")
        self.code = code


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (the OS's ephemeral range)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Topology:
    """The serve of one scenario (module docstring); nothing runs until :meth:`start`.
    :data:`Topology.running` holds every started, not yet closed topology of this process.

    Args:
        workdir: An empty directory with a short path (Ray's socket paths must stay < 108 bytes).
        api_bases: The platform API of each bot: bot ``10001 + i`` sends to ``api_bases[i]``.
        runtime: ``runtime:`` configuration keys (e.g. ``{"sessions_per_host": 1}``).
    """

    running: ClassVar[set[Topology]] = set()

    def __init__(self, workdir: Path, api_bases: list[str], runtime: dict[str, Any]) -> None:
        self.dir = workdir
        self.mark = uuid.uuid4().hex
        self.port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.starts = 0
        self.bot_ids = [str(int(BOT_ID) + i) for i in range(len(api_bases))]
        bots = [
            {"platform": "onebot11", "self_id": bot, "api_base": base, "trigger": "always"}
            for bot, base in zip(self.bot_ids, api_bases, strict=True)
        ]
        config = {
            "bots": bots,
            "database": {"url": "sqlite:///./data/sessionray.db"},
            "runtime": dict(runtime),
            # the ledger matches one reply to each message: no batches of group mentions
            # (docs/decisions.md#session-hot-chat-coalescing answers several with one reply)
            "ai": {"agent": {"coalesce": {"groups": False}}},
        }
        (workdir / "sessionray.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        (workdir / "data").mkdir(exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def webhooks(self) -> list[tuple[str, str]]:
        """(webhook URL, bot id) of every bot, in the order of ``api_bases``."""
        return [(f"{self.url}/webhooks/onebot11/{bot}", bot) for bot in self.bot_ids]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SESSIONRAY_"))}
        return env | {
            "PYTHONPATH": str(ROOT),
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "RAY_TMPDIR": str(self.dir / "ray"),
            "SESSIONRAY_ADMIN_TOKEN": ADMIN_TOKEN,
            MARK_ENV: self.mark,
        }

    # ------------------------------------------------------------------ starting

    def start(self, timeout_s: float = 300.0) -> float:
        """Start one ``sessionray serve`` and wait for its ``ready`` line; returns the seconds it took.

        Raises:
            ServeExited: it exited first (e.g. exit code 5: a port still held).
            TimeoutError: no ``ready`` within ``timeout_s`` (the process is killed).
        """
        self.starts += 1
        Topology.running.add(self)
        log = (self.dir / f"serve-{self.starts}.log").open("w")
        argv = [
            str(BIN / "sessionray"), "serve", "--config", "sessionray.yaml",
            "--port", str(self.port), "--metrics-export-port", str(self.metrics_port),
        ]  # fmt: skip
        t0 = time.monotonic()
        proc = subprocess.Popen(
            argv, cwd=self.dir, env=self._env(), stdout=subprocess.PIPE, stderr=log, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.proc = proc
        ready = threading.Event()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if line.startswith(READY):
                    ready.set()
            log.close()

        threading.Thread(target=pump, name="serve-stdout", daemon=True).start()
        deadline = t0 + timeout_s
        while not ready.wait(0.05):
            if proc.poll() is not None:
                raise ServeExited(proc.returncode, self.log_tail())
            if time.monotonic() > deadline:
                self.kill9()
                raise TimeoutError(f"sessionray serve not ready after {timeout_s:.0f} s:\n{self.log_tail()}")
        return time.monotonic() - t0

    def start_until_ready(self, timeout_s: float) -> tuple[float, int, list[int | None]]:
        """Start serve again and again (1 s apart, as a process supervisor restarts a service)
        until one prints ``ready``. Returns (seconds until ready, attempts, exit codes of the
        failed attempts).

        Raises:
            TimeoutError: none was ready within ``timeout_s`` (the last error text is included).
        """
        t0 = time.monotonic()
        codes: list[int | None] = []
        while True:
            left = timeout_s - (time.monotonic() - t0)
            if left <= 0:
                raise TimeoutError(f"no serve ready after {timeout_s:.0f} s; exit codes {codes}")
            try:
                self.start(timeout_s=left)
                return time.monotonic() - t0, len(codes) + 1, codes
            except ServeExited as exc:
                codes.append(exc.code)
                time.sleep(1.0)

    def log_tail(self, lines: int = 30) -> str:
        path = self.dir / f"serve-{self.starts}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------------ faults on the driver

    def driver_pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def kill9(self) -> None:
        """SIGKILL the driver only (Ray's processes are left as a crash leaves them)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self, timeout_s: float = 120.0) -> tuple[float, int | None]:
        """SIGTERM the driver and wait until it exits (SIGKILL after ``timeout_s``); returns
        (seconds until it exited, exit code)."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill9()
            code = None
        return time.monotonic() - t0, code

    # ------------------------------------------------------------------ looking and cleaning up

    def pids(self, actor_class: str) -> list[int]:
        """Pids of this topology's Ray workers running ``actor_class`` (e.g. ``"DeliveryActor"``)."""
        return titled(self.mark, actor_class)

    def deliveries(self, state: str) -> list[dict[str, Any]] | None:
        """The serve's replies in ``state`` (``GET /admin/deliveries?state=…``, first 500, newest
        first); None when the endpoint does not answer 200."""
        import httpx

        try:
            resp = httpx.get(
                f"{self.url}/admin/deliveries", params={"state": state, "limit": 500},
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10,
            )  # fmt: skip
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        return list(resp.json().get("deliveries") or [])

    def retry(self, reply_id: str) -> bool:
        """The operator's retry of one failed or uncertain reply
        (``POST /admin/deliveries/{reply_id}/retry``, the id percent-encoded); True when queued."""
        from urllib.parse import quote

        import httpx

        resp = httpx.post(
            f"{self.url}/admin/deliveries/{quote(reply_id, safe='')}/retry",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10,
        )  # fmt: skip
        return resp.status_code == 200

    def close(self, grace_s: float = 30.0) -> None:
        """Stop the serve (SIGTERM, up to ``grace_s``), then SIGKILL every process left with this
        topology's mark (a killed driver's Ray instance included)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=grace_s)
        kill_all(self.mark)
        Topology.running.discard(self)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)

"""``scripts/test-deps.sh`` (``make test-deps`` / ``make test-deps-stop``): apt-get's output goes to
a log file named in one progress line (shown only when it fails; run as root, as CI and
``make test`` on a fresh machine do), and ``--stop`` stops the
throw-away PostgreSQL it started (a second ``--stop`` finds none). apt-get is a stand-in first on
PATH that prints a lot; PostgreSQL is the real server, in a directory and on a port of its own."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test-deps.sh"
NOISE = "Unpacking noisy-package (1.0) ..."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def script(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture
def base_env() -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k != "SESSIONRAY_TEST_PG_URL"}
    with tempfile.TemporaryDirectory(prefix="srtd-", dir="/tmp") as d:
        os.chmod(d, 0o755)  # PostgreSQL runs as its own user under root
        yield env | {"TMPDIR": d, "SESSIONRAY_PG_DIR": f"{d}/pg", "SESSIONRAY_PG_PORT": str(free_port())}


def test_stop_stops_the_throw_away_postgres_it_started(base_env: dict[str, str]) -> None:
    started = script("--postgres-only", env=base_env)
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert url == f"postgresql+psycopg://postgres@127.0.0.1:{base_env['SESSIONRAY_PG_PORT']}/postgres"
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain, connect_timeout=10) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    stopped = script("--stop", env=base_env)
    assert stopped.returncode == 0, stopped.stderr
    pg_dir = base_env["SESSIONRAY_PG_DIR"]
    assert stopped.stderr == f"test-deps: stopped the throw-away PostgreSQL in {pg_dir}\n"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(plain, connect_timeout=3).close()
    again = script("--stop", env=base_env)
    assert again.returncode == 0 and "no throw-away PostgreSQL runs" in again.stderr


@pytest.mark.parametrize("apt_code", [0, 100])
def test_apt_output_goes_to_a_log_file(base_env: dict[str, str], tmp_path: Path, apt_code: int) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text(f"#!/bin/sh\nfor i in 1 2 3; do echo '{NOISE}'; done\nexit {apt_code}\n")
    (fake / "apt-get").chmod(0o755)
    env = base_env | {"PATH": f"{fake}:{base_env['PATH']}", "SESSIONRAY_DEPS_ROOT": "/nonexistent"}
    run = script("--postgres-only", env=env)
    log = Path(base_env["TMPDIR"]) / "sessionray-test-deps-apt.log"
    assert run.returncode == 1  # the stand-in installed nothing
    assert f"installing postgresql (apt-get; its output: {log})" in run.stderr
    assert log.read_text().count(NOISE) == (6 if apt_code == 0 else 3)  # update and install, or update
    if apt_code == 0:
        assert NOISE not in run.stderr and "still missing after apt-get install: postgresql" in run.stderr
    else:  # a failure shows the end of the log
        assert f"apt-get install postgresql failed (rc={apt_code}); the end of {log}:" in run.stderr
        assert run.stderr.count(NOISE) == 3

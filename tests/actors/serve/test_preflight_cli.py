"""``sessionray serve`` / ``sessionray check`` as an operator runs them (the installed console
script in a subprocess) against bad configurations and occupied ports (issue 19, item 2): one
readable message, no traceback, the documented exit code — and Ray was never started.

"Ray was not started" is observed on the file system: every run gets its own ``RAY_TMPDIR``,
and a Ray start always creates ``$RAY_TMPDIR/ray/session_*``; the directory must not exist."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

SCRIPT = Path(sys.executable).parent / "sessionray"
ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def listening() -> Iterator[int]:
    """A port another program listens on (127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@dataclass
class Run:
    code: int
    out: str
    err: str
    ray_started: bool


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short directory (Ray's socket paths must stay short) used as cwd and RAY_TMPDIR root."""
    with tempfile.TemporaryDirectory(prefix="srpf-", dir="/tmp") as d:
        yield Path(d)


def sessionray(workdir: Path, *args: str, env: dict[str, str] | None = None) -> Run:
    """Run ``sessionray ARGS`` in ``workdir`` with its own RAY_TMPDIR; no secrets inherited."""
    ray_tmp = workdir / "raytmp"
    ray_tmp.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SESSIONRAY_", "PF_"))}
    full = {**base, "PYTHONPATH": str(ROOT), "RAY_TMPDIR": str(ray_tmp), **(env or {})}
    proc = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, cwd=workdir, env=full, timeout=600
    )
    return Run(proc.returncode, proc.stdout, proc.stderr, (ray_tmp / "ray").exists())


def write_config(workdir: Path, data: dict[str, object]) -> Path:
    data = {
        "server": {"host": "127.0.0.1", "port": free_port()},
        "database": {"url": f"sqlite:///{workdir}/data/s.db"},
        **data,
    }
    path = workdir / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


ONEBOT = {
    "platform": "onebot11",
    "self_id": "10001",
    "api_base": "http://127.0.0.1:9",
    "access_token_env": "PF_ONEBOT_ACCESS_TOKEN",
    "secret_env": "PF_ONEBOT_SECRET",
}


def assert_refused_before_ray(run: Run, code: int) -> None:
    assert run.code == code, (run.code, run.out, run.err)
    assert "Traceback" not in run.err and "Traceback" not in run.out, run.err
    assert not run.ray_started, "Ray was started"
    assert "ready" not in run.out


def test_every_missing_variable_is_named_with_its_key_at_once(workdir: Path) -> None:
    cfg = write_config(
        workdir,
        {
            "bots": [ONEBOT],
            "ai": {"providers": {"oa": {"api": "openai-completions", "api_key_env": "PF_OPENAI_KEY"}}},
        },
    )
    run = sessionray(
        workdir,
        "serve",
        "--config",
        str(cfg),
        "--metrics-export-port",
        str(free_port()),
        env={"PF_ONEBOT_ACCESS_TOKEN": "set"},
    )
    assert_refused_before_ray(run, 3)
    assert run.err == (
        "sessionray serve: 2 problems found before starting Ray (Ray was not started):\n"
        "  environment:\n"
        "    - environment variable PF_ONEBOT_SECRET is not set (needed by bots[0].secret_env)\n"
        "    - environment variable PF_OPENAI_KEY is not set (needed by ai.providers.oa.api_key_env)\n"
        "sessionray serve: exit code 3 (environment)\n"
    )
    assert not (workdir / "data").exists()  # the database was not touched either


def test_missing_media_dir(workdir: Path) -> None:
    cfg = write_config(workdir, {"bots": [{"platform": "console", "media_dir": "media"}]})
    run = sessionray(workdir, "serve", "--config", str(cfg), "--metrics-export-port", str(free_port()))
    assert_refused_before_ray(run, 3)
    assert f"    - bots[0].media_dir: {workdir / 'media'} does not exist\n" in run.err


def test_unreachable_database(workdir: Path) -> None:
    with socket.socket() as closed:  # bound, not listening: PostgreSQL connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        cfg = write_config(workdir, {"database": {"url": f"postgresql://sr:pw@127.0.0.1:{port}/sr"}})
        run = sessionray(workdir, "serve", "--config", str(cfg), "--metrics-export-port", str(free_port()))
    assert_refused_before_ray(run, 4)
    assert f"database.url postgresql+psycopg://sr:***@127.0.0.1:{port}/sr: cannot connect: " in run.err
    assert run.err.endswith("sessionray serve: exit code 4 (database)\n")


def test_sqlite_directory_that_cannot_exist(workdir: Path) -> None:
    (workdir / "data").write_text("a file, not a directory")
    cfg = write_config(workdir, {"database": {"url": "sqlite:///data/s.db"}})
    run = sessionray(workdir, "serve", "--config", str(cfg), "--metrics-export-port", str(free_port()))
    assert_refused_before_ray(run, 4)
    assert "database.url sqlite:///data/s.db: data is not a directory" in run.err


def test_http_port_in_use(workdir: Path, listening: int) -> None:
    cfg = write_config(workdir, {})
    run = sessionray(
        workdir,
        "serve",
        "--config",
        str(cfg),
        "--port",
        str(listening),
        "--metrics-export-port",
        str(free_port()),
    )
    assert_refused_before_ray(run, 5)
    cmd = " ".join(
        " ".join(psutil.Process().cmdline()).split()
    )  # this test process holds the port: it is named
    holder = f"pid {os.getpid()}: {cmd if len(cmd) <= 120 else cmd[:119] + '…'}"
    assert (
        f"    - port {listening} on 127.0.0.1 (the HTTP ingress; server.port or --port): "
        f"Address already in use — stop what listens there ({holder}) or choose another port\n"
    ) in run.err


def test_ray_metrics_port_in_use(workdir: Path, listening: int) -> None:
    cfg = write_config(workdir, {})
    run = sessionray(workdir, "serve", "--config", str(cfg), "--metrics-export-port", str(listening))
    assert_refused_before_ray(run, 5)
    assert (
        f"    - port {listening} on 0.0.0.0 (Ray's metrics agent, on every interface; "
        "--metrics-export-port): Address already in use"
    ) in run.err
    assert run.err.endswith("sessionray serve: exit code 5 (port in use)\n")


def test_invalid_configuration_is_exit_2_without_traceback(workdir: Path) -> None:
    cfg = write_config(workdir, {"bots": [{"platform": "onebot11"}]})
    run = sessionray(workdir, "serve", "--config", str(cfg))
    assert_refused_before_ray(run, 2)
    assert (
        run.err
        == f"sessionray serve: {cfg}: bots.0: a onebot11 bot needs `self_id` (QQ number / Telegram bot id)\n"
    )


def test_check_reports_the_same_problems_and_starts_nothing(workdir: Path, listening: int) -> None:
    cfg = write_config(workdir, {"bots": [ONEBOT]})
    run = sessionray(
        workdir,
        "check",
        "--config",
        str(cfg),
        "--port",
        str(listening),
        "--metrics-export-port",
        str(free_port()),
    )
    assert_refused_before_ray(run, 3)
    assert run.err.splitlines()[0] == "sessionray check: 3 problems found:"
    for needed in (
        "PF_ONEBOT_ACCESS_TOKEN is not set (needed by bots[0].access_token_env)",
        "PF_ONEBOT_SECRET is not set (needed by bots[0].secret_env)",
        f"port {listening} on 127.0.0.1",
    ):
        assert needed in run.err


def test_check_ok(workdir: Path, pg_url: str) -> None:
    cfg = write_config(workdir, {"bots": [ONEBOT], "database": {"url": pg_url}})
    run = sessionray(
        workdir,
        "check",
        "--config",
        str(cfg),
        "--metrics-export-port",
        str(free_port()),
        env={"PF_ONEBOT_ACCESS_TOKEN": "a", "PF_ONEBOT_SECRET": "b"},
    )
    assert run.code == 0, run.err
    assert run.out.startswith(
        f"sessionray check: OK — configuration {cfg}; 2 environment variable(s) set; "
        "database postgresql+psycopg://"
    )
    assert not run.ray_started


def test_check_joining_a_cluster_does_not_check_ray_ports(workdir: Path, listening: int) -> None:
    cfg = write_config(workdir, {})
    run = sessionray(
        workdir, "check", "--config", str(cfg), "--address", "auto", "--metrics-export-port", str(listening)
    )
    assert run.code == 0, run.err


def test_a_ray_token_path_with_no_token_is_one_line_exit_3_before_ray(workdir: Path) -> None:
    cfg = write_config(workdir, {})
    (workdir / "home").mkdir()
    env = {"HOME": str(workdir / "home"), "RAY_AUTH_TOKEN_PATH": str(workdir / "no-token")}
    args = ("serve", "--config", str(cfg), "--metrics-export-port", str(free_port()))
    run = sessionray(workdir, *args, env=env)
    assert_refused_before_ray(run, 3)
    assert run.err == (
        f"sessionray serve: RAY_AUTH_TOKEN_PATH={workdir / 'no-token'}: the file is missing or empty (Ray "
        "reads its token there) (exit code 3, environment)\n"
    )
    assert list((workdir / "home").iterdir()) == []  # no token was made elsewhere


def test_a_failed_ray_start_is_one_line_with_exit_code_6(workdir: Path) -> None:
    # A RAY_TMPDIR so deep that Ray's unix socket paths pass 107 bytes: `ray start --head` fails
    deep = workdir / ("d" * 100)
    deep.mkdir()
    (workdir / "home").mkdir()
    cfg = write_config(workdir, {})
    env = {"HOME": str(workdir / "home"), "RAY_TMPDIR": str(deep)}
    args = ("serve", "--config", str(cfg), "--metrics-export-port", str(free_port()))
    run = sessionray(workdir, *args, env=env)
    assert run.code == 6, (run.code, run.out, run.err)
    assert "Traceback" not in run.out + run.err
    [line] = run.err.splitlines()
    assert line.startswith(
        "sessionray serve: the local Ray did not start: `ray start --head` exited 1: OSError: "
        "validate_socket_filename failed: AF_UNIX path length cannot exceed 107 bytes"
    ), line
    assert line.endswith(".log) (exit code 6)"), line
    assert "ready" not in run.out and "sessionray: stopped" in run.out
    left = []  # nothing of that start keeps running
    for proc in psutil.process_iter():
        try:
            if str(deep) in " ".join(proc.cmdline()):
                left.append(proc.pid)
        except psutil.Error:
            continue
    assert left == []

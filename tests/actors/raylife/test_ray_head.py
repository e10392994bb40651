"""Joining a crashed driver's local Ray (actors/raylife/head.py) and its keeper (actors/raylife/keeper.py),
docs/decisions.md#ops-ray-outlives-driver, on real processes that stand in for an instance's
(a listening socket for its GCS, a process holding a file in its session directory), without Ray:
only a dead driver's instance with the same fingerprint, a running raylet and an answering GCS is
joined; the keeper stops an instance no live driver has named for its keep time, and leaves one
alone while a live driver names it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from actors.raylife.head import find_adoptable, instance_fingerprint, plan_local_ray
from actors.raylife.keeper import keep
from actors.raylife.stale import LocalRayRun, write_record
from runtime.config import Config
from tests.actors.raylife.test_stale_ray import alive, dead_driver, holding, procs, spawn, started, wait_until

__all__ = ["procs"]  # the fixture, shared with the stale-Ray tests


@pytest.fixture
def gcs() -> Iterator[str]:
    """A listening socket that stands in for a GCS; yields its address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def record(
    root: Path, raylet: int, gcs: str, fingerprint: str, driver: tuple[int, float] | None = None
) -> Path:
    """The record of a dead (or ``driver``) driver whose instance is ``raylet`` and ``gcs``."""
    pid, when = driver or dead_driver()
    session = str(root / f"session_2026-01-01_00-00-00_000001_{raylet}")
    run = LocalRayRun(
        pid, when, os.getuid(), str(root), session, [(raylet, started(raylet), "raylet")], [],
        gcs_address=gcs, fingerprint=fingerprint, env={"SESSIONRAY_CONSOLE_API_TOKEN": "shared"},
    )  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"sessionray-serve-{pid}.json"
    write_record(run, root).replace(path)  # written under this process's name, then renamed
    return path


def test_only_a_running_instance_with_the_same_fingerprint_is_joined(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], gcs: str
) -> None:
    root = tmp_path / "ray"
    raylet = spawn(procs, "-c", "import time; time.sleep(120)")
    assert find_adoptable("abc", root) is None  # no record
    path = record(root, raylet.pid, gcs, "abc")

    assert find_adoptable("other", root) is None  # started from another configuration or code
    found = find_adoptable("abc", root)
    assert found is not None and found[0] == path and found[1].gcs_address == gcs

    raylet.kill()
    raylet.wait()
    assert find_adoptable("abc", root) is None  # its raylet is gone


def test_an_instance_whose_gcs_does_not_answer_is_not_joined(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    root = tmp_path / "ray"
    raylet = spawn(procs, "-c", "import time; time.sleep(120)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: refused
        record(root, raylet.pid, closed, "abc")
        assert find_adoptable("abc", root) is None


def test_a_live_drivers_instance_is_not_joined(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], gcs: str
) -> None:
    root = tmp_path / "ray"
    raylet = spawn(procs, "-c", "import time; time.sleep(120)")
    me = psutil.Process()
    record(root, raylet.pid, gcs, "abc", driver=(me.pid, started(me.pid)))
    assert find_adoptable("abc", root) is None


def test_the_plan_joins_one_stops_the_others_and_restores_the_shared_token(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], gcs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ray"
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # ray_temp_root() is tmp_path / "ray"
    config = Config()
    raylet = spawn(procs, "-c", "import time; time.sleep(120)")
    joined = record(root, raylet.pid, gcs, instance_fingerprint(config))
    other_raylet = spawn(procs, "-c", "import time; time.sleep(120)")
    other = record(root, other_raylet.pid, gcs, "from an older configuration")
    env: dict[str, str] = {}

    plan = plan_local_ray(config, "SESSIONRAY_ADMIN_TOKEN", env)

    assert plan.adopt is not None and plan.adopt[0] == joined
    assert env == {"SESSIONRAY_CONSOLE_API_TOKEN": "shared"}
    assert joined.exists() and not other.exists()
    wait_until("the other instance stopped", lambda: not alive(other_raylet))
    assert alive(raylet)


def test_the_fingerprint_follows_the_configuration() -> None:
    base = Config()
    assert instance_fingerprint(base) == instance_fingerprint(Config())
    changed = base.model_copy(update={"runtime": base.runtime.model_copy(update={"min_hosts": 3})})
    assert instance_fingerprint(changed) != instance_fingerprint(base)


def test_the_keeper_stops_an_instance_no_live_driver_names(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], gcs: str
) -> None:
    root = tmp_path / "ray"
    raylet = spawn(procs, "-c", "import time; time.sleep(120)")
    path = record(root, raylet.pid, gcs, "abc")
    session = root / f"session_2026-01-01_00-00-00_000001_{raylet.pid}"
    worker = holding(procs, session / "logs" / "worker.out", title="ray::SessionHost")
    me = psutil.Process()
    mine = write_record(
        LocalRayRun(me.pid, started(me.pid), os.getuid(), str(root), str(session)), root
    )  # a live driver names it
    result: list[str] = []
    thread = threading.Thread(
        target=lambda: result.append(keep(root, str(session), (raylet.pid, started(raylet.pid)), 0.3, 0.02))
    )
    thread.start()
    thread.join(timeout=1.0)
    assert thread.is_alive() and alive(worker)  # named by this (live) driver: kept

    mine.unlink()  # the driver is gone (as after kill -9 and no new start)
    thread.join(timeout=20)

    assert result == ["stopped"]
    wait_until("the instance stopped", lambda: not alive(worker))
    assert not path.exists()  # the dead driver's record went with it


def test_the_keeper_ends_when_its_instance_was_stopped(tmp_path: Path) -> None:
    raylet = subprocess.Popen([sys.executable, "-c", "pass"])
    when = started(raylet.pid)
    raylet.wait()
    assert keep(tmp_path, str(tmp_path / "session_x"), (raylet.pid, when), 0.0, 0.01) == "gone"

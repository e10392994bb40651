"""The work-around for Ray's concurrency-group loop start-up race (actors/raylife/compat.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from actors.raylife.compat import guarded_loop_factory, install_group_loop_fix


def _start_groups_like_ray(factory: Any, groups: int) -> tuple[list[Any], list[BaseException]]:
    """Ray 2.60's loop: ``async_eventloop = factory(); Thread(target=lambda:
    async_eventloop.run_forever()).start()`` for each group; each thread starts late (the busy
    machine that makes the race happen). Returns the loops and the threads' exceptions."""
    errors: list[BaseException] = []

    def late_run(read_loop: Any) -> None:
        time.sleep(0.05)  # the thread is scheduled late: the race window, not a timing assertion
        try:
            read_loop().run_forever()
        except BaseException as exc:  # recorded for the assertion
            errors.append(exc)

    loops = []
    for _ in range(groups):
        async_eventloop = factory()
        loops.append(async_eventloop)
        threading.Thread(target=late_run, args=(lambda: async_eventloop,), daemon=True).start()  # noqa: B023 - Ray's late binding, on purpose
    return loops, errors


def _stop(loops: list[Any]) -> None:
    for loop in loops:
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)


def _wait_until(predicate: Any, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_unguarded_factory_loses_a_group_loop() -> None:
    """The race itself, reproduced: without the guard, late threads all run the last loop."""
    loops, errors = _start_groups_like_ray(asyncio.new_event_loop, 3)
    try:
        assert _wait_until(lambda: len(errors) == 2)
        assert all("already running" in str(e) for e in errors)
        assert [loop.is_running() for loop in loops] == [False, False, True]
    finally:
        _stop(loops)


def test_guarded_factory_runs_every_group_loop() -> None:
    loops, errors = _start_groups_like_ray(guarded_loop_factory(asyncio.new_event_loop), 3)
    try:
        assert _wait_until(lambda: all(loop.is_running() for loop in loops))
        assert errors == []
        assert len({id(loop) for loop in loops}) == 3
    finally:
        _stop(loops)


def test_guard_does_not_wait_for_an_old_loop_that_never_runs() -> None:
    """A loop that nobody runs delays the next one by at most the window, never the full wait."""
    factory = guarded_loop_factory(asyncio.new_event_loop)
    idle = factory()
    time.sleep(1.05)  # older than WINDOW_S (1 s)
    t0 = time.monotonic()
    second = factory()
    assert time.monotonic() - t0 < 0.5
    idle.close()
    second.close()


class _NoDelivery:
    def pick(self, session_key: str) -> Any:  # pragma: no cover - no turn runs here
        raise AssertionError("no delivery expected")


def _hook_installed(actor_self: Any) -> bool:
    import ray._raylet as raylet

    return bool(getattr(raylet.get_new_event_loop, "__sessionray_group_loop_fix__", False))


@pytest.mark.usefixtures("ray_session")
async def test_a_session_host_worker_runs_with_the_fix(tmp_path: Path) -> None:
    """Ray imports actors.placement.hosts.host in the worker before it builds the group loops, so the guard
    is in place there; a fresh host answers in both groups (what the supervisor checks before it counts
    a host as ready), from the same process."""
    from actors.placement.hosts.host import SessionHost
    from runtime.config import Config, DatabaseConfig
    from tests.actors.session_scripts import ScriptedSetup

    assert install_group_loop_fix() is True
    config = Config(database=DatabaseConfig(url=f"sqlite:///{tmp_path / 'compat.db'}"))
    host = SessionHost.remote(config, ScriptedSetup(str(tmp_path / "m")), _NoDelivery(), 4)  # type: ignore[attr-defined]
    try:
        pid = await host.ping.remote()
        assert await host.ping_turn.remote() == pid > 0
        assert await host.__ray_call__.remote(_hook_installed) is True
    finally:
        ray.kill(host, no_restart=True)

"""The single-machine profile (issue 30, item 3; docs/decisions.md#ops-single-machine-profile):
``sessionray serve``/``check`` on a local Ray start one session host and one delivery actor unless
the configuration says otherwise; with ``--address`` (a cluster) the section is taken as written."""

from __future__ import annotations

import argparse
from pathlib import Path

from actors.serve.preflight import add_start_options, load_start
from runtime.config.sections import SINGLE_MACHINE_RUNTIME, RuntimeConfig


def _start(tmp_path: Path, yaml_text: str | None, *options: str) -> tuple[int, int]:
    p = argparse.ArgumentParser()
    add_start_options(p)
    argv = list(options)
    if yaml_text is not None:
        path = tmp_path / "sessionray.yaml"
        path.write_text(yaml_text)
        argv += ["--config", str(path)]
    start = load_start(p.parse_args(argv), "test")
    assert start is not None
    return start.config.runtime.min_hosts, start.config.runtime.delivery_actors


def test_the_profile_fills_only_the_keys_left_unset() -> None:
    assert RuntimeConfig().single_machine().min_hosts == SINGLE_MACHINE_RUNTIME["min_hosts"] == 1
    assert RuntimeConfig().single_machine().delivery_actors == SINGLE_MACHINE_RUNTIME["delivery_actors"] == 1
    given = RuntimeConfig(min_hosts=3).single_machine()
    assert (given.min_hosts, given.delivery_actors) == (3, 1)
    assert (
        RuntimeConfig().single_machine().deliver_in_host is SINGLE_MACHINE_RUNTIME["deliver_in_host"] is True
    )
    assert RuntimeConfig().deliver_in_host is False  # a cluster: every reply through the delivery actors
    assert RuntimeConfig(deliver_in_host=False).single_machine().deliver_in_host is False
    pg = "postgresql+psycopg://u@db/sessionray"  # measured slower there: the pool sends
    assert RuntimeConfig().single_machine(pg).deliver_in_host is False
    assert RuntimeConfig(deliver_in_host=True).single_machine(pg).deliver_in_host is True  # as written
    both = RuntimeConfig(min_hosts=3, delivery_actors=4, deliver_in_host=False)
    assert both.single_machine() is both  # nothing to fill: the section as written


def test_local_ray_takes_the_profile_and_a_cluster_the_written_defaults(tmp_path: Path) -> None:
    assert _start(tmp_path, None) == (1, 1)  # embedded defaults, local Ray
    assert _start(tmp_path, None, "--address", "127.0.0.1:6379") == (2, 2)  # cluster profile
    assert _start(tmp_path, "runtime:\n  delivery_actors: 3\n") == (1, 3)
    assert _start(tmp_path, "runtime:\n  min_hosts: 2\n", "--address", "auto") == (2, 2)

"""The PostgreSQL connection budget (docs/decisions.md#memory-connection-budget): the worst-case
arithmetic (pure), the warning text, and the start-up check against the real test server's
``SHOW max_connections``."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest

from runtime.config.sections import RuntimeConfig
from runtime.memory.connection_budget import (
    ConnectionBudget,
    budget_warning,
    connection_budget,
    warn_if_over_connection_budget,
)
from runtime.memory.db import Database
from tests.memory.pg_schema import _conninfo


def test_the_defaults_fit_postgresqls_default_max_connections() -> None:
    rt = RuntimeConfig()
    # 10 000 live sessions / 2 000 per host = 5 hosts (more than min_hosts 2), each full
    assert rt.host_capacity() == (2000, 5)
    budget = connection_budget(hosts=rt.host_capacity()[1], delivery_actors=rt.delivery_actors)
    # 5 hosts × 4 + 2 delivery × 8 + 1 ingress × 8
    assert budget == ConnectionBudget(hosts=20, delivery=16, ingress=8)
    assert budget.total == 44
    assert budget_warning(budget, max_connections=100, reserved=3) is None  # 44 <= 97


def test_the_host_count_follows_the_supervisors_limit() -> None:
    cases = [
        ({"max_live_sessions": 10, "sessions_per_host": 2000, "min_hosts": 2}, (5, 2)),
        ({"max_live_sessions": 10, "sessions_per_host": 1, "min_hosts": 2}, (1, 10)),
        ({"max_live_sessions": 4500, "sessions_per_host": 2000, "min_hosts": 1}, (1500, 3)),
        ({"max_live_sessions": 100, "sessions_per_host": 2000, "min_hosts": 4}, (25, 4)),
    ]
    assert [RuntimeConfig(**knobs).host_capacity() for knobs, _ in cases] == [want for _, want in cases]
    # strict isolation (a process per live session) multiplies the hosts term
    strict = RuntimeConfig(max_live_sessions=50, sessions_per_host=1)
    assert connection_budget(hosts=strict.host_capacity()[1], delivery_actors=2).hosts == 200


def test_the_formula_scales_each_term() -> None:
    knobs = {"hosts": 6, "delivery_actors": 4, "ingress_processes": 2}
    budget = connection_budget(**knobs, per_host=3, per_process=10)
    expected = ConnectionBudget(hosts=18, delivery=40, ingress=20)
    assert (budget, budget.total) == (expected, 78)
    with pytest.raises(ValueError, match="must be >= 0"):
        connection_budget(hosts=-1, delivery_actors=1)


def test_the_warning_names_the_config_keys_and_the_numbers() -> None:
    budget = connection_budget(hosts=50, delivery_actors=4)
    assert budget_warning(budget, max_connections=300, reserved=3) is None  # 240 <= 297
    assert budget_warning(budget, max_connections=240, reserved=0) is None  # exactly full still fits
    assert budget_warning(budget, max_connections=100, reserved=3) == (
        "PostgreSQL accepts 97 connections (max_connections=100 minus 3 reserved for superusers) but "
        "sessionray may open 240 at worst: session hosts → 200 (4 each; their number is "
        "max(runtime.min_hosts, runtime.max_live_sessions / runtime.sessions_per_host)), "
        "runtime.delivery_actors → 32 (8 each), ingress → 8. Raise runtime.sessions_per_host or "
        "lower runtime.max_live_sessions / runtime.min_hosts / runtime.delivery_actors, or raise "
        "max_connections on the server (or put PgBouncer in front); otherwise new connections fail "
        "with 'too many clients already' (deploy/README.md, \"PostgreSQL connections\")."
    )


def _server_limits(pg_url: str) -> tuple[int, int]:
    with psycopg.connect(_conninfo(pg_url), autocommit=True, connect_timeout=5) as conn:
        values = [
            conn.execute(f"SHOW {name}").fetchone()
            for name in ("max_connections", "superuser_reserved_connections")
        ]
    assert values[0] is not None and values[1] is not None
    return int(values[0][0]), int(values[1][0])


def test_start_up_check_reads_the_real_server(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    max_connections, reserved = _server_limits(pg_url)
    usable = max_connections - reserved
    db = Database(pg_url, threads=1)
    try:
        # hosts alone fill the server (usable // 4 of them, one session each); 8 + 8 more for
        # delivery and ingress overflow it
        hosts = usable // 4
        over = RuntimeConfig(max_live_sessions=hosts, sessions_per_host=1, min_hosts=1, delivery_actors=1)
        with caplog.at_level(logging.WARNING, logger="sessionray.sql"):
            message = warn_if_over_connection_budget(db, over)
        expected = budget_warning(
            ConnectionBudget(hosts=hosts * 4, delivery=8, ingress=8), max_connections, reserved
        )
        assert message is not None and message == expected
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", expected)]

        caplog.clear()
        fitting = (usable - 16) // 4
        fits = RuntimeConfig(max_live_sessions=fitting, sessions_per_host=1, min_hosts=1, delivery_actors=1)
        with caplog.at_level(logging.WARNING, logger="sessionray.sql"):
            assert warn_if_over_connection_budget(db, fits) is None
        assert caplog.records == []
    finally:
        db.dispose()


def test_start_up_check_is_a_no_op_on_sqlite(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/budget.db", threads=1)
    try:
        strict = RuntimeConfig(max_live_sessions=100_000, sessions_per_host=1)
        assert warn_if_over_connection_budget(db, strict) is None
    finally:
        db.dispose()


def test_an_unreachable_server_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    db = Database("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2", threads=1)
    try:
        with caplog.at_level(logging.WARNING, logger="sessionray.sql"):
            assert warn_if_over_connection_budget(db, RuntimeConfig()) is None
        assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
            "could not read PostgreSQL max_connections"
        ]
    finally:
        db.dispose()

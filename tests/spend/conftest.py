"""Fixtures of the spend tests: a fresh database per test on SQLite (a tmp_path file) and on
PostgreSQL (a fresh schema, dropped afterwards), with the tables of ``create_tables`` (the usage
ledger included), the process's usage ledger installed on it, and a private metrics registry."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import prometheus_client
import pytest

from runtime import metrics
from runtime.llm.usage import remove_usage_observer
from runtime.memory import Database
from runtime.spend.ledger import install_ledger
from tests.memory.pg_schema import create_schema, drop_schema


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A :class:`Database` with every start-up table, whose usage ledger records this process's calls."""
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/spend/sessionray.db"
    else:
        pg_url = request.getfixturevalue("pg_url")
        url, schema = create_schema(pg_url)
    database = Database(url)
    database.create_tables()
    ledger = install_ledger(database)
    try:
        yield database
    finally:
        remove_usage_observer(ledger)
        database.dispose()
        if schema is not None:
            drop_schema(request.getfixturevalue("pg_url"), schema)


@pytest.fixture
def metric() -> Iterator[Callable[..., float]]:
    """``metric(name, **labels) -> value`` (0.0 when never recorded) on a fresh registry."""
    registry = prometheus_client.CollectorRegistry()
    previous = metrics.get_backend()
    metrics.set_backend(metrics.PrometheusBackend(registry))

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    try:
        yield value
    finally:
        metrics.set_backend(previous)

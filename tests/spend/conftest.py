"""Fixtures of the spend tests: a fresh database per test on SQLite (a tmp_path file) and on
PostgreSQL (a fresh schema, dropped afterwards), with the tables of ``create_tables`` (the usage
ledger included) and the process's usage ledger installed on it. The private metrics registry
(``metric``) is tests/conftest.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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

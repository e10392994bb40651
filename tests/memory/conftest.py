"""Fixtures of the memory tests: a fresh database per test on SQLite (a tmp_path file) and on
PostgreSQL (a fresh schema per test in the server of ``pg_url``, dropped afterwards)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.memory import Database
from tests.memory.pg_schema import create_schema, drop_schema


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of an empty database: a SQLite file under tmp_path, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/memory/sessionray.db"
        return
    pg_url = request.getfixturevalue("pg_url")
    url, schema = create_schema(pg_url)
    try:
        yield url
    finally:
        drop_schema(pg_url, schema)


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    """A :class:`Database` on ``db_url`` with the memory tables created."""
    database = Database(db_url)
    database.create_tables()
    try:
        yield database
    finally:
        database.dispose()

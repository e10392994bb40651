"""Fixtures of the Ray-free session tests: a fresh SQLite context store per test (the private
metrics registry, ``metric``, is tests/conftest.py's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository


@pytest.fixture
def repo(tmp_path: Path) -> Iterator[ContextRepository]:
    """A :class:`ContextRepository` on a SQLite file in ``tmp_path`` with every start-up table."""
    db = Database(f"sqlite:///{tmp_path / 'session.db'}")
    db.create_tables()
    yield ContextRepository(db)
    db.dispose()

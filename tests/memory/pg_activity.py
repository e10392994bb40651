"""Count a test's own PostgreSQL connections: the test names them with a unique
``application_name`` (other tests and helpers share the server), and polls ``pg_stat_activity``
until the count settles (a closed socket's backend leaves the view a moment later)."""

from __future__ import annotations

import time
import uuid

import psycopg
from sqlalchemy.engine import make_url

from tests.memory.pg_schema import _conninfo


def tagged(url: str) -> tuple[str, str]:
    """``url`` with a fresh ``application_name``; returns (that URL, the name)."""
    name = f"sr-test-{uuid.uuid4().hex[:12]}"
    named = make_url(url).update_query_dict({"application_name": name})
    return named.render_as_string(hide_password=False), name


def connections(pg_url: str, name: str) -> int:
    """Open connections of ``application_name = name`` right now."""
    with psycopg.connect(_conninfo(pg_url), autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            (name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def settled_connections(pg_url: str, name: str, expected: int, timeout_s: float = 10.0) -> int:
    """:func:`connections` once it equals ``expected`` or ``timeout_s`` passed (then the last count,
    for the caller's assertion to show)."""
    deadline = time.monotonic() + timeout_s
    while True:
        n = connections(pg_url, name)
        if n == expected or time.monotonic() >= deadline:
            return n
        time.sleep(0.05)

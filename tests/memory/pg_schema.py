"""Throw-away PostgreSQL schemas for the memory tests and benchmark: each user gets its own schema
(selected through the URL's ``options=-csearch_path=…``), so runs never see each other's rows."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[2]


def _conninfo(pg_url: str) -> str:
    return make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_schema(pg_url: str, prefix: str = "t") -> tuple[str, str]:
    """Create a new schema in the server of ``pg_url``.

    Returns:
        (a URL whose search_path is the new schema, the schema name).

    Raises:
        psycopg.OperationalError: the server is unreachable.
    """
    schema = f"{prefix}_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(_conninfo(pg_url), autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = make_url(pg_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False), schema


def drop_schema(pg_url: str, schema: str) -> None:
    """Drop a schema made by :func:`create_schema` (and everything in it)."""
    with psycopg.connect(_conninfo(pg_url), autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def find_or_start_postgres() -> tuple[str | None, str]:
    """``SESSIONRAY_TEST_PG_URL`` if set, else start (or reuse) the local test cluster with
    ``scripts/test-deps.sh --postgres-only``. Returns (url or None, how/why)."""
    url = os.environ.get("SESSIONRAY_TEST_PG_URL")
    if url:
        return url, "from SESSIONRAY_TEST_PG_URL"
    script = ROOT / "scripts" / "test-deps.sh"
    try:
        out = subprocess.run(
            ["bash", str(script), "--postgres-only"],
            capture_output=True,
            text=True,
            timeout=900,  # may include apt-get install postgresql
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"could not run scripts/test-deps.sh: {exc}"
    url = out.stdout.strip()
    if out.returncode != 0 or not url:
        return None, f"scripts/test-deps.sh failed (rc={out.returncode}): {out.stderr.strip()[-300:]}"
    return url, "started by scripts/test-deps.sh"

"""Cluster checks run when the actor runtime starts: SQL must match the Ray cluster's shape.

SQLite is a file on one machine. On a Ray cluster with more than one alive node, session hosts
(and delivery actors) are placed on any node, so each node would open its *own* SQLite file and
sessions would silently lose their memory when they move. On a multi-node cluster
(docs/decisions.md#memory-postgres-multinode) the URL must be PostgreSQL, and the runtime refuses to
start a multi-node cluster on SQLite with a clear error.

The check counts nodes at start-up. A cluster that is expected to *grow* later (an autoscaling
KubeRay worker group that starts at zero replicas) must be configured with PostgreSQL from the
start; deploy/kuberay/*.yaml do so.

Usage (``actors/placement/runtime.py``, after ``ray.init``)::

    from actors.raylife.cluster import ensure_database_fits_cluster
    ensure_database_fits_cluster(config.database.url)
"""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

__all__ = [
    "ClusterConfigError",
    "alive_node_count",
    "check_database_for_nodes",
    "ensure_database_fits_cluster",
    "is_sqlite",
]

POSTGRES_EXAMPLE = "postgresql+psycopg://USER:PASSWORD@HOST:5432/DBNAME"
"""The URL shape shown to the user when SQLite is refused (psycopg 3 driver)."""


class ClusterConfigError(RuntimeError):
    """The configuration cannot run on the Ray cluster it is connected to (e.g. SQLite on a
    multi-node cluster)."""


def is_sqlite(database_url: str | None) -> bool:
    """True when ``database_url`` names SQLite (``None`` = the default ``sqlite:///./data/…``)."""
    if not database_url:
        return True
    try:
        return make_url(database_url).get_backend_name() == "sqlite"
    except ArgumentError:
        # Unparsable URLs are reported by runtime.memory.db.normalize_url; not this check's job.
        return database_url.startswith("sqlite")


def check_database_for_nodes(database_url: str | None, alive_nodes: int) -> None:
    """Refuse SQLite when ``alive_nodes`` > 1 (pure function; no Ray needed).

    Args:
        database_url: ``database.url`` from the configuration; ``None`` means the default SQLite file.
        alive_nodes: Number of alive Ray nodes (the head counts as one).

    Raises:
        ClusterConfigError: more than one alive node and a SQLite URL. The message names the node
            count, the configured URL and the PostgreSQL URL shape to use instead.
    """
    if alive_nodes > 1 and is_sqlite(database_url):
        shown = database_url or "sqlite:///./data/sessionray.db (the default)"
        raise ClusterConfigError(
            f"multi-node Ray cluster with {alive_nodes} alive nodes needs PostgreSQL; "
            f"database.url is {shown} — set database.url to {POSTGRES_EXAMPLE} "
            "(every node must reach the same database; a SQLite file lives on one machine)"
        )


def alive_node_count() -> int:
    """Number of alive nodes in the Ray cluster this process is connected to.

    Raises:
        ClusterConfigError: Ray is not initialized in this process (call after ``ray.init``).
    """
    import ray

    if not ray.is_initialized():
        raise ClusterConfigError("Ray is not initialized: connect (ray.init) before checking the cluster")
    return sum(1 for node in ray.nodes() if node.get("Alive"))


def ensure_database_fits_cluster(database_url: str | None) -> None:
    """Check ``database_url`` against the connected Ray cluster
    (docs/decisions.md#memory-postgres-multinode).

    Call it from the runtime start, after ``ray.init``, before any actor opens the database.

    Args:
        database_url: ``database.url`` from the configuration (``None``: the default SQLite file).

    Raises:
        ClusterConfigError: Ray is not initialized, or the cluster has more than one alive node and
            ``database_url`` is SQLite, e.g. "multi-node Ray cluster with 2 alive nodes needs
            PostgreSQL; database.url is sqlite:///data/s.db — set database.url to
            postgresql+psycopg://USER:PASSWORD@HOST:5432/DBNAME …".
    """
    check_database_for_nodes(database_url, alive_node_count())

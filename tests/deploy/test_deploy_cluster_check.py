"""actors/raylife/cluster.py: SQLite is refused on a multi-node Ray cluster
(docs/decisions.md#memory-postgres-multinode).
The refusal on a real two-node cluster is in test_deploy_two_node.py."""

from __future__ import annotations

import pytest

from actors.raylife.cluster import ClusterConfigError, check_database_for_nodes, ensure_database_fits_cluster

HINT = "set database.url to postgresql+psycopg://USER:PASSWORD@HOST:5432/DBNAME " \
    "(every node must reach the same database; a SQLite file lives on one machine)"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("sqlite:///data/s.db", "sqlite:///data/s.db"),
        ("sqlite:////var/lib/sessionray/s.db", "sqlite:////var/lib/sessionray/s.db"),
        (None, "sqlite:///./data/sessionray.db (the default)"),
    ],
)
def test_sqlite_on_several_nodes_is_refused_with_the_fix(url: str | None, shown: str) -> None:
    with pytest.raises(ClusterConfigError) as err:
        check_database_for_nodes(url, 3)
    assert str(err.value) == (
        f"multi-node Ray cluster with 3 alive nodes needs PostgreSQL; database.url is {shown} — {HINT}"
    )


@pytest.mark.parametrize(
    ("url", "nodes"),
    [
        ("sqlite:///data/s.db", 1),
        (None, 1),
        ("postgresql+psycopg://u@db:5432/s", 1),
        ("postgresql+psycopg://u@db:5432/s", 5),
        ("postgresql://u@db/s", 2),
    ],
)
def test_accepted_combinations(url: str | None, nodes: int) -> None:
    assert check_database_for_nodes(url, nodes) is None


@pytest.mark.ray
def test_single_node_test_cluster_accepts_sqlite(ray_session: None, tmp_path: object) -> None:
    """The session's local Ray instance is one node: SQLite is fine there."""
    assert ensure_database_fits_cluster(f"sqlite:///{tmp_path}/s.db") is None

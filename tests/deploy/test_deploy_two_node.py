"""A real two-node Ray cluster on this machine (docs/decisions.md#memory-postgres-multinode).

* `ray start --head --block` and `ray start --block --address=<head>` for a second node, each with
  its own custom resource (`sessionray_test_head`, `sessionray_test_node2`), token auth, its own
  ports, in process sessions of their own (tests/deploy/harness.py: teardown never uses
  `ray stop`, which would kill every Ray on the machine, including the `ray_session` fixture's).
* `sessionray serve --address auto` (RAY_ADDRESS names the head) on SQLite is refused with the
  ClusterConfigError message; on PostgreSQL (a fresh database on the `pg_url` server) it runs.
* Private chats from several users → sessions observed in session hosts (process titles
  ``ray::SessionHost``) on BOTH nodes; a steer is sent from the CLI and over HTTP to every live
  session; at least one of them crosses nodes (router shard on one node, the session's host on the
  other) and every steer's reply reaches the platform API.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
import yaml

from tests.deploy.harness import SESSIONRAY, Proc, RayCluster, free_port, wait_for
from tests.platform_api_server import PlatformApiServer

BOT = "1000000001"
MASTER = "200000002"
# The supervisor starts runtime.min_hosts: 2 session hosts placed on the alive nodes in turn (one per
# node), and placement puts each new session on the least loaded host, so the 10 sessions split
# over both hosts, hence both nodes.
USERS = [MASTER, *(str(200000003 + i) for i in range(9))]
ADMIN_TOKEN = "two-node-admin-token"
NODE_RESOURCES = {"head": "sessionray_test_head", "node2": "sessionray_test_node2"}


@dataclass
class TwoNodes:
    cluster: RayCluster
    root: Path
    api: PlatformApiServer

    def config(self, database_url: str, port: int) -> Path:
        """Write a sessionray.yaml for this cluster; returns its path."""
        cfg = {
            "bots": [
                {"platform": "onebot11", "self_id": BOT, "api_base": self.api.base_url, "masters": [MASTER]}
            ],
            "database": {"url": database_url},
            "server": {"host": "127.0.0.1", "port": port, "admin_token_env": "SESSIONRAY_ADMIN_TOKEN"},
            "runtime": {"router_shards": 1, "delivery_actors": 1, "min_hosts": 2},
        }
        path = self.root / f"sessionray-{port}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def env(self) -> dict[str, str]:
        return self.cluster.client_env(SESSIONRAY_ADMIN_TOKEN=ADMIN_TOKEN)


@pytest.fixture(scope="module")
def two_nodes(fixtures_dir: Path) -> Iterator[TwoNodes]:
    root = Path(tempfile.mkdtemp(prefix="srd-2n-", dir="/tmp"))  # short: Ray socket paths
    cluster = RayCluster(root)
    api = PlatformApiServer(fixtures_dir).start()
    try:
        cluster.start_head({NODE_RESOURCES["head"]: 1}, num_cpus=2, dashboard=False)
        cluster.add_worker("node2", {NODE_RESOURCES["node2"]: 1}, num_cpus=2)
        yield TwoNodes(cluster, root, api)
    finally:
        cluster.stop()
        api.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_database(pg_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database on the test server (dropped afterwards), as a SQLAlchemy URL."""
    name = f"srd_two_node_{uuid.uuid4().hex[:8]}"
    conninfo = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_url.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def status_nodes(two_nodes: TwoNodes) -> str:
    """`ray status` against the test cluster (token auth: RAY_AUTH_MODE/RAY_AUTH_TOKEN set)."""
    out = two_nodes.cluster.ray_cli("status")
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def node_of(two_nodes: TwoNodes, title_prefix: str) -> dict[int, str]:
    """pid → node name of the actor processes whose title starts with ``title_prefix``."""
    return {pid: node for node, rows in two_nodes.cluster.actor_processes().items()
            for pid, title in rows if title.startswith(title_prefix)}


def test_two_nodes_are_alive(two_nodes: TwoNodes) -> None:
    def both_nodes() -> str | None:
        """`ray status` once it lists both nodes (the autoscaler's view lags a node's start)."""
        status = status_nodes(two_nodes)
        active = status.split("Active:")[1].split("Pending:")[0]
        nodes = [ln for ln in active.splitlines() if ln.strip().startswith("1 node_")]
        return status if len(nodes) == 2 else None

    status = wait_for("`ray status` to list two active nodes", both_nodes, timeout_s=90, interval_s=2,
                      diagnostics=lambda: status_nodes(two_nodes))
    for resource in NODE_RESOURCES.values():
        assert f"0.0/1.0 {resource}" in status, status


def test_sqlite_on_two_nodes_is_refused(two_nodes: TwoNodes) -> None:
    db = two_nodes.root / "refused.db"
    config = two_nodes.config(f"sqlite:///{db}", free_port())
    argv = [SESSIONRAY, "serve", "--config", str(config), "--address", "auto"]
    proc = subprocess.run(argv, env=two_nodes.env(), capture_output=True, text=True, timeout=300,
                          cwd=two_nodes.root)
    assert proc.returncode != 0
    expected = (
        f"multi-node Ray cluster with 2 alive nodes needs PostgreSQL; database.url is sqlite:///{db} — "
        "set database.url to postgresql+psycopg://USER:PASSWORD@HOST:5432/DBNAME "
        "(every node must reach the same database; a SQLite file lives on one machine)"
    )
    assert expected in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr  # a clean error
    assert not db.exists()  # refused before anything opened the database


@pytest.mark.postgres
def test_sessions_span_both_nodes_and_steer_crosses_nodes(two_nodes: TwoNodes, pg_database: str,
                                                           fixtures_dir: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    config = two_nodes.config(pg_database, port)
    serve = Proc("serve-pg", [SESSIONRAY, "serve", "--config", str(config), "--address", "auto"],
                 two_nodes.env(), two_nodes.root / "serve-pg.log", cwd=two_nodes.root)
    try:
        def up() -> bool:
            if not serve.alive():
                pytest.fail(f"sessionray serve exited\n{serve.output()}")
            return httpx.get(base + "/healthz", timeout=2).status_code == 200

        wait_for("sessionray serve /healthz", up, timeout_s=300,
                 diagnostics=lambda: two_nodes.cluster.logs() + serve.output())
        try:
            run_two_node_scenario(two_nodes, base, fixtures_dir)
        except (AssertionError, TimeoutError) as exc:
            raise AssertionError(f"{exc}\n{serve.output(tail=150)}") from exc
    finally:
        serve.stop(grace_s=20)


def run_two_node_scenario(two_nodes: TwoNodes, base: str, fixtures_dir: Path) -> None:
    api = two_nodes.api
    api.reset()
    event = json.loads((fixtures_dir / "onebot11" / "event_private_message_array.json").read_text())
    for i, user in enumerate(USERS):
        body = event | {"user_id": int(user), "message_id": 7000 + i, "raw_message": f"hi from {user}",
                        "sender": {"user_id": int(user), "nickname": f"u{user}", "card": ""},
                        "message": [{"type": "text", "data": {"text": f"hi from {user}"}}]}
        r = httpx.post(f"{base}/webhooks/onebot11/{BOT}", json=body, timeout=120)
        assert (r.status_code, r.json()) == (200, {"status": "accepted"})
    api.wait_for_requests(len(USERS), timeout_s=300)  # 10 activations and turns on a loaded machine

    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    sessions = httpx.get(f"{base}/admin/sessions", headers=headers, timeout=30).json()["sessions"]
    keys = sorted(s["session_key"] for s in sessions)
    assert keys == sorted(f"onebot11:{BOT}:private:{u}" for u in USERS)
    listed = subprocess.run([SESSIONRAY, "sessions", "--url", base], env=two_nodes.env(),
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    first, header, *rows = listed.stdout.splitlines()  # a count, the table's header, one row a session
    assert (first, header.split()[:2], [row.split()[0] for row in rows]) == (
        f"{len(USERS)} live sessions",
        ["SESSION", "KEY"],
        keys,
    )

    # Where every actor lives: each node's processes are in that node's process session.
    session_nodes = node_of(two_nodes, "ray::SessionHost")
    [router_node] = node_of(two_nodes, "ray::RouterActor").values()
    placement = {}
    for key in keys:
        url = f"{base}/admin/sessions/{quote(key, safe=':@')}"

        def idle(url: str = url) -> dict[str, Any] | None:
            """The session's status (from its host) once its first turn is done (no turn running: a steer
            then starts a turn of its own instead of joining one that is closing)."""
            actor: dict[str, Any] = httpx.get(url, headers=headers, timeout=30).json()["actor"]
            return actor if actor["turns_done"] >= 1 and actor["active_turns"] == 0 else None

        actor = wait_for(f"{key} idle after its first turn", idle, timeout_s=60)
        placement[key] = session_nodes[actor["pid"]]
    assert set(placement.values()) == {"head", "node2"}, (placement, session_nodes)  # hosts on both nodes

    # Steer every live session: half from the CLI, half over HTTP.
    api.reset()
    steered = {}
    for i, key in enumerate(keys):
        text = f"steer {i}: summarize"
        if i % 2 == 0:
            out = subprocess.run([SESSIONRAY, "steer", key, text, "--as", MASTER, "--url", base],
                                 env=two_nodes.env(), capture_output=True, text=True, timeout=120)
            assert (out.returncode, out.stdout.strip()) == (0, "steer: started"), out.stderr
        else:
            r = httpx.post(f"{base}/admin/sessions/{quote(key, safe=':@')}/steer", headers=headers,
                           json={"text": text, "sender_id": MASTER}, timeout=120)
            assert (r.status_code, r.json()) == (200, {"status": "ok", "kind": "steer", "session_key": key,
                                                       "result": "started"})
        steered[key] = text
    crossing = [k for k in keys if placement[k] != router_node]
    assert crossing, f"router on {router_node}, sessions {placement}"  # ≥ 1 steer crossed nodes

    sent = api.wait_for_requests(len(keys), timeout_s=300)
    got = sorted((r.json["user_id"], r.json["message"][0]["data"]["text"]) for r in sent)
    assert got == sorted((int(k.rsplit(":", 1)[1]), f"You said: {steered[k]}") for k in keys)

    # A non-master is refused (403) and nothing is sent.
    r = httpx.post(f"{base}/admin/sessions/{quote(keys[0], safe=':@')}/steer", headers=headers,
                   json={"text": "not allowed", "sender_id": "999"}, timeout=60)
    assert r.status_code == 403
    assert len(api.requests) == len(keys)

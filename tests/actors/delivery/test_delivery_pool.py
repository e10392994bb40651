"""DeliveryActor pool on a real local Ray: the send, the ledger, retries, transcripts, the stable pick."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlmodel import select

from actors.delivery.pool import DeliveryResult, partition_of
from runtime.delivery import ledger as ledger
from runtime.memory.db import Database
from runtime.memory.tables import ImTranscriptRow
from tests.actors.edge_support import BOT_ID, delivery_pool, private_call, text_job
from tests.platform_api_server import PlatformApiServer

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture(scope="module")
def env(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory, ray_session: None):
    """One platform-API server, one SQLite file and one pool of 2 delivery actors for the module
    (actor start-up is the expensive part); each test uses its own reply ids and scene."""
    url = f"sqlite:///{tmp_path_factory.mktemp('delivery') / 'edge.db'}"
    with (
        PlatformApiServer(fixtures_dir) as server,
        delivery_pool(url, server.base_url, size=2, max_age_s=2) as pool,
    ):
        yield server, url, pool


@pytest.fixture
def api(env):
    server, _, _ = env
    server.reset()
    return server


def _transcripts(url: str) -> list[tuple[str, str, str, str, str]]:
    db = Database(url)
    try:
        with db.session() as s:
            rows = s.exec(select(ImTranscriptRow)).all()
            return [(r.direction, r.message_id, r.scene_id, r.sender_id, r.body) for r in rows]
    finally:
        db.dispose()


def test_partition_is_stable_crc32() -> None:
    # zlib.crc32, not the per-process salted hash(): the same key maps to the same actor everywhere.
    assert partition_of("onebot11:10001:private:20002", 7) == 3127067995 % 7 == 2
    assert [partition_of(f"console:bot:private:u{i}", 3) for i in range(6)] == [1, 1, 1, 2, 0, 2]
    with pytest.raises(ValueError, match="must be >= 1"):
        partition_of("x", 0)


async def test_send_then_ledger_prevents_duplicate(env, api: PlatformApiServer) -> None:
    _, url, pool = env
    job = text_job("hello", reply_id="r-dup")
    await pool.ready()
    first = await pool.deliver(job)
    replay = await pool.deliver(job)
    mid = json.loads(api.onebot_ok)["data"]["message_id"]
    assert first == DeliveryResult(reply_id="r-dup", outcome="sent", message_ids=[str(mid)], attempts=1)
    assert replay == DeliveryResult(reply_id="r-dup", outcome="duplicate", message_ids=[str(mid)])
    assert [(r.path, r.json) for r in api.requests] == [("/send_private_msg", private_call("20002", "hello"))]
    assert [t for t in _transcripts(url) if t[2] == "20002"] == [
        ("outbound", str(mid), "20002", BOT_ID, "hello")
    ]
    db = Database(url)
    entry = ledger.get_entry(db, "r-dup")
    db.dispose()
    assert entry is not None
    assert (entry.status, entry.steps_total, entry.steps_done, entry.in_flight) == ("sent", 1, 1, -1)


async def test_429_with_retry_after_then_success(env, api: PlatformApiServer) -> None:
    _, _, pool = env
    api.fail_next(1, 429, retry_after=0.2)
    result = await pool.deliver(text_job("again", reply_id="r-429"))
    mid = str(json.loads(api.onebot_ok)["data"]["message_id"])
    # Retry-After is honoured exactly (no jitter when the platform says how long to wait).
    assert result == DeliveryResult(
        reply_id="r-429", outcome="sent", message_ids=[mid], attempts=2, waits_s=[0.2]
    )
    assert [(r.path, r.json) for r in api.requests] == [
        ("/send_private_msg", private_call("20002", "again"))
    ] * 2


async def test_5xx_retries_with_backoff_until_max_age_then_fails(env, api: PlatformApiServer) -> None:
    # module pool settings: max_age_s=2, backoff_base_s=0.01, backoff_max_s=0.5 (full jitter).
    # Behaviour changed by issue #16: no fixed attempt count; retries go on until the reply is
    # delivery.max_age_s old, then it is failed (reason "expired").
    _, url, pool = env
    api.respond_with("/send_private_msg", 503, b'{"status":"failed","retcode":503,"data":null}')
    result = await pool.deliver(text_job("nope", reply_id="r-503", scene_id="30003"))
    replay = await pool.deliver(text_job("nope", reply_id="r-503", scene_id="30003"))
    api.reset_scripts()
    assert result.outcome == "failed" and result.attempts >= 2
    assert len(result.waits_s) == result.attempts - 1
    # exponential with full jitter: the n-th wait is in [0, min(0.5, 0.01 · 2^(n-1))] s
    assert all(0 <= w <= min(0.5, 0.01 * 2**n) for n, w in enumerate(result.waits_s))
    assert result.error is not None and "503" in result.error and "delivery.max_age_s=2" in result.error
    assert replay.outcome == "duplicate" and replay.error == result.error
    assert len(api.requests) == result.attempts
    # nothing confirmed, no outbound transcript for that scene
    assert [t for t in _transcripts(url) if t[2] == "30003"] == []


async def test_failed_retcode_is_permanent(env, api: PlatformApiServer) -> None:
    _, _, pool = env
    api.fail_retcode("/send_private_msg")
    result = await pool.deliver(text_job("x", reply_id="r-1404"))
    failed = json.loads(api.onebot_failed)
    assert result.outcome == "failed" and result.attempts == 1
    assert result.error is not None and result.error.startswith(f"retcode {failed['retcode']}")
    assert len(api.requests) == 1


async def test_pick_routes_by_session_key(env) -> None:
    _, _, pool = env
    owners = await pool.ready()
    assert [o.split(":")[0] for o in owners] == ["0", "1"]
    for scene in ("1", "2", "3", "4"):
        key = f"onebot11:{BOT_ID}:private:{scene}"
        assert await pool.pick(key).ready.remote() == owners[partition_of(key, 2)]


async def test_actor_metrics_exported_by_the_ray_node_agent(env, api: PlatformApiServer) -> None:
    """Inside actors runtime.metrics go to ray.util.metrics (declared tag keys); the node's metrics
    agent exports them with Ray's ``ray_`` prefix."""
    import asyncio
    import time

    import httpx
    import ray

    _, _, pool = env
    assert (await pool.deliver(text_job("metered", reply_id="r-metrics"))).outcome == "sent"
    port = ray.nodes()[0]["MetricsExportPort"]
    deadline = time.monotonic() + 60
    while True:
        text = (await asyncio.to_thread(httpx.get, f"http://127.0.0.1:{port}/metrics", timeout=10)).text
        lines = [ln for ln in text.splitlines() if ln.startswith("ray_sessionray_deliveries_total{")]
        if any('outcome="ok"' in ln and 'platform="onebot11"' in ln for ln in lines):
            break
        assert time.monotonic() < deadline, f"no delivery series exported: {lines}"
        await asyncio.sleep(0.5)
    latency = [
        ln for ln in text.splitlines() if ln.startswith("ray_sessionray_delivery_latency_seconds_bucket{")
    ]
    assert latency and all('platform="onebot11"' in ln for ln in latency)

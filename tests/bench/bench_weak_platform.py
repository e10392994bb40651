"""Delivery against a weak platform server (issue 27; docs/decisions.md#delivery-not-received):
20 chats × 33 replies, closed loop (each chat sends its next reply when the last one's result
came), through two real DeliveryActors (real Ray) to :class:`tests.weak_platform_server.
WeakPlatformServer` — a single-threaded HTTP/1.0 server with a small listen backlog.

Figures per case (listen backlog, ``bots[].max_connections``): the replies' outcomes, ``lost``
(never reached the server), ``duplicated`` (reached it twice), ``retries`` (calls sent again:
nothing of them reached the server), the connections the server accepted and the seconds taken.
``python -m tests.bench weak_platform``.
"""

from __future__ import annotations

import asyncio
import collections
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHATS, REPLIES = 20, 33
CASES = ((5, None), (1, None), (1, 32))
"""(listen backlog, bots[].max_connections or None for the default)."""


async def _closed_loop(pool: Any, jobs: list[list[Any]]) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()

    async def chat(replies: list[Any]) -> None:
        for job in replies:
            result = await pool.deliver(job)
            counts[result.outcome] += 1
            counts["retries"] += max(0, result.attempts - 1)

    await asyncio.gather(*(chat(replies) for replies in jobs))
    return counts


def _case(backlog: int, max_connections: int | None, db_dir: Path) -> dict[str, Any]:
    import time

    from tests.actors.edge_support import delivery_pool, text_job
    from tests.weak_platform_server import WeakPlatformServer

    bot = {} if max_connections is None else {"max_connections": max_connections}
    jobs = [[text_job(f"{c}/{m}", scene_id=str(40000 + c)) for m in range(REPLIES)] for c in range(CHATS)]
    db_url = f"sqlite:///{db_dir / f'{uuid.uuid4().hex}.db'}"
    with WeakPlatformServer(backlog=backlog) as server:
        with delivery_pool(db_url, server.base_url, 2, bot=bot, actors=2, backoff_base_s=0.05) as pool:
            started = time.perf_counter()
            counts = asyncio.run(_closed_loop(pool, jobs))
        elapsed = time.perf_counter() - started
        seen = collections.Counter(body["message"][0]["data"]["text"] for body in server.bodies)
    expected = {f"{c}/{m}" for c in range(CHATS) for m in range(REPLIES)}
    return {
        "backlog": backlog,
        "max_connections": max_connections or "default",
        "outcomes": {k: v for k, v in counts.items() if k != "retries"},
        "retries": counts["retries"],
        "lost": len(expected - set(seen)),
        "duplicated": sum(1 for n in seen.values() if n > 1),
        "accepted": server.accepted,
        "seconds": round(elapsed, 1),
    }


def run() -> dict[str, Any]:
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, logging_level="error",
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # fmt: skip
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backlog, max_connections in CASES:
            figures = _case(backlog, max_connections, Path(tmp))
            print(f"   {figures}", flush=True)
            out[f"backlog{backlog}_conn{max_connections or 'default'}"] = figures
    return out

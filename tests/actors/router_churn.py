"""Placement under churn at the live-session cap: a measurement helper.

:func:`churn` drives ``keys`` private chats against a running runtime, each chat sending
``messages`` texts one after another (the next once the previous reply reached the platform API,
optionally after ``think_ms``), every chat at the same time; with more chats than
``runtime.max_live_sessions`` many messages need an LRU passivation on a host and an activation. It returns
the time-to-reply of every message (first ``submit`` attempt, busy answers retried, until the
platform API received the reply) and whether every chat got exactly its replies in order.

Run it as a script for before/after figures (starts its own local Ray)::

    .venv/bin/python -m tests.actors.router_churn [--cap 3] [--keys 12] [--messages 5] [--runs 1] \
        [--sessions-per-host 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.actors.session_support import Harness, inbound, running_runtime
from tests.bench.stats import pct

__all__ = ["churn"]


async def churn(
    h: Harness, users: list[str], messages: int, think_ms: float = 0.0, timeout_s: float = 300.0
) -> dict[str, Any]:
    """Run the churn load; ``users`` must be fresh chat ids. ``think_ms``: pause of a chat between
    a reply and its next message (a session is then idle at the shard, so waiting new sessions
    LRU-passivate it and its next message needs a slot again).

    Returns:
        ``{"replies_ms": [float, ...] (one per message, ms), "busy": int (busy answers),
        "p50_ms", "p90_ms", "p99_ms", "max_ms", "wall_s", "in_order": bool}``.

    Raises:
        AssertionError: a reply did not arrive within ``timeout_s`` seconds.
    """
    replies_ms: list[float] = []
    busy = 0

    async def chat(user: str) -> None:
        nonlocal busy
        for i in range(messages):
            msg = inbound(user, f"{user}-{i}")
            t0 = time.perf_counter()
            deadline = time.monotonic() + timeout_s
            while True:
                res = await h.rt.submit(msg)
                if res.status == "accepted":
                    break
                assert res.status == "busy", res
                busy += 1
                assert time.monotonic() < deadline, f"{user}-{i} still busy"
                await asyncio.sleep(min(res.retry_after_s or 0.05, 0.05))
            while len(h.sent(user)) <= i:
                assert time.monotonic() < deadline, f"no reply to {user}-{i}"
                await asyncio.sleep(0.005)
            replies_ms.append((time.perf_counter() - t0) * 1000)
            if think_ms:
                await asyncio.sleep(think_ms / 1000)

    t_start = time.perf_counter()
    await asyncio.gather(*(chat(u) for u in users))
    wall_s = time.perf_counter() - t_start
    in_order = all(h.sent(u) == [f"re: {u}-{i}" for i in range(messages)] for u in users)
    return {
        "replies_ms": replies_ms,
        "busy": busy,
        "p50_ms": round(pct(replies_ms, 0.5), 1),
        "p90_ms": round(pct(replies_ms, 0.9), 1),
        "p99_ms": round(pct(replies_ms, 0.99), 1),
        "max_ms": round(max(replies_ms), 1),
        "wall_s": round(wall_s, 2),
        "in_order": in_order,
    }


def _main() -> None:  # pragma: no cover - manual measurement
    import os

    import ray

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cap", type=int, default=3)
    ap.add_argument("--keys", type=int, default=12)
    ap.add_argument("--messages", type=int, default=5)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--think-ms", type=float, default=50.0)
    ap.add_argument("--sessions-per-host", type=int, default=2000)
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[2]
    ray.init(
        num_cpus=8,
        include_dashboard=False,
        logging_level="warning",
        runtime_env={"env_vars": {"PYTHONPATH": str(root)}},
    )
    fixtures = Path(os.environ.get("SESSIONRAY_FIXTURES", root / "tests" / "fixtures"))
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            running_runtime(
                Path(tmp),
                fixtures,
                max_live_sessions=args.cap,
                idle_ttl_s=600,
                sessions_per_host=args.sessions_per_host,
            ) as h,
        ):
            for run in range(args.runs):
                users = [f"{70000 + run * 1000 + i}" for i in range(args.keys)]
                res = asyncio.run(churn(h, users, args.messages, args.think_ms))
                status = asyncio.run(h.rt.status())
                shard = status["shards"][0]
                res.pop("replies_ms")
                extra = {k: shard.get(k) for k in ("forgotten", "evictions", "placed")}
                hosts = {k: status["supervisor"].get(k) for k in ("created", "cold")}
                print(json.dumps({**res, **extra, **hosts, "errors": status["submit"]["errors"]}))
    finally:
        ray.shutdown()


if __name__ == "__main__":  # pragma: no cover
    _main()

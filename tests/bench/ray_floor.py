"""The raw Ray floor of the message path, measured in the benchmark's own run: an awaited chain of
three bare async actors (webhook → session → delivery has that shape) and its pipelined ceiling."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

__all__ = ["floor"]


def floor(n_seq: int, n_pipe: int, in_flight: int = 64) -> tuple[float, float]:
    """``(p50 ms of one awaited 3-hop call over n_seq calls, msgs/s of n_pipe calls with
    in_flight at once)``. Ray must be initialized; the three actors are killed afterwards."""
    import ray

    @ray.remote(num_cpus=0)
    class Hop:
        def __init__(self, nxt: Any = None) -> None:
            self.nxt = nxt

        async def hop(self, payload: dict[str, Any]) -> dict[str, Any]:
            if self.nxt is None:
                return payload
            return await self.nxt.hop.remote(payload)  # type: ignore[no-any-return]

    c = Hop.remote()  # type: ignore[attr-defined]
    b = Hop.remote(c)  # type: ignore[attr-defined]
    a = Hop.remote(b)  # type: ignore[attr-defined]
    payload = {"session_key": "onebot11:1:private:2", "text": "x" * 64}

    async def go() -> tuple[float, float]:
        for _ in range(20):
            await a.hop.remote(payload)
        lat = []
        for _ in range(n_seq):
            t0 = time.perf_counter()
            await a.hop.remote(payload)
            lat.append((time.perf_counter() - t0) * 1000)
        sem = asyncio.Semaphore(in_flight)

        async def one() -> None:
            async with sem:
                await a.hop.remote(payload)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n_pipe)))
        return statistics.median(lat), n_pipe / (time.perf_counter() - t0)

    try:
        return asyncio.run(go())
    finally:
        for h in (a, b, c):
            ray.kill(h)

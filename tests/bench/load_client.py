"""The load side of the runtime benchmark, in its own process (tests/bench/bench_runtime.py).

The load generator (an httpx client posting OneBot v11 webhooks) and the platform-API server that
timestamps each reply run here, not in the driver: the driver hosts the ingress (as
``sessionray serve`` does), and a load generator sharing its GIL would slow the system under test
down by its own work. Both timestamps of a message (webhook POST sent, reply API call received)
are taken in this process, with one clock.

Protocol over a ``multiprocessing`` pipe: the child sends ``("ready", api_base_url)``; then each
``("warm", ingress_url, sessions, tag)`` (one unmeasured message per session) or
``("load", ingress_url, sessions, per_session, tag, warm)`` is answered with the load's figures
(a dict, see :func:`run_load`), and ``("stop",)`` ends the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from tests.bench.stats import pct

__all__ = ["child_main", "run_load", "timed_api_server"]


_JSON = {"Content-Type": "application/json"}


def _timed_server_class() -> Any:
    from tests.platform_api_server import PlatformApiServer

    class _Timed(PlatformApiServer):
        """Resolves a waiter (text → future) the moment the reply's API call arrives."""

        def __init__(self, fixtures_dir: Path) -> None:
            super().__init__(fixtures_dir)
            self.waiters: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future[float]]] = {}
            self.wlock = threading.Lock()

        def expect(self, text: str) -> asyncio.Future[float]:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[float] = loop.create_future()
            with self.wlock:
                self.waiters[text] = (loop, fut)
            return fut

        def _answer(self, method: str, path: str, raw_headers: dict[str, str], body: bytes) -> Any:
            t = time.perf_counter()
            out = super()._answer(method, path, raw_headers, body)
            rec = self.requests[-1]
            if isinstance(rec.json, dict):
                text = "".join(s["data"].get("text", "") for s in rec.json.get("message", []))
                with self.wlock:
                    waiter = self.waiters.pop(text, None)
                if waiter is not None:
                    loop, fut = waiter
                    with contextlib.suppress(RuntimeError):  # a late reply after its load phase ended
                        loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(t))
            return out

    return _Timed


def timed_api_server(fixtures_dir: Path) -> Any:
    """A :class:`tests.platform_api_server.PlatformApiServer` whose ``expect(text)`` returns a
    future resolved with ``time.perf_counter()`` when a send whose text is ``text`` arrives."""
    return _timed_server_class()(fixtures_dir)


async def run_load(
    url: str, api: Any, fixtures: Path, n: int, per_session: int, tag: str, warm: bool = True
) -> dict[str, Any]:
    """``n`` sessions (OneBot private chats), each sending ``per_session`` messages in a closed
    loop (the next one only after the previous reply reached the platform API). With ``warm``,
    each session first sends one unmeasured message (activation is measured on its own).

    A 503 (backpressure) is retried after 50 ms and the wait counts in the latency; a reply
    missing after 60 s counts as ``lost``.

    Returns:
        ``sessions``, ``messages`` (replies measured), ``busy_503``, ``lost``, ``p50_ms``,
        ``p99_ms``, ``throughput_msg_s`` (replies / wall seconds of the measured phase),
        ``webhook_ack_p50_ms`` (the webhook POST's own round trip).
    """
    import httpx

    from tests.actors.edge_support import BOT_ID, onebot_event

    lat: list[float] = []
    acks: list[float] = []
    busy = lost = 0
    limits = httpx.Limits(max_connections=max(10, n), max_keepalive_connections=max(10, n))
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(i: int, k: int, phase: str) -> None:
            nonlocal busy, lost
            text = f"{tag}{phase}-{i}-{k}"
            body = onebot_event(fixtures, str(500_000 + i), text, abs(hash((tag, phase, i, k))) % 2**31)
            done = api.expect(f"re: {text}")
            t0 = time.perf_counter()
            while True:
                resp = await client.post(f"{url}/webhooks/onebot11/{BOT_ID}", content=body, headers=_JSON)
                if resp.status_code != 503:
                    break
                busy += 1
                await asyncio.sleep(0.05)
            if resp.status_code != 200:
                raise RuntimeError(f"webhook answered {resp.status_code}: {resp.text}")
            if phase:
                acks.append((time.perf_counter() - t0) * 1000)
            try:
                t1 = await asyncio.wait_for(done, 60)
            except TimeoutError:
                lost += 1
                return
            if phase:
                lat.append((t1 - t0) * 1000)

        if warm:
            await asyncio.gather(*(one(i, 0, "") for i in range(n)))
            busy = lost = 0

        async def session(i: int) -> None:
            for k in range(per_session):
                await one(i, k, "m")

        t0 = time.perf_counter()
        await asyncio.gather(*(session(i) for i in range(n)))
        elapsed = time.perf_counter() - t0
    return {
        "sessions": n, "messages": len(lat), "busy_503": busy, "lost": lost,
        "p50_ms": round(pct(lat, 0.5), 2), "p99_ms": round(pct(lat, 0.99), 2),
        "throughput_msg_s": round(len(lat) / elapsed, 1), "webhook_ack_p50_ms": round(pct(acks, 0.5), 2),
    }  # fmt: skip


def child_main(conn: Any, fixtures: str, root: str) -> None:
    """Entry point of the load process (see the module docstring)."""
    import sys

    sys.path.insert(0, root)
    with timed_api_server(Path(fixtures)) as api:
        conn.send(("ready", api.base_url))
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                return
            try:
                if msg[0] == "warm":  # one unmeasured message per session (activation)
                    _, url, n, tag = msg
                    conn.send(asyncio.run(run_load(url, api, Path(fixtures), n, 0, tag, True)))
                    continue
                _, url, n, per_session, tag, warm = msg
                conn.send(asyncio.run(run_load(url, api, Path(fixtures), n, per_session, tag, warm)))
            except Exception as exc:  # report, keep serving
                conn.send({"error": repr(exc), "sessions": n})

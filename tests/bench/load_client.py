"""The load side of the session-host benchmark, in its own process (tests/bench/bench_hosts.py).

The load generator (an httpx client posting OneBot v11 webhooks) and the platform-API server that
timestamps each reply run here, not in the driver: the driver hosts the ingress (as
``sessionray serve`` does), and a load generator sharing its GIL would slow the system under test
down by its own work. Both timestamps of a message (webhook POST sent, reply API call received)
are taken in this process, with one clock.

Protocol over a ``multiprocessing`` pipe: the child sends ``("ready", api_base_url)``; then each
``("closed", kwargs)`` (:func:`run_load`), ``("open", kwargs)`` (:func:`run_open`) or
``("chatter", kwargs)`` (:func:`run_chatter`) is answered with the load's figures (a dict;
``{"error": ...}`` when it failed), and ``("stop",)`` ends the process. :class:`LoadProcess` is
the driver's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
from pathlib import Path
from typing import Any

from tests.bench.stats import pct

__all__ = [
    "LoadProcess",
    "child_main",
    "group_chatter_event",
    "run_chatter",
    "run_load",
    "run_open",
    "timed_api_server",
]


_JSON = {"Content-Type": "application/json"}
_IDS = itertools.count(1)
"""OneBot message ids of this process (unique: the hosts drop a repeated id as a duplicate)."""
REPLY_TIMEOUT_S = 60.0
"""A reply missing this long after its webhook was accepted counts as ``lost``."""


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


class _Client:
    """One httpx client posting OneBot private-message webhooks and timing their replies."""

    def __init__(self, client: Any, url: str, api: Any, fixtures: Path) -> None:
        from tests.actors.edge_support import BOT_ID

        self.client, self.api, self.fixtures = client, api, fixtures
        self.endpoint = f"{url}/webhooks/onebot11/{BOT_ID}"
        self.busy = self.lost = self.resent = 0

    async def send(self, user: int, text: str, t0: float | None = None) -> tuple[float, float] | None:
        """Post ``text`` from ``user`` (a 503 or a transport error is retried after 50 ms, for at
        most :data:`REPLY_TIMEOUT_S`) and wait for ``re: text`` at the platform API. Returns
        ``(webhook round trip ms, reply latency ms)`` measured from ``t0`` (default: now), or None
        when the reply did not come (``lost``).

        Raises:
            RuntimeError: the webhook answered neither 200 nor 503, or kept failing or answering
                503 for :data:`REPLY_TIMEOUT_S` (a runtime that is gone, e.g. its driver killed:
                the load ends instead of posting forever).
        """
        import httpx

        from tests.actors.edge_support import onebot_event

        body = onebot_event(self.fixtures, str(user), text, next(_IDS))
        done = self.api.expect(f"re: {text}")
        t0 = time.perf_counter() if t0 is None else t0
        while True:
            if time.perf_counter() - t0 > REPLY_TIMEOUT_S:  # the runtime is gone: end the whole load
                raise RuntimeError(f"webhook unreachable or busy for {REPLY_TIMEOUT_S:.0f} s")
            try:
                resp = await self.client.post(self.endpoint, content=body, headers=_JSON)
            except httpx.TransportError:  # e.g. a keep-alive connection the server just closed
                self.resent += 1  # the same message id again: the host drops it if it arrived
                await asyncio.sleep(0.05)
                continue
            if resp.status_code != 503:
                break
            self.busy += 1
            await asyncio.sleep(0.05)
        if resp.status_code != 200:
            raise RuntimeError(f"webhook answered {resp.status_code}: {resp.text}")
        ack = (time.perf_counter() - t0) * 1000
        try:
            t1 = await asyncio.wait_for(done, REPLY_TIMEOUT_S)
        except TimeoutError:
            self.lost += 1
            return None
        return ack, (t1 - t0) * 1000


def _http(n: int) -> Any:
    import httpx

    limits = httpx.Limits(max_connections=max(10, n), max_keepalive_connections=max(10, n))
    return httpx.AsyncClient(timeout=120, limits=limits)


def _figures(c: _Client, timed: list[tuple[float, float]], elapsed: float) -> dict[str, Any]:
    lat = [t[1] for t in timed]
    return {
        "messages": len(lat), "busy_503": c.busy, "lost": c.lost, "resent": c.resent,
        "p50_ms": round(pct(lat, 0.5), 2), "p99_ms": round(pct(lat, 0.99), 2),
        "throughput_msg_s": round(len(lat) / elapsed, 1),
        "webhook_ack_p50_ms": round(pct([t[0] for t in timed], 0.5), 2),
    }  # fmt: skip


async def run_load(
    url: str, api: Any, fixtures: Path, *, base: int, n: int, per_session: int, tag: str, warm: bool
) -> dict[str, Any]:
    """Closed loop: ``n`` sessions (OneBot private chats of users ``base .. base+n-1``), each
    sending ``per_session`` messages, the next only after the previous reply reached the platform
    API. With ``warm``, each session first sends one unmeasured message (its activation) and the
    busy/lost counts restart after it.

    Returns:
        ``sessions``, ``messages`` (replies measured), ``busy_503``, ``lost``, ``resent`` (posts
        repeated after a transport error), ``p50_ms``,
        ``p99_ms``, ``throughput_msg_s`` (replies / wall seconds of the measured phase),
        ``webhook_ack_p50_ms`` (the webhook POST's own round trip).
    """
    async with _http(n) as http:
        c = _Client(http, url, api, fixtures)
        if warm:
            await asyncio.gather(*(c.send(base + i, f"{tag}w-{i}") for i in range(n)))
            c.busy = c.lost = c.resent = 0
        timed: list[tuple[float, float]] = []

        async def session(i: int) -> None:
            for k in range(per_session):
                if (res := await c.send(base + i, f"{tag}m-{i}-{k}")) is not None:
                    timed.append(res)

        t0 = time.perf_counter()
        await asyncio.gather(*(session(i) for i in range(n)))
        return {"sessions": n, **_figures(c, timed, time.perf_counter() - t0)}


async def run_open(
    url: str, api: Any, fixtures: Path, *, base: int, n: int, rate: float, count: int, tag: str, seed: int
) -> dict[str, Any]:
    """Open loop: ``count`` messages offered at ``rate`` msg/s (message ``i`` at ``i / rate`` s),
    each to a random chat of users ``base .. base+n-1`` (``random.Random(seed)``), whether or not
    earlier ones were answered. Latency counts from the message's scheduled time (a late send is
    part of it; ``send_lag_p99_ms`` shows how late this process sent).

    Returns:
        :func:`run_load`'s figures with ``chats``, ``rate_msg_s`` and ``send_lag_p99_ms``.
    """
    rng = random.Random(seed)
    users = [base + rng.randrange(n) for _ in range(count)]
    async with _http(min(count, 500)) as http:
        c = _Client(http, url, api, fixtures)
        timed: list[tuple[float, float]] = []
        lags: list[float] = []

        async def one(i: int, due: float) -> None:
            lags.append((time.perf_counter() - due) * 1000)
            if (res := await c.send(users[i], f"{tag}o-{i}", due)) is not None:
                timed.append(res)

        t0 = time.perf_counter()
        tasks = []
        for i in range(count):
            due = t0 + i / rate
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.ensure_future(one(i, due)))
        await asyncio.gather(*tasks)
        out = _figures(c, timed, time.perf_counter() - t0)
    return {"chats": n, "rate_msg_s": rate, **out, "send_lag_p99_ms": round(pct(lags, 0.99), 2)}


def group_chatter_event(fixtures_dir: Path, group: int, text: str, message_id: int) -> bytes:
    """The recorded OneBot group-message event (fixtures, unchanged on disk) re-addressed to the
    bench bot's group ``group``, text only: no mention of the bot, so it is untriggered chatter."""
    import json

    from tests.actors.edge_support import BOT_ID

    event = json.loads((fixtures_dir / "onebot11" / "event_group_message_array.json").read_bytes())
    event.update(
        self_id=int(BOT_ID),
        group_id=group,
        message_id=message_id,
        raw_message=text,
        message=[{"type": "text", "data": {"text": text}}],
    )
    return json.dumps(event).encode()


async def run_chatter(
    url: str, api: Any, fixtures: Path, *, base: int, n: int, count: int, tag: str, in_flight: int = 20
) -> dict[str, Any]:
    """Untriggered chatter: ``count`` group messages without a mention, to groups ``base ..
    base+n-1`` in turn, ``in_flight`` webhooks at a time; each must be answered 200
    ``untriggered`` (stored as a transcript row, no turn, no reply).

    Returns:
        ``messages``, ``ack_p50_ms`` / ``ack_p99_ms`` (the webhook round trip),
        ``throughput_msg_s``.

    Raises:
        RuntimeError: a webhook answered anything else.
    """
    from tests.actors.edge_support import BOT_ID

    endpoint = f"{url}/webhooks/onebot11/{BOT_ID}"
    sem = asyncio.Semaphore(in_flight)
    acks: list[float] = []
    async with _http(in_flight) as http:

        async def one(i: int) -> None:
            body = group_chatter_event(fixtures, base + i % n, f"{tag}c-{i}", next(_IDS))
            async with sem:
                t0 = time.perf_counter()
                resp = await http.post(endpoint, content=body, headers=_JSON)
                acks.append((time.perf_counter() - t0) * 1000)
            if resp.status_code != 200 or resp.json().get("status") != "untriggered":
                raise RuntimeError(f"chatter webhook answered {resp.status_code}: {resp.text}")

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(count)))
        elapsed = time.perf_counter() - t0
    return {
        "messages": count, "ack_p50_ms": round(pct(acks, 0.5), 2), "ack_p99_ms": round(pct(acks, 0.99), 2),
        "throughput_msg_s": round(count / elapsed, 1),
    }  # fmt: skip


def child_main(conn: Any, fixtures: str, root: str) -> None:
    """Entry point of the load process (see the module docstring)."""
    import sys

    sys.path.insert(0, root)
    runners = {"closed": run_load, "open": run_open, "chatter": run_chatter}
    with timed_api_server(Path(fixtures)) as api:
        conn.send(("ready", api.base_url))
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                return
            kind, kwargs = msg
            try:
                conn.send(asyncio.run(runners[kind](api=api, fixtures=Path(fixtures), **kwargs)))
            except Exception as exc:  # report, keep serving
                conn.send({"error": repr(exc)})


class LoadProcess:
    """The driver's handle on the load process (a ``spawn``-ed child running :func:`child_main`).

    Args:
        fixtures: The recorded payloads directory (the OneBot event template).
        root: The repository root (put on the child's import path).

    Raises:
        RuntimeError: the child did not report ready within 60 s.
    """

    def __init__(self, fixtures: Path, root: Path) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=child_main, args=(child, str(fixtures), str(root)), daemon=True)
        self.proc.start()
        if not self.conn.poll(60):
            raise RuntimeError("the load process did not start")
        _, self.api_base = self.conn.recv()

    def run(self, kind: str, **kwargs: Any) -> dict[str, Any]:
        """Run a ``closed`` (:func:`run_load`) or ``open`` (:func:`run_open`) load; its figures.

        Raises:
            RuntimeError: the load failed in the child (its error text).
        """
        self.conn.send((kind, kwargs))
        out: dict[str, Any] = self.conn.recv()
        if "error" in out:
            raise RuntimeError(f"{kind} load {kwargs.get('tag')} failed: {out['error']}")
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(("stop",))
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()

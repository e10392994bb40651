"""Pieces of the session-host benchmark (tests/bench/bench_hosts.py) that need no HTTP load: a
runtime per configuration, SQL contexts seeded straight through the repository, waiting until no
host is starting, and the scale and activation phases (placements through the router shards).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.bench.procs import Roles, memory_mib, ray_roles
from tests.bench.stats import pct

__all__ = [
    "activation_phase",
    "host_totals",
    "runtime",
    "scale_phase",
    "seed_contexts",
    "session_key",
    "settle",
]


def session_key(user: int) -> str:
    """The session key of the bench bot's OneBot private chat with ``user``."""
    from tests.actors.edge_support import BOT_ID

    return f"onebot11:{BOT_ID}:private:{user}"


@contextlib.contextmanager
def runtime(tmp: Path, name: str, api_base: str, db_url: str | None = None, **knobs: Any) -> Iterator[Any]:
    """A started :class:`actors.placement.runtime.SessionRuntime` on its own SQLite file
    ``<tmp>/<name>.db`` (or on ``db_url``, e.g. a throw-away PostgreSQL schema) with the scripted
    model (tests/actors/session_scripts.py), the bench bot pointing at ``api_base`` and ``runtime``
    config ``knobs`` (``idle_ttl_s`` 3600 unless given); its own delivery pool. Yields once the
    ``min_hosts`` hosts answer and none is starting; stopped after."""
    from actors.placement.runtime import SessionRuntime
    from runtime.config import BotConfig, Config, DatabaseConfig, RuntimeConfig
    from tests.actors.edge_support import BOT_ID
    from tests.actors.session_scripts import ScriptedSetup

    config = Config(
        bots=[BotConfig(platform="onebot11", self_id=BOT_ID, api_base=api_base)],
        database=DatabaseConfig(url=db_url or f"sqlite:///{tmp}/{name}.db"),
        runtime=RuntimeConfig(**{"idle_ttl_s": 3600.0, **knobs}),
    )
    rt = SessionRuntime(prefix=f"bench-{name}-{uuid.uuid4().hex[:6]}")
    setup = ScriptedSetup(str(tmp / f"markers-{name}"))
    asyncio.run(rt.start(config, setup_factory=setup, wait_warm=True))
    try:
        settle(rt)
        yield rt
    finally:
        asyncio.run(rt.stop())


def settle(rt: Any, quiet_s: float = 1.5, timeout_s: float = 600.0) -> None:
    """Wait until the host supervisor starts no host and its host count stayed the same for
    ``quiet_s`` (longer than one health-loop period): a host starting (a process importing its
    stack, ≈ 1–2 s of CPU) must not run during a measured phase on a 2-core machine."""

    async def go() -> None:
        deadline = time.monotonic() + timeout_s
        last: tuple[int, int] | None = None
        since = time.monotonic()
        while time.monotonic() < deadline:
            st = await rt.hosts.status.remote()
            now = (int(st["hosts"]), int(st["starting"]))
            if now != last:
                last, since = now, time.monotonic()
            elif now[1] == 0 and time.monotonic() - since >= quiet_s:
                return
            await asyncio.sleep(0.25)

    asyncio.run(go())


def seed_contexts(db_url: str, keys: list[str], messages: int) -> float:
    """Give each of ``keys`` an active epoch holding ``messages`` messages (user / scripted
    assistant replies in turn) through :class:`runtime.memory.repository.ContextRepository`;
    returns the seconds it took."""
    from runtime.llm.types import AssistantMessage, TextContent, UserMessage
    from runtime.memory.db import Database
    from runtime.memory.repository import ContextRepository
    from tests.actors.session_scripts import reply_json

    def context(key: str) -> list[Any]:
        user = key.rsplit(":", 1)[1]
        return [
            UserMessage(content=f"seed message {i} of chat {user}", sender={"id": user, "name": f"u{user}"})
            if i % 2 == 0
            else AssistantMessage(
                content=[TextContent(text=reply_json(f"re: seed message {i - 1} of chat {user}"))],
                provider="script",
                model="script-model",
            )
            for i in range(messages)
        ]

    async def go() -> None:
        db = Database(db_url, threads=2)
        await asyncio.to_thread(db.create_tables)
        repo = ContextRepository(db)
        sem = asyncio.Semaphore(64)

        async def one(key: str) -> None:
            async with sem:
                sid = await repo.get_or_create_active(key, model="script/script-model")
                await repo.append_messages(sid, context(key))

        try:
            await asyncio.gather(*(one(k) for k in keys))
        finally:
            db.dispose()

    t0 = time.perf_counter()
    asyncio.run(go())
    return time.perf_counter() - t0


async def host_totals(rt: Any) -> dict[str, int]:
    """Sums of every ready host's ``status()`` counters (``live``, ``activated``, ``passivated``,
    ``accepted``, ``busy``, ``duplicate``, ``moved``) and ``hosts``."""
    hosts = await rt.hosts.hosts.remote()
    answers = await asyncio.gather(*(h["handle"].status.remote() for h in hosts))
    keys = ("live", "activated", "passivated", "accepted", "busy", "duplicate", "moved")
    return {"hosts": len(hosts), **{k: sum(int(a[k]) for a in answers) for k in keys}}


async def _place(rt: Any, key: str) -> float:
    """Place ``key`` through its router shard; returns the host's part of it (``load_ms``)."""
    res = await rt._router(key).place.remote(key)
    if res["status"] != "placed":
        raise RuntimeError(f"placing {key} answered {res}")
    return float(res.get("load_ms", 0.0))


async def activation_phase(rt: Any, keys: list[str]) -> dict[str, Any]:
    """Passivated → live: activate each of ``keys`` once and passivate it (its context then is in
    SQL only), then time, one key at a time, the router shard's ``place`` of each (driver →
    shard → host ``activate`` loading the context → back), passivating it again after.

    Returns:
        ``activation_p50_ms``, ``activation_p99_ms`` (driver → shard → host → back),
        ``host_p50_ms`` / ``host_p99_ms`` (the host's ``activate`` alone: room, SQL load, the
        new core), ``activations``, ``host_pids_before`` /
        ``host_pids_after`` (sorted), ``hosts_created`` (supervisor's count during the phase),
        ``no_process_created`` (pids equal and none created).
    """
    pids0 = sorted(p for p in await rt.hosts.host_pids.remote() if p)
    created0 = int((await rt.hosts.status.remote())["created"])
    for key in keys:
        await _place(rt, key)
        assert await rt.passivate(key), f"{key} was not passivated"
    lat, host_ms = [], []
    for key in keys:
        t0 = time.perf_counter()
        host_ms.append(await _place(rt, key))
        lat.append((time.perf_counter() - t0) * 1000)
        assert await rt.passivate(key), f"{key} was not passivated"
    pids1 = sorted(p for p in await rt.hosts.host_pids.remote() if p)
    created = int((await rt.hosts.status.remote())["created"]) - created0
    return {
        "activation_p50_ms": round(pct(lat, 0.5), 2),
        "activation_p99_ms": round(pct(lat, 0.99), 2),
        "host_p50_ms": round(pct(host_ms, 0.5), 2),
        "host_p99_ms": round(pct(host_ms, 0.99), 2),
        "activations": len(lat),
        "host_pids_before": pids0,
        "host_pids_after": pids1,
        "hosts_created": created,
        "no_process_created": pids0 == pids1 and created == 0,
    }


def _roles() -> Roles:
    return {**ray_roles(), "driver": [os.getpid()]}


async def scale_phase(rt: Any, keys: list[str], in_flight: int = 256) -> dict[str, Any]:
    """Memory of the topology with no live session, then with every one of ``keys`` live at once
    (placed through the router shards, ``in_flight`` placements at a time).

    Sums over: every ALIVE Ray actor process of this cluster (hosts, supervisor, router shards,
    delivery actors), Ray's own node processes (gcs_server, raylet, monitor, log_monitor) and this
    driver. ``mib_per_live_session`` = (USS total with the sessions − USS total without) /
    live sessions; the same of RSS as ``rss_mib_per_live_session``.

    Returns:
        ``sessions``, ``live_sessions_max`` (the hosts' own count), ``directory_live`` (the
        router shards'), ``activate_s``, ``activations_per_s``, ``memory_empty`` / ``memory_live``
        (:func:`tests.bench.procs.memory_mib`), ``mib_per_live_session``,
        ``rss_mib_per_live_session``, ``hosts``.
    """
    before = memory_mib(_roles())
    sem = asyncio.Semaphore(in_flight)

    async def one(key: str) -> None:
        async with sem:
            await _place(rt, key)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(k) for k in keys))
    activate_s = time.perf_counter() - t0
    totals = await host_totals(rt)
    status = await rt.status()
    await asyncio.sleep(2.0)  # let the hosts' sweep and allocator settle before reading memory
    after = memory_mib(_roles())
    live = max(totals["live"], 1)
    return {
        "sessions": len(keys),
        "live_sessions_max": totals["live"],
        "directory_live": status["live_sessions"],
        "hosts": totals["hosts"],
        "activate_s": round(activate_s, 2),
        "activations_per_s": round(len(keys) / activate_s, 1),
        "memory_empty": before,
        "memory_live": after,
        "mib_per_live_session": round((after["total"]["uss_mib"] - before["total"]["uss_mib"]) / live, 4),
        "rss_mib_per_live_session": round((after["total"]["rss_mib"] - before["total"]["rss_mib"]) / live, 4),
    }

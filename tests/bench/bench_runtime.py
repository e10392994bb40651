"""Benchmark of the actor runtime (docs/decisions.md#ops-benchmarks): webhook → platform-API latency
and throughput at 1, 20 and 100 sessions; warm vs cold activation; USS per live session vs a bare
actor; and the raw Ray floor measured in the same run (3-hop chain of bare async actors, and its
pipelined ceiling).

Everything is real: local Ray, the ingress (starlette + uvicorn over loopback HTTP), router, warm
pool, session actors, delivery actors, SQLite, and a local platform-API server. Only the model is
scripted (tests/actors/session_scripts.py: zero think time, reply ``re: <text>``).

Load model: ``n`` sessions (OneBot private chats) each send messages in a closed loop — the next
message only after the previous reply reached the platform API — so the offered load is ``n``
messages in flight. Each session first sends one unmeasured message (its activation; activation
is measured on its own). Latency = first byte of the webhook POST → the platform API receiving
the reply. A 503 (backpressure) is retried after 50 ms and the wait is part of the latency. The
load generator and the platform-API server run in a child process (tests/bench/load_client.py);
the driver hosts Ray and the ingress (uvicorn on uvloop, as ``sessionray serve``).

``SESSIONRAY_BENCH_QUICK=1`` runs fewer messages per load (CI smoke). Writes
``build/bench/runtime_latency.png`` (latency vs offered load; no matplotlib needed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PNG = ROOT / "build" / "bench" / "runtime_latency.png"
LOADS = (1, 20, 100)


def uss_mib(pid: int) -> float:
    """Unique set size of ``pid`` in MiB (the runtime's own measure, used for memory recycling)."""
    from actors.session_actor import process_uss_mib

    return process_uss_mib(pid)


# --------------------------------------------------------------------------- raw Ray floor


def _floor(n_seq: int, n_pipe: int) -> tuple[float, float, float]:
    """(p50 ms of an awaited 3-hop chain of bare async actors, pipelined msgs/s, bare actor USS MiB)."""
    import ray

    @ray.remote(num_cpus=0)
    class Hop:
        def __init__(self, nxt: Any = None) -> None:
            self.nxt = nxt

        async def hop(self, payload: dict[str, Any]) -> dict[str, Any]:
            if self.nxt is None:
                return payload
            return await self.nxt.hop.remote(payload)  # type: ignore[no-any-return]

        def pid(self) -> int:
            return os.getpid()

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
        sem = asyncio.Semaphore(64)

        async def one() -> None:
            async with sem:
                await a.hop.remote(payload)

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n_pipe)))
        return statistics.median(lat), n_pipe / (time.perf_counter() - t0)

    p50, ceiling = asyncio.run(go())
    pids = ray.get([h.pid.remote() for h in (a, b, c)])
    bare = statistics.mean(uss_mib(p) for p in pids)
    for h in (a, b, c):
        ray.kill(h)
    return p50, ceiling, bare


# --------------------------------------------------------------------------- load process


class _LoadProcess:
    """The load generator + timed platform-API server in a child process (tests/bench/load_client.py)."""

    def __init__(self, fixtures: Path) -> None:
        import multiprocessing

        from tests.bench.load_client import child_main

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=child_main, args=(child, str(fixtures), str(ROOT)), daemon=True)
        self.proc.start()
        if not self.conn.poll(60):
            raise RuntimeError("the load process did not start")
        _, self.api_base = self.conn.recv()

    def load(self, url: str, n: int, per_session: int, tag: str, between: Any = None) -> dict[str, Any]:
        """Warm-up message per session, then ``between()`` (in this process), then the measured load."""
        self.conn.send(("warm", url, n, tag))
        if "error" in (warm := self.conn.recv()):
            raise RuntimeError(f"warm-up of {n} sessions failed: {warm['error']}")
        if between is not None:
            between()
        self.conn.send(("load", url, n, per_session, tag, False))
        out: dict[str, Any] = self.conn.recv()
        if "error" in out:
            raise RuntimeError(f"load of {n} sessions failed: {out['error']}")
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(("stop",))
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()


def settle(rt: Any, timeout_s: float = 180.0) -> None:
    """Wait until the warm pool is full and no actor is being created: a pool refill (a cold
    actor importing its stack, ≈ 2 s of CPU each) must not run during a measured phase on a
    2-core machine. Activation is measured on its own (:func:`_activation`)."""

    async def go() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pool = (await rt.status())["pool"]
            if pool.get("warm", 0) >= pool.get("target", 0) and not pool.get("creating", 0):
                return
            await asyncio.sleep(0.25)

    asyncio.run(go())


# --------------------------------------------------------------------------- activation + memory


async def _activation(config: Any, setup: Any, delivery: Any, keys: list[str], n: int) -> tuple[float, float]:
    """(warm p50 ms: activate a pre-created blank SessionActor incl. loading from SQL,
    cold p50 ms: create the actor process + activate)."""
    import ray

    from actors.session_actor import SessionActor

    spare = [SessionActor.remote(config, setup, delivery) for _ in range(n)]  # type: ignore[attr-defined]
    await asyncio.gather(*(h.ping.remote() for h in spare))
    warm = []
    for h, key in zip(spare, keys, strict=False):
        t0 = time.perf_counter()
        await h.activate.remote(key)
        warm.append((time.perf_counter() - t0) * 1000)
    cold = []
    for key in keys[:n]:
        t0 = time.perf_counter()
        h = SessionActor.remote(config, setup, delivery)  # type: ignore[attr-defined]
        await h.activate.remote(key)
        cold.append((time.perf_counter() - t0) * 1000)
        ray.kill(h)
    for h in spare:
        ray.kill(h)
    return statistics.median(warm), statistics.median(cold)


_ROLES = (
    ("ray::SessionActor", "session actors"), ("ray::DeliveryActor", "delivery actors"),
    ("ray::RouterActor", "router"), ("ray::PoolSupervisor", "pool"), ("ray::", "other ray workers"),
    ("gcs_server", "ray system"), ("raylet", "ray system"), ("dashboard", "ray system"),
    ("ray/_private", "ray system"), ("ray/autoscaler", "ray system"),
)  # fmt: skip


def _cpu_ticks() -> dict[int, tuple[int, str]]:
    """CPU ticks (user + system) and command line of every process."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out[int(entry)] = (int(fields[11]) + int(fields[12]), cmd)
    return out


def cpu_by_role(
    before: dict[int, tuple[int, str]],
    after: dict[int, tuple[int, str]],
    messages: int,
    driver: int,
    load: int,
) -> dict[str, float]:
    """CPU milliseconds per message spent by each role between two :func:`_cpu_ticks` snapshots
    (the driver hosts the ingress; ``load`` is the load generator + platform-API process)."""
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    roles: dict[str, float] = {}
    for pid, (ticks, cmd) in after.items():
        spent = ticks - before.get(pid, (0, ""))[0]
        if spent <= 0:
            continue
        if pid in (driver, load):
            role = "ingress (driver)" if pid == driver else "load generator + platform API"
        else:
            role = next((name for key, name in _ROLES if key in cmd), "other processes")
        roles[role] = roles.get(role, 0.0) + spent * tick_ms / max(messages, 1)
    return {k: round(v, 2) for k, v in sorted(roles.items(), key=lambda kv: -kv[1])}


async def _live_uss(rt: Any, keys: list[str]) -> float:
    pids = []
    for key in keys:
        info = await rt.session(key)
        pid = (info.actor or {}).get("pid") if info is not None else None
        if pid:
            pids.append(int(pid))
    return statistics.mean(uss_mib(p) for p in pids) if pids else float("nan")


# --------------------------------------------------------------------------- main


def run() -> dict[str, Any]:
    """Run the benchmark; returns the ``runtime`` section of build/bench/results.json."""
    import ray

    from actors.ingress import build_app
    from actors.runtime import SessionRuntime
    from runtime.config import BotConfig, Config, DatabaseConfig, RuntimeConfig
    from tests.actors.edge_support import BOT_ID, serve_in_thread
    from tests.actors.session_scripts import ScriptedSetup
    from tests.bench.png_chart import line_chart

    quick = bool(os.environ.get("SESSIONRAY_BENCH_QUICK"))
    per_session = {1: 20, 20: 3, 100: 1} if quick else {1: 100, 20: 10, 100: 3}
    fixtures = Path(os.environ.get("SESSIONRAY_FIXTURES", ROOT / "tests" / "fixtures"))
    os.environ.setdefault("RAY_metrics_report_interval_ms", "10000")
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=8, include_dashboard=False, logging_level="error",
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # fmt: skip
    out: dict[str, Any] = {}
    try:
        floor_p50, ceiling, bare_uss = _floor(200 if not quick else 50, 2000 if not quick else 500)
        load = _LoadProcess(fixtures)
        with tempfile.TemporaryDirectory() as tmp:
            config = Config(
                bots=[BotConfig(platform="onebot11", self_id=BOT_ID, api_base=load.api_base)],
                database=DatabaseConfig(url=f"sqlite:///{tmp}/bench.db"),
                runtime=RuntimeConfig(router_shards=1, delivery_actors=2, warm_pool=8, max_live_sessions=24,
                                      mailbox_size=64, idle_ttl_s=600),
            )  # fmt: skip
            setup = ScriptedSetup(str(Path(tmp) / "markers"))
            rt = SessionRuntime(prefix=f"bench-{uuid.uuid4().hex[:6]}")
            asyncio.run(rt.start(config, setup_factory=setup, wait_warm=True))
            keys = [f"onebot11:{BOT_ID}:private:{500_000 + i}" for i in range(20)]
            try:
                by_load = []
                with serve_in_thread(build_app(rt, config), loop="uvloop") as url:
                    for n in LOADS:
                        marks: list[dict[int, tuple[int, str]]] = []

                        def between(marks: list[dict[int, tuple[int, str]]] = marks) -> None:
                            settle(rt)
                            marks.append(_cpu_ticks())

                        by_load.append(load.load(url, n, per_session[n], f"L{n}", between))
                        by_load[-1]["cpu_ms_per_msg"] = cpu_by_role(
                            marks[0], _cpu_ticks(), by_load[-1]["messages"], os.getpid(), load.proc.pid
                        )
                        if n == 20:  # the 20 sessions are live now (the 100-session load passivates some)
                            live_uss = asyncio.run(_live_uss(rt, keys))
                warm_ms, cold_ms = asyncio.run(
                    _activation(config, setup, rt.delivery, keys[10:], 3 if quick else 5)
                )
            finally:
                asyncio.run(rt.stop())
                load.close()
        one = by_load[0]
        best = max(by_load, key=lambda r: r["throughput_msg_s"])
        out = {
            "p50_ms": one["p50_ms"], "p99_ms": one["p99_ms"], "throughput_msg_s": best["throughput_msg_s"],
            "floor_chain_p50_ms": round(floor_p50, 2), "floor_ceiling_msg_s": round(ceiling, 1),
            "activation_warm_ms": round(warm_ms, 2), "activation_cold_ms": round(cold_ms, 1),
            "uss_live_session_mib": round(live_uss, 1), "uss_bare_actor_mib": round(bare_uss, 1),
            "sessions": {
                "p50_ms": one["sessions"], "p99_ms": one["sessions"], "throughput_msg_s": best["sessions"],
                "activation_warm_ms": 0, "activation_cold_ms": 0, "uss_live_session_mib": 20,
            },
            "by_load": by_load,
            "quick": quick,
        }  # fmt: skip
        out["ratios"] = {
            "p50_vs_floor": round(out["p50_ms"] / out["floor_chain_p50_ms"], 2),
            "throughput_vs_ceiling": round(out["throughput_msg_s"] / out["floor_ceiling_msg_s"], 3),
            "cold_vs_warm_activation": round(
                out["activation_cold_ms"] / max(out["activation_warm_ms"], 1e-6), 1
            ),
            "uss_live_vs_bare": round(out["uss_live_session_mib"] / out["uss_bare_actor_mib"], 2),
        }
        _print(out)
        legend = "blue: p50 ms, red: p99 ms, grey dashed: raw 3-hop chain p50 ms; x: sessions (closed loop)"
        line_chart(
            PNG, [r["sessions"] for r in by_load],
            {"p50": ([r["p50_ms"] for r in by_load], (30, 90, 200)),
             "p99": ([r["p99_ms"] for r in by_load], (200, 40, 40))},
            {"floor": (out["floor_chain_p50_ms"], (120, 120, 120))}, legend,
        )  # fmt: skip
        print(f"   wrote {PNG} ({legend})")
        return out
    finally:
        if started_ray:
            ray.shutdown()


def _print(out: dict[str, Any]) -> None:
    r = out["ratios"]
    rows = [
        ("sessions", "p50 ms", "p99 ms", "msg/s", "503s", "no reply", "ack p50"),
        *[(str(b["sessions"]), f"{b['p50_ms']:.1f}", f"{b['p99_ms']:.1f}", f"{b['throughput_msg_s']:.1f}",
           str(b["busy_503"]), str(b["lost"]), f"{b['webhook_ack_p50_ms']:.1f}") for b in out["by_load"]],
    ]  # fmt: skip
    print("   webhook → platform API (closed loop per session)")
    for row in rows:
        print("   " + "  ".join(f"{c:>9}" for c in row))
    best = max(out["by_load"], key=lambda b: b["throughput_msg_s"])
    cpu = best.get("cpu_ms_per_msg", {})
    print(f"   CPU ms per message at {best['sessions']} sessions (total {sum(cpu.values()):.1f}; 2 cores):")
    print("   " + ", ".join(f"{role} {ms:.1f}" for role, ms in cpu.items()))
    o = out
    targets = [
        ("p50 (1 session) vs raw 3-hop chain p50", f"{o['p50_ms']:.1f} / {o['floor_chain_p50_ms']:.1f} ms",
         f"{r['p50_vs_floor']:.2f}x", "<= 1.5x"),
        ("throughput vs raw pipelined ceiling",
         f"{o['throughput_msg_s']:.0f} / {o['floor_ceiling_msg_s']:.0f} msg/s",
         f"{r['throughput_vs_ceiling'] * 100:.0f}%", ">= 60%"),
        ("cold vs warm activation", f"{o['activation_cold_ms']:.0f} / {o['activation_warm_ms']:.1f} ms",
         f"{r['cold_vs_warm_activation']:.0f}x", ">= 50x"),
        ("USS live session vs bare actor",
         f"{o['uss_live_session_mib']:.1f} / {o['uss_bare_actor_mib']:.1f} MiB",
         f"{r['uss_live_vs_bare']:.2f}x", "<= 1.2x"),
    ]  # fmt: skip
    print("   figure                                      measured                 ratio    target")
    for name, measured, ratio, target in targets:
        print(f"   {name:<43} {measured:<24} {ratio:>7}  {target}")

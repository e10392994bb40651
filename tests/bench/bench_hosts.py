"""Benchmark of the session hosts and their message path (docs/decisions.md#ops-benchmarks).

Everything is real: local Ray, the ingress (starlette + uvicorn on uvloop over loopback HTTP, in
this driver as ``sessionray serve`` runs it), router shard, host supervisor, session hosts,
delivery actors, SQLite, and a local platform-API server. Only the model is scripted
(tests/actors/session_scripts.py: zero think time, reply ``re: <text>``). The load generator and
the platform-API server run in a child process (tests/bench/load_client.py); latency = first byte
of the webhook POST → the platform API receiving the reply, both stamped there. A 503 is retried
after 50 ms and the wait counts.

Phases, each on a runtime of its own (own SQLite file):

* **floor** — a bare 3-hop chain of async actors (p50) and its pipelined ceiling (tests/bench/ray_floor.py).
* **activation** — passivated → live with a 50-message context: the router shard's ``place`` timed
  one key at a time; the host pid set must not change.
* **scale** — N sessions (each a 20-message context seeded in SQL) live at once, placed through the
  router shard; memory of all processes with 0 and with N live (tests/bench/hosts_phases.py).
* **churn** — 1,000 chats over ``max_live_sessions: 100``, open loop at 50 msg/s, each message to
  a random chat (most need an activation, many an LRU passivation).
* **throughput** — closed loop at 1 / 20 / 100 sessions (one unmeasured message per session
  first, then the hosts settle), with CPU ms per message by role (``/proc/<pid>/stat``), then
  open loop over the 20 sessions at half their closed-loop throughput; for the production
  defaults (``packed``: ``sessions_per_host`` 2000) and for ``strict`` (``sessions_per_host: 1``).

``SESSIONRAY_BENCH_QUICK=1``: small figures for a CI smoke run. Writes
``build/bench/hosts_latency.png`` (latency vs closed-loop load, both modes).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bench.hosts_phases import (
    activation_phase,
    host_totals,
    runtime,
    scale_phase,
    seed_contexts,
    session_key,
    settle,
)
from tests.bench.procs import cpu_ms_per_msg, cpu_ticks, ray_roles

ROOT = Path(__file__).resolve().parents[2]
PNG = ROOT / "build" / "bench" / "hosts_latency.png"

FULL = {
    "loads": (1, 20, 100), "per_session": {1: 200, 20: 15, 100: 4}, "open_s": 20.0,
    "scale": 10_000, "activations": 300, "churn_chats": 1000, "churn_live": 100, "churn_msgs": 1500,
    "floor": (300, 3000),
}  # fmt: skip
QUICK = {
    "loads": (1, 4), "per_session": {1: 20, 4: 5}, "open_s": 2.0,
    "scale": 200, "activations": 20, "churn_chats": 30, "churn_live": 10, "churn_msgs": 30,
    "floor": (50, 300),
}  # fmt: skip
CHURN_RATE = 50.0
"""Offered load of the churn phase, msg/s."""
BASE = {"throughput": 500_000, "churn": 700_000, "scale": 800_000, "activation": 900_000}
"""First OneBot user id of each phase's chats."""


def measured(load: Any, kind: str, **kwargs: Any) -> dict[str, Any]:
    """``load.run(kind, **kwargs)`` plus ``cpu_ms_per_msg`` (CPU by role over the run: every Ray
    actor by role, Ray's own processes, this driver = the ingress, the load process) and ``hosts``
    (host processes alive at the start)."""
    roles = {**ray_roles(), "ingress (driver)": [os.getpid()], "load + platform API": [load.proc.pid]}
    pids = [pid for pids in roles.values() for pid in pids]
    before = cpu_ticks(pids)
    res = load.run(kind, **kwargs)
    res["cpu_ms_per_msg"] = cpu_ms_per_msg(roles, before, cpu_ticks(pids), res["messages"])
    res["hosts"] = len(roles.get("hosts", []))
    return res


def _throughput(load: Any, url: str, rt: Any, mode: str, p: dict[str, Any]) -> dict[str, Any]:
    """Closed-loop loads of ``p["loads"]`` sessions with CPU by role, then the open loop over the
    20 (or largest ≤ 20) sessions at half their closed-loop throughput."""
    by_load = []
    for n in p["loads"]:
        common = {"url": url, "base": BASE["throughput"], "n": n, "tag": f"{mode}{n}"}
        load.run("closed", per_session=0, warm=True, **common)  # activations: not measured
        settle(rt)
        by_load.append(measured(load, "closed", per_session=p["per_session"][n], warm=False, **common))
    ref = max((r for r in by_load if r["sessions"] <= 20), key=lambda r: r["sessions"])
    rate = ref["throughput_msg_s"] / 2
    opened = measured(
        load, "open", url=url, base=BASE["throughput"], n=ref["sessions"], rate=rate,
        count=max(10, math.ceil(rate * p["open_s"])), tag=f"{mode}open", seed=1,
    )  # fmt: skip
    return {"by_load": by_load, "open": opened}


def _ok(out: dict[str, Any], *names: str) -> bool:
    return all(name in out and "error" not in out[name] for name in names)


def _figures(out: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of ``out`` (flat; ``None`` where a phase failed)."""
    f: dict[str, Any] = {}
    if _ok(out, "scale"):
        f["live_sessions_max"] = out["scale"]["live_sessions_max"]
        f["mib_per_live_session"] = out["scale"]["mib_per_live_session"]
        f["activation_p50_ms"] = out["activation"]["activation_p50_ms"]
        f["activation_p99_ms"] = out["activation"]["activation_p99_ms"]
        f["activation_host_p50_ms"] = out["activation"]["host_p50_ms"]
        f["activation_host_p99_ms"] = out["activation"]["host_p99_ms"]
    if _ok(out, "churn"):
        f["churn_p50_ms"], f["churn_p99_ms"] = out["churn"]["p50_ms"], out["churn"]["p99_ms"]
    for mode, pre in (("packed", ""), ("strict", "strict_")):
        if not _ok(out, mode):
            continue
        rows = out[mode]["by_load"]
        at20 = next((r for r in rows if r["sessions"] == 20), None)
        f[f"{pre}p50_ms"], f[f"{pre}p99_ms"] = rows[0]["p50_ms"], rows[0]["p99_ms"]
        f[f"{pre}throughput_msg_s"] = max(r["throughput_msg_s"] for r in rows)
        f[f"{pre}throughput_msg_s_20"] = at20["throughput_msg_s"] if at20 else None
        f[f"{pre}open_p99_ms"] = out[mode]["open"]["p99_ms"]
    if _ok(out, "packed", "floor"):
        f["p50_vs_floor"] = round(f["p50_ms"] / out["floor"]["chain_p50_ms"], 2)
    return f


def _targets(f: dict[str, Any], out: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its measured figure and whether it is met (``None``: not measured)."""
    no_proc = out["activation"]["no_process_created"] if _ok(out, "scale") else None
    rows = [
        ("live sessions at once", f.get("live_sessions_max"), ">= 10000", lambda v: v >= 10_000),
        ("MiB per live session (USS)", f.get("mib_per_live_session"), "<= 0.5", lambda v: v <= 0.5),
        ("activation p99 ms (passivated → live)", f.get("activation_p99_ms"), "<= 10", lambda v: v <= 10),
        ("activation created no process", no_proc, "true", lambda v: v is True),
        ("churn p99 ms (1000 chats, cap 100, 50 msg/s)", f.get("churn_p99_ms"), "<= 100", lambda v: v <= 100),
        ("throughput msg/s at 20 sessions", f.get("throughput_msg_s_20"), ">= 170", lambda v: v >= 170),
        ("open loop p99 ms at half that", f.get("open_p99_ms"), "<= 50", lambda v: v <= 50),
        ("p50 at 1 session / 3-hop chain p50", f.get("p50_vs_floor"), "<= 1.5", lambda v: v <= 1.5),
    ]
    return [
        {"figure": name, "measured": v, "target": target, "met": None if v is None else bool(ok(v))}
        for name, v, target, ok in rows
    ]


def _phase(out: dict[str, Any], name: str, fn: Any) -> None:
    """``out[name] = fn()``; a failure is recorded as ``{"error": ...}`` and the run goes on. The
    phase's figures are printed as JSON when it ends (a long run shows its progress)."""
    t0 = time.perf_counter()
    try:
        out[name] = fn()
    except Exception as exc:
        out[name] = {"error": repr(exc)}
    print(f"   [{name} {time.perf_counter() - t0:.0f} s] {json.dumps(out[name], default=str)}", flush=True)


def run() -> dict[str, Any]:
    """Run the benchmark; returns the ``hosts`` section of build/bench/results.json."""
    import ray

    from actors.inbound.ingress import build_app
    from actors.placement.hosts.supervisor import host_capacity
    from runtime.config import RuntimeConfig
    from tests.actors.edge_support import serve_in_thread
    from tests.bench.load_client import LoadProcess
    from tests.bench.ray_floor import floor

    quick = bool(os.environ.get("SESSIONRAY_BENCH_QUICK"))
    p = QUICK if quick else FULL
    fixtures = Path(os.environ.get("SESSIONRAY_FIXTURES", ROOT / "tests" / "fixtures"))
    os.environ.setdefault("RAY_metrics_report_interval_ms", "10000")
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=8, include_dashboard=False, logging_level="error",
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # fmt: skip
    out: dict[str, Any] = {"quick": quick}
    load = LoadProcess(fixtures, ROOT)
    try:
        tmp_dir = tempfile.TemporaryDirectory()
        tmp = Path(tmp_dir.name)

        def floor_phase() -> dict[str, Any]:
            chain_p50, ceiling = floor(*p["floor"])
            return {"chain_p50_ms": round(chain_p50, 2), "ceiling_msg_s": round(ceiling, 1)}

        def scale() -> dict[str, Any]:
            n = p["scale"]
            scale_keys = [session_key(BASE["scale"] + i) for i in range(n)]
            act_keys = [session_key(BASE["activation"] + i) for i in range(p["activations"])]
            knobs = {"max_live_sessions": n + len(act_keys), "sessions_per_host": 2000}
            knobs["min_hosts"] = host_capacity(RuntimeConfig(**knobs))[1]  # a fixed topology
            seeded = seed_contexts(f"sqlite:///{tmp}/scale.db", scale_keys, 20)
            seeded += seed_contexts(f"sqlite:///{tmp}/scale.db", act_keys, 50)
            with runtime(tmp, "scale", load.api_base, **knobs) as rt:
                out["activation"] = asyncio.run(activation_phase(rt, act_keys))
                return {**asyncio.run(scale_phase(rt, scale_keys)), "seed_s": round(seeded, 1)}

        def churn() -> dict[str, Any]:
            with runtime(tmp, "churn", load.api_base, max_live_sessions=p["churn_live"]) as rt, \
                    serve_in_thread(build_app(rt, rt.config), loop="uvloop") as url:  # fmt: skip
                res = measured(
                    load, "open", url=url, base=BASE["churn"], n=p["churn_chats"], rate=CHURN_RATE,
                    count=p["churn_msgs"], tag="churn", seed=2,
                )  # fmt: skip
                return {**res, "max_live_sessions": p["churn_live"], **asyncio.run(host_totals(rt))}

        def throughput(mode: str, **knobs: Any) -> Any:
            def go() -> dict[str, Any]:
                with runtime(tmp, mode, load.api_base, **knobs) as rt, \
                        serve_in_thread(build_app(rt, rt.config), loop="uvloop") as url:  # fmt: skip
                    return _throughput(load, url, rt, mode, p)

            return go

        _phase(out, "floor", floor_phase)
        # packed: the production defaults (sessions_per_host 2000, max_live_sessions 10000)
        _phase(out, "packed", throughput("packed"))
        _phase(out, "scale", scale)
        _phase(out, "churn", churn)
        # strict: a process per session; two slots over the largest load, so the measured loads
        # never run at the host limit (where a new session evicts another)
        _phase(
            out, "strict", throughput("strict", sessions_per_host=1, max_live_sessions=max(p["loads"]) + 2)
        )
        tmp_dir.cleanup()
    finally:
        load.close()
        if started_ray:
            ray.shutdown()
    out["figures"] = _figures(out)
    out["targets"] = _targets(out["figures"], out)
    _print(out)
    _chart(out, p["loads"])
    return out


def _chart(out: dict[str, Any], loads: tuple[int, ...]) -> None:
    from tests.bench.png_chart import line_chart

    legend = (
        "x: sessions (closed loop); blue/red: p50/p99 ms packed (sessions_per_host 2000), "
        "green/orange: p50/p99 ms strict (sessions_per_host 1), grey dashed: raw 3-hop chain p50 ms"
    )
    series = {
        f"{mode} {q}": ([r[f"{q}_ms"] for r in out[mode]["by_load"]], color)
        for mode, q, color in (
            ("packed", "p50", (30, 90, 200)), ("packed", "p99", (200, 40, 40)),
            ("strict", "p50", (40, 160, 60)), ("strict", "p99", (230, 140, 20)),
        )
        if _ok(out, mode)
    }  # fmt: skip
    if not series or not _ok(out, "floor"):
        return
    line_chart(PNG, list(loads), series, {"floor": (out["floor"]["chain_p50_ms"], (120, 120, 120))}, legend)
    print(f"   wrote {PNG} ({legend})")


def _cpu_line(cpu: dict[str, float]) -> str:
    ranked = sorted(((r, ms) for r, ms in cpu.items() if r != "total"), key=lambda kv: -kv[1])
    return f"CPU ms/msg {cpu['total']:.2f}: " + ", ".join(f"{r} {ms:.2f}" for r, ms in ranked)


def _print(out: dict[str, Any]) -> None:
    for name in ("floor", "scale", "churn", "packed", "strict"):
        if not _ok(out, name):
            print(f"   {name}: FAILED {out.get(name, {}).get('error')}")
    if _ok(out, "floor"):
        fl = out["floor"]
        print(
            f"   raw Ray floor: 3-hop chain p50 {fl['chain_p50_ms']:.2f} ms, "
            f"pipelined {fl['ceiling_msg_s']:.0f} msg/s"
        )
    if _ok(out, "scale"):
        _print_scale(out["scale"], out["activation"])
    if _ok(out, "churn"):
        ch = out["churn"]
        print(
            f"   churn: {ch['chats']} chats over max_live_sessions {ch['max_live_sessions']}, "
            f"{ch['rate_msg_s']:.0f} msg/s open loop: p50 {ch['p50_ms']:.1f} ms, p99 {ch['p99_ms']:.1f} ms, "
            f"{ch['messages']} replies, {ch['busy_503']} 503s, {ch['lost']} lost, {ch['resent']} resent, "
            f"activations {ch['activated']}, passivations {ch['passivated']}, "
            f"send lag p99 {ch['send_lag_p99_ms']:.1f} ms"
        )
        print(f"   churn {_cpu_line(ch['cpu_ms_per_msg'])}")
    for mode in ("packed", "strict"):
        if _ok(out, mode):
            _print_mode(mode, out[mode])
    print("   figure                                            measured     target     met")
    for t in out["targets"]:
        met = "-" if t["met"] is None else ("yes" if t["met"] else "NO")
        print(f"   {t['figure']:<49} {t['measured']!s:<12} {t['target']:<10} {met}")


def _print_scale(sc: dict[str, Any], ac: dict[str, Any]) -> None:
    print(
        f"   activation (passivated → live, 50-message context, {ac['activations']} one at a time): "
        f"p50 {ac['activation_p50_ms']:.2f} ms, p99 {ac['activation_p99_ms']:.2f} ms (of it in the host: "
        f"p50 {ac['host_p50_ms']:.2f}, p99 {ac['host_p99_ms']:.2f}), hosts created "
        f"{ac['hosts_created']}, host pids unchanged {ac['host_pids_before'] == ac['host_pids_after']}"
    )
    print(
        f"   scale: {sc['live_sessions_max']} live on {sc['hosts']} hosts (router directory "
        f"{sc['directory_live']}), seeded in {sc['seed_s']} s, placed in {sc['activate_s']} s "
        f"({sc['activations_per_s']}/s)"
    )
    print("   memory (sum over processes)   procs   RSS MiB   USS MiB  |  with sessions: RSS MiB   USS MiB")
    for role, m in sc["memory_live"].items():
        e = sc["memory_empty"].get(role, {"processes": 0, "rss_mib": 0.0, "uss_mib": 0.0})
        print(
            f"   {role:<29} {m['processes']:>5} {e['rss_mib']:>9.1f} {e['uss_mib']:>9.1f}  |"
            f"  {m['rss_mib']:>22.1f} {m['uss_mib']:>9.1f}"
        )
    print(
        f"   per live session: USS {sc['mib_per_live_session']:.4f} MiB, "
        f"RSS {sc['rss_mib_per_live_session']:.4f} MiB"
    )


def _print_mode(mode: str, res: dict[str, Any]) -> None:
    print(f"   {mode}: webhook → platform API (closed loop per session)")
    head = ("sessions", "hosts", "p50 ms", "p99 ms", "msg/s", "503s", "lost", "ack p50")
    print("   " + "  ".join(f"{c:>8}" for c in head))
    for b in res["by_load"]:
        cells = (b["sessions"], b["hosts"], f"{b['p50_ms']:.1f}", f"{b['p99_ms']:.1f}",
                 f"{b['throughput_msg_s']:.1f}", b["busy_503"], b["lost"],
                 f"{b['webhook_ack_p50_ms']:.1f}")  # fmt: skip
        print("   " + "  ".join(f"{c!s:>8}" for c in cells))
    for b in res["by_load"]:
        print(f"   at {b['sessions']}: {_cpu_line(b['cpu_ms_per_msg'])}")
    o = res["open"]
    print(
        f"   open loop at {o['rate_msg_s']:.1f} msg/s over {o['chats']} sessions: "
        f"p50 {o['p50_ms']:.1f} ms, p99 {o['p99_ms']:.1f} ms, {o['messages']} replies, "
        f"{o['busy_503']} 503s, {o['lost']} lost"
    )
    print(f"   open loop {_cpu_line(o['cpu_ms_per_msg'])}")

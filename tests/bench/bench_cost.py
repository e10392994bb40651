"""Benchmark section ``cost``: what one message costs the runtime (docs/decisions.md#ops-benchmarks;
issue 30).

Same machinery as the ``hosts`` section (tests/bench/bench_hosts.py): real local Ray, the ingress in
this driver (starlette + uvicorn on uvloop over loopback HTTP), router shard, hosts, delivery
actors, the scripted model, and the load generator + platform-API stand-in in their own process
(tests/bench/load_client.py). Run once on SQLite and once on PostgreSQL (a throw-away schema on the
server of ``SESSIONRAY_TEST_PG_URL``, else the one scripts/test-deps.sh starts), each on a runtime
of its own with the defaults of ``make run`` on one machine, the single-machine profile
(``SINGLE_MACHINE_RUNTIME``: one host ahead of need, one delivery actor, and on SQLite a host
sends its chat's head reply itself; docs/decisions.md#ops-single-machine-profile), and a second
runtime of its own with the other ``runtime.deliver_in_host``:

* **p50 at one chat** (closed loop, one chat) over the p50 of the raw three-hop Ray chain
  measured right before and after it (tests/bench/ray_floor.py; their mean): ``p50_vs_chain``.
  Next to it the p50 of a bare path with the same legs as the delivery pool's path and none of
  the work (tests/bench/shape_floor.py): ``shape_p50_ms``,
  ``shape_vs_chain``, and per database ``work_ms`` (p50 minus the bare path: the runtime's own
  milliseconds on the path).
* **CPU per message at 20 chats** (closed loop), by process kind (``/proc/<pid>/stat`` ticks,
  tests/bench/procs.py): ``cpu_ms_per_message`` sums every runtime process (Ray actors by role,
  Ray's own processes, the driver = the ingress); the load generator and platform-API stand-in are
  excluded. Each database runs twice: the profile, and the profile with the other
  ``runtime.deliver_in_host`` (on for SQLite, off for PostgreSQL in the profile:
  docs/decisions.md#delivery-in-host); ``delivery_cpu_ms_per_reply`` is the delivery actors' share
  (one reply per message) in the run with it off — with it on, the hosts send most replies and
  that work is inside their CPU — and ``*_pool`` / ``*_in_host`` give both variants' figures.
* **chatter**: untriggered group messages (no mention: one ``im_transcripts`` row, no turn), 20
  webhooks in flight; ``chatter_cpu_ms_per_message`` over the same runtime processes.
* **idle**: ``idle_pss_mib``, ``idle_cores``, ``ready_s`` from ``tests.bench.idle.measure_idle``
  (``make run``'s instance idle; left out of a quick run: ``None`` with a note).

CPU per message is read from kernel tick counters (10 ms granularity summed over many messages):
less sensitive to other load on the machine than latency, but not immune (cache, frequency) —
compare runs on a quiet machine. ``SESSIONRAY_BENCH_QUICK=1``: small counts for a smoke run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runtime.config.sections import SINGLE_MACHINE_RUNTIME
from tests.bench.bench_hosts import measured
from tests.bench.hosts_phases import runtime, settle

ROOT = Path(__file__).resolve().parents[2]
FULL = {"one_chat": 200, "chats": 20, "per_chat": 50, "chatter": 3000, "floor": (300, 2000), "shape": 300}
QUICK = {"one_chat": 20, "chats": 4, "per_chat": 5, "chatter": 50, "floor": (50, 300), "shape": 20}
BASE = {"one": 610_000, "many": 620_000, "groups": 630_000, "shape": 640_000}
"""First OneBot user / group id of each phase's chats."""
IDLE_RUNS = 3
"""Runs of the idle measure whose medians are ``idle_pss_mib``, ``idle_cores`` and ``ready_s``."""
LOAD_ROLES = ("load + platform API",)
"""Process kinds that are not the runtime (excluded from ``cpu_ms_per_message``)."""
KEYS = (
    "cpu_ms_per_message", "delivery_cpu_ms_per_reply", "chatter_cpu_ms_per_message",
    "idle_pss_mib", "idle_cores", "ready_s", "p50_vs_chain",
)  # fmt: skip
TARGETS = {
    "cpu_ms_per_message": 12.0, "delivery_cpu_ms_per_reply": 3.0, "chatter_cpu_ms_per_message": 1.0,
    "idle_pss_mib": 700.0, "idle_cores": 0.03, "ready_s": 8.0, "p50_vs_chain": 1.5,
}  # fmt: skip
"""Issue 30's ceiling of each figure (every one is "at most")."""


def runtime_cpu(cpu: dict[str, float]) -> dict[str, float]:
    """``cpu`` (:func:`tests.bench.procs.cpu_ms_per_msg`) without the load roles, ``total`` recomputed
    over the runtime's processes only."""
    own = {r: ms for r, ms in cpu.items() if r != "total" and r not in LOAD_ROLES}
    return {**own, "total": round(sum(own.values()), 2)}


@contextmanager
def _postgres() -> Iterator[str | None]:
    """A throw-away schema on the test PostgreSQL server (dropped after); None when there is none."""
    from tests.memory.pg_schema import create_schema, drop_schema, find_or_start_postgres

    url, why = find_or_start_postgres()
    if url is None:
        print(f"   no PostgreSQL: {why}", flush=True)
        yield None
        return
    schema_url, schema = create_schema(url, prefix="bench_cost")
    try:
        yield schema_url
    finally:
        drop_schema(url, schema)


def _one_db(
    load: Any, tmp: Path, name: str, db_url: str | None, p: dict[str, Any], *, in_host: bool = True
) -> dict[str, Any]:
    """The loads on a fresh runtime over ``db_url`` (None: SQLite under ``tmp``) with the
    single-machine profile's keys and ``runtime.deliver_in_host`` = ``in_host``: one chat (with
    the raw chain measured right before and after it, ``chain_p50_ms`` their mean: the VM's speed
    moves within minutes), 20 chats, and chatter (only with ``in_host`` = the profile's value for
    this database, else None)."""
    from actors.inbound.ingress import build_app
    from tests.actors.edge_support import serve_in_thread
    from tests.bench.ray_floor import floor

    knobs = {**SINGLE_MACHINE_RUNTIME, "deliver_in_host": in_host}
    assert set(knobs) == set(SINGLE_MACHINE_RUNTIME)
    with runtime(tmp, name, load.api_base, db_url=db_url, **knobs) as rt, \
            serve_in_thread(build_app(rt, rt.config), loop="uvloop") as url:  # fmt: skip
        common = {"url": url, "warm": False}
        for base, n in ((BASE["one"], 1), (BASE["many"], p["chats"])):  # activations: not measured
            load.run("closed", url=url, base=base, n=n, per_session=0, tag=f"{name}w{n}", warm=True)
        settle(rt)
        before = floor(p["floor"][0], 10)[0]
        one = load.run("closed", base=BASE["one"], n=1, per_session=p["one_chat"], tag=f"{name}1", **common)
        after = floor(p["floor"][0], 10)[0]
        n, k = p["chats"], p["per_chat"]
        many = measured(load, "closed", base=BASE["many"], n=n, per_session=k, tag=f"{name}n", **common)
        chatter = None
        if in_host == _profile_in_host(db_url):
            chatter = measured(
                load, "chatter", url=url, base=BASE["groups"], n=n, count=p["chatter"], tag=name
            )
    chain = round((before + after) / 2, 2)
    return {"one_chat": one, "chain_p50_ms": chain, "many": many, "chatter": chatter}


def _profile_in_host(db_url: str | None) -> bool:
    """``runtime.deliver_in_host`` of the single-machine profile on ``db_url`` (None: SQLite)."""
    from runtime.config import RuntimeConfig

    return RuntimeConfig().single_machine(db_url).deliver_in_host


def _idle(quick: bool) -> dict[str, Any]:
    """:func:`tests.bench.idle.measure_idle` of ``make run``'s instance, the median of
    :data:`IDLE_RUNS` runs (a ``sessionray serve`` of its own each, about a minute: one run's
    ``ready_s`` moved by 2 s between runs on one machine); a quick run (the test suite's smoke)
    leaves it out: ``None`` figures with the reason."""
    if quick:
        return {"idle_pss_mib": None, "idle_cores": None, "ready_s": None,
                "note": "quick run: not measured (python -m tests.bench.idle)"}  # fmt: skip
    from tests.bench.idle import measure_idle

    res = measure_idle(runs=IDLE_RUNS)
    return {k: res.get(k) for k in ("idle_pss_mib", "idle_cores", "ready_s")} | {"detail": res}


def _trace_table() -> list[Any] | None:
    """The per-step p50/p99 table (:func:`tests.bench.trace_table.step_table`) of the spans in
    ``$SESSIONRAY_BENCH_SPANS_DIR`` (a traced run's ``tracing.spans_dir``); ``None`` when it is not
    set: the cost loads run with tracing off, so their CPU figures are the untraced cost."""
    spans_dir = os.environ.get("SESSIONRAY_BENCH_SPANS_DIR")
    if not spans_dir:
        return None
    from runtime.tracing.records import read_spans
    from tests.bench.trace_table import step_table

    return step_table(read_spans(spans_dir))


def _figures(
    res: dict[str, Any], other: dict[str, Any], in_host: bool, shape_p50: float, idle: dict[str, Any]
) -> dict[str, Any]:
    """The figures of one database: ``res`` from the single-machine profile (its
    ``deliver_in_host`` = ``in_host``), ``other`` from the same with the other value
    (:func:`_one_db`). ``delivery_cpu_ms_per_reply`` is the delivery actors' CPU of the run with
    ``deliver_in_host`` off (with it on, the hosts send most replies and that work is inside
    their CPU); ``*_pool`` / ``*_in_host``: each variant's p50 ratio and CPU."""
    pool, hosts = (other, res) if in_host else (res, other)
    many_cpu = runtime_cpu(res["many"]["cpu_ms_per_msg"])
    chat_cpu = runtime_cpu(res["chatter"]["cpu_ms_per_msg"])
    pool_cpu = runtime_cpu(pool["many"]["cpu_ms_per_msg"])
    host_cpu = runtime_cpu(hosts["many"]["cpu_ms_per_msg"])
    return {
        "cpu_ms_per_message": many_cpu["total"],
        "delivery_cpu_ms_per_reply": pool_cpu.get("delivery", 0.0),
        "chatter_cpu_ms_per_message": chat_cpu["total"],
        "idle_pss_mib": idle.get("idle_pss_mib"),
        "idle_cores": idle.get("idle_cores"),
        "ready_s": idle.get("ready_s"),
        "p50_vs_chain": round(res["one_chat"]["p50_ms"] / res["chain_p50_ms"], 2),
        "deliver_in_host": in_host,
        "p50_ms": res["one_chat"]["p50_ms"],
        "chain_around_p50_ms": res["chain_p50_ms"],
        "work_ms": round(res["one_chat"]["p50_ms"] - shape_p50, 2),
        "cpu_by_kind": many_cpu,
        "chatter_cpu_by_kind": chat_cpu,
        "throughput_msg_s_20": res["many"]["throughput_msg_s"],
        "p50_vs_chain_pool": round(pool["one_chat"]["p50_ms"] / pool["chain_p50_ms"], 2),
        "p50_vs_chain_in_host": round(hosts["one_chat"]["p50_ms"] / hosts["chain_p50_ms"], 2),
        "cpu_ms_per_message_pool": pool_cpu["total"],
        "cpu_ms_per_message_in_host": host_cpu["total"],
        "throughput_msg_s_20_pool": pool["many"]["throughput_msg_s"],
        "throughput_msg_s_20_in_host": hosts["many"]["throughput_msg_s"],
        "cpu_by_kind_pool": pool_cpu,
    }


def run() -> dict[str, Any]:
    """Run the section; returns ``cost`` of build/bench/results.json: the :data:`KEYS` (SQLite),
    the same under ``postgres``, ``chain_p50_ms``, ``shape_p50_ms``, ``shape_vs_chain``,
    ``detail`` (every load's raw figures) and ``trace_table`` (:func:`_trace_table`)."""
    import ray

    from tests.bench.load_client import LoadProcess
    from tests.bench.ray_floor import floor
    from tests.bench.shape_floor import shape_p50

    quick = bool(os.environ.get("SESSIONRAY_BENCH_QUICK"))
    p = QUICK if quick else FULL
    fixtures = Path(os.environ.get("SESSIONRAY_FIXTURES", ROOT / "tests" / "fixtures"))
    os.environ.setdefault("RAY_metrics_report_interval_ms", "10000")
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=8, include_dashboard=False, logging_level="error",
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # fmt: skip
    load = LoadProcess(fixtures, ROOT)
    try:
        chain_p50 = round(floor(*p["floor"])[0], 2)
        shape = round(shape_p50(load, BASE["shape"], p["shape"]), 2)
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            mine = _profile_in_host(None)  # each run on a database of its own (a file, a schema)
            sqlite = _one_db(load, tmp, "cost-sqlite", None, p, in_host=mine)
            sqlite_other = _one_db(load, tmp, "cost-sqlite-other", None, p, in_host=not mine)
            pg = pg_other = None
            pg_in_host = False
            with _postgres() as pg_url:
                if pg_url:
                    pg_in_host = _profile_in_host(pg_url)
                    pg = _one_db(load, tmp, "cost-pg", pg_url, p, in_host=pg_in_host)
            with _postgres() as pg_url:
                if pg_url:
                    pg_other = _one_db(load, tmp, "cost-pg-other", pg_url, p, in_host=not pg_in_host)
    finally:
        load.close()
        if started_ray:
            ray.shutdown()
    idle = _idle(quick)
    out: dict[str, Any] = {
        "quick": quick, "chain_p50_ms": chain_p50, "shape_p50_ms": shape,
        "shape_vs_chain": round(shape / chain_p50, 2),
    }  # fmt: skip
    out |= _figures(sqlite, sqlite_other, _profile_in_host(None), shape, idle)
    out["postgres"] = (
        _figures(pg, pg_other, pg_in_host, shape, idle) if pg and pg_other else {k: None for k in KEYS}
    )
    out["detail"] = {
        "sqlite": sqlite, "postgres": pg, "sqlite_other": sqlite_other, "postgres_other": pg_other,
        "idle": idle,
    }  # fmt: skip
    out["trace_table"] = _trace_table()
    _print(out)
    return out


def _met(key: str, v: Any) -> str:
    return "-" if v is None else ("yes" if v <= TARGETS[key] else "NO")


def _print(out: dict[str, Any]) -> None:
    pg = out["postgres"]
    chain, shape = out["chain_p50_ms"], out["shape_p50_ms"]
    print(f"   raw 3-hop Ray chain p50 {chain:.2f} ms")
    left = TARGETS["p50_vs_chain"] * chain - shape
    print(
        f"   bare path of the message's shape (HTTP, Ray call, Ray notify, HTTP; no work) p50 {shape:.2f} ms"
        f" = {out['shape_vs_chain']}x the chain: a p50 of 1.5x leaves {left:.2f} ms for the runtime's work"
    )
    print("   figure                          SQLite     PostgreSQL  target   met (SQLite/PG)")
    for k in KEYS:
        a, b = out[k], pg.get(k)
        print(f"   {k:<30} {a!s:<10} {b!s:<11} <= {TARGETS[k]:<5} {_met(k, a)}/{_met(k, b)}")
    print("   CPU ms per message by process kind (20 chats closed loop | chatter):")
    for label, fig in (("SQLite", out), ("PostgreSQL", pg)):
        if fig.get("cpu_by_kind") is None:
            continue
        kinds = sorted(set(fig["cpu_by_kind"]) | set(fig["chatter_cpu_by_kind"]), key=lambda r: r == "total")
        many, chat = fig["cpu_by_kind"], fig["chatter_cpu_by_kind"]
        cells = ", ".join(f"{r} {many.get(r, 0.0):.2f} | {chat.get(r, 0.0):.2f}" for r in kinds)
        print(f"   {label}: {cells}")
        print(
            f"   {label}: p50 one chat {fig['p50_ms']:.2f} ms over the chain around it"
            f" {fig['chain_around_p50_ms']:.2f} ms (the runtime's work {fig['work_ms']:.2f} ms),"
            f" {fig['throughput_msg_s_20']} msg/s at 20"
        )
        print(
            f"   {label} (deliver_in_host {fig['deliver_in_host']} in the profile), hosts sending / through"
            f" the delivery actor: p50 at one chat {fig['p50_vs_chain_in_host']}x /"
            f" {fig['p50_vs_chain_pool']}x its chain; CPU a message {fig['cpu_ms_per_message_in_host']:.2f} /"
            f" {fig['cpu_ms_per_message_pool']:.2f} ms; msg/s at 20 {fig['throughput_msg_s_20_in_host']} /"
            f" {fig['throughput_msg_s_20_pool']}"
        )
    if out["detail"]["idle"].get("note"):
        print(f"   idle: {out['detail']['idle']['note']}")
    if out["trace_table"] is not None:
        print(out["trace_table"])

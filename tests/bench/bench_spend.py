"""Benchmark of what a hot group costs and how fast it is answered: the context budget and hot-chat
coalescing (docs/decisions.md#agent-context-budget, docs/decisions.md#session-hot-chat-coalescing).

Everything is real (local Ray, router shard, session host, delivery actor, SQLite, the real
``ConfigSetupFactory`` with the default ``ai.agent.context_budget_tokens``) except the model: the
loopback OpenAI-compatible stand-in (tests/spend/openai_standin.py) streams each answer over
``MODEL_S`` seconds and reports usage (⌈body bytes / 4⌉ prompt tokens). Its answer names the
questions the call answered (tests/bench/spend_load.py), so each mention's reply is found at the
platform-API server.

One run per mode, each on a runtime of its own: ``coalesced`` (``ai.agent.coalesce`` defaults: on
for groups) and ``uncoalesced`` (``coalesce: {groups: false}``). The hot group starts with
``SEED_MESSAGES`` messages of history in SQL (more than the budget holds); after one warm-up
mention, ``RATE`` mentions/s arrive for ``SECONDS`` s (open loop, each from its own sender) plus
``BACKGROUND_RATE`` mentions/s spread over ten other groups.

Figures (hot group only):

* ``llm_calls_per_mention`` — the stand-in's calls of the hot group / mentions offered;
* ``request_bytes_p50/p99/max`` — request body sizes the stand-in received; ``request_tokens_max``
  is the largest in the stand-in's token count, to compare with ``budget_tokens``;
* ``hot_overhead_p50/p99_ms`` — reply time (mention due → the reply naming it reaches the
  platform API) minus the model's ``MODEL_S``; a mention never named by a reply is ``unanswered``
  (the coalescing queue's overflow gets the busy notice instead: ``busy_notices``).

``SESSIONRAY_BENCH_QUICK=1``: a shorter load for a smoke run.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tests.bench.stats import pct

ROOT = Path(__file__).resolve().parents[2]
MODEL_S = 1.5
RATE = 3.5
"""Hot-group mentions per second."""
BACKGROUND_RATE = 1.0
"""Background mentions per second (spread over ten other groups)."""
SECONDS = 30.0
SEED_MESSAGES = 240
DRAIN_S = 60.0
"""How long after the last mention replies are waited for."""
_TAG = re.compile(r"#q(\d+)\b")


def _ai(alias: str, base_url: str, coalesce: bool) -> dict[str, Any]:
    agent: dict[str, Any] = {"output_schema": False}
    if not coalesce:
        agent["coalesce"] = {"groups": False}
    provider = {"api": "openai-completions", "base_url": base_url, "models": [{"id": "m1"}]}
    return {"providers": {alias: provider}, "default_model": f"{alias}/m1", "agent": agent}


async def _until_answered(api: Any, tags: set[int], group: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        named = {int(t) for _, g, text in list(api.arrivals) if g == group for t in _TAG.findall(text)}
        if tags <= named:
            return
        await asyncio.sleep(0.1)


def _mode(fixtures: Path, coalesce: bool, seconds: float) -> dict[str, Any]:
    """One mode's run on a runtime of its own; its figures."""
    from runtime.config.ai import DEFAULT_CONTEXT_BUDGET_TOKENS
    from tests.bench.spend_load import HOT_GROUP, Answers, arrival_server, hot_runtime, offer
    from tests.spend.openai_standin import OpenAIStandin

    answers = Answers()
    alias = f"bench{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp, arrival_server(fixtures) as api, OpenAIStandin(
        stream_s=MODEL_S, chunks=6, answer=answers
    ) as standin:  # fmt: skip
        ai = _ai(alias, standin.base_url, coalesce)
        with hot_runtime(Path(tmp), api.base_url, ai, SEED_MESSAGES) as rt:

            async def go() -> Any:
                warm = await offer(rt, rate=1.0, seconds=1.0, background_rate=0.0, first_tag=0)
                await _until_answered(api, set(warm.due), HOT_GROUP, DRAIN_S)  # activation, calibration
                start = len(answers.snapshot())
                arrivals = len(api.arrivals)
                res = await offer(
                    rt, rate=RATE, seconds=seconds, background_rate=BACKGROUND_RATE, first_tag=1000
                )
                await _until_answered(api, set(res.due), HOT_GROUP, DRAIN_S)
                return res, answers.snapshot()[start:], list(api.arrivals)[arrivals:]

            offered, calls, arrivals = asyncio.run(go())
    return _figures(offered, calls, arrivals, DEFAULT_CONTEXT_BUDGET_TOKENS)


def _figures(
    offered: Any, calls: list[Any], arrivals: list[tuple[float, str, str]], budget: int
) -> dict[str, Any]:
    """One mode's figures from what was offered, the hot group's calls and the group sends."""
    from tests.bench.spend_load import HOT_GROUP

    first: dict[int, float] = {}
    busy_notices = 0
    for t, group, text in arrivals:
        if group != HOT_GROUP:
            continue
        tags = [int(x) for x in _TAG.findall(text)]
        busy_notices += not tags
        for tag in tags:
            first.setdefault(tag, t)
    over = [(first[tag] - due - MODEL_S) * 1000 for tag, due in offered.due.items() if tag in first]
    sizes = [c.size for c in calls]
    mentions = len(offered.due)
    return {
        "mentions": mentions,
        "answered": len(over),
        "unanswered": mentions - len(over),
        "busy_notices": busy_notices,
        "busy_retries": offered.busy,
        "llm_calls": len(calls),
        "llm_calls_per_mention": round(len(calls) / max(mentions, 1), 3),
        "mentions_per_call_max": max((len(c.tags) for c in calls), default=0),
        "request_bytes_p50": pct(sizes, 0.5),
        "request_bytes_p99": pct(sizes, 0.99),
        "request_bytes_max": max(sizes, default=0),
        "request_tokens_max": math.ceil(max(sizes, default=0) / 4),
        "budget_tokens": budget,
        "hot_overhead_p50_ms": round(pct(over, 0.5), 1),
        "hot_overhead_p99_ms": round(pct(over, 0.99), 1),
        "hot_overhead_max_ms": round(max(over, default=float("nan")), 1),
    }


def run() -> dict[str, Any]:
    """Run both modes; returns the ``spend`` section of build/bench/results.json."""
    import ray

    quick = bool(os.environ.get("SESSIONRAY_BENCH_QUICK"))
    seconds = 8.0 if quick else SECONDS
    fixtures = Path(os.environ.get("SESSIONRAY_FIXTURES", ROOT / "tests" / "fixtures"))
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=8, include_dashboard=False, logging_level="error",
                 runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})  # fmt: skip
    try:
        co = _mode(fixtures, True, seconds)
        un = _mode(fixtures, False, seconds)
    finally:
        if started_ray:
            ray.shutdown()
    out: dict[str, Any] = {"quick": quick, "rate_mentions_s": RATE, "model_s": MODEL_S, "seconds": seconds}
    out |= {k: co[k] for k in ("hot_overhead_p50_ms", "hot_overhead_p99_ms", "llm_calls_per_mention")}
    out |= {k: co[k] for k in ("request_bytes_p50", "request_bytes_p99", "request_bytes_max")}
    out |= {"budget_tokens": co["budget_tokens"], "request_tokens_max": co["request_tokens_max"]}
    out |= {f"{k}_uncoalesced": un[k] for k in ("hot_overhead_p50_ms", "hot_overhead_p99_ms")}
    out |= {
        f"{k}_uncoalesced": un[k] for k in ("llm_calls_per_mention", "request_bytes_p99", "request_bytes_max")
    }
    out |= {"coalesced": co, "uncoalesced": un, "cpus": os.cpu_count()}
    _print(out)
    return out


def _print(out: dict[str, Any]) -> None:
    co, un = out["coalesced"], out["uncoalesced"]
    print(
        f"   hot group: {out['rate_mentions_s']} mentions/s for {out['seconds']:.0f} s, "
        f"model {out['model_s']} s, context budget {out['budget_tokens']} tokens"
    )
    print(f"   {'figure':<34} {'coalesced':>12} {'uncoalesced':>12}")
    for key in (
        "mentions", "answered", "unanswered", "busy_notices", "busy_retries", "llm_calls",
        "llm_calls_per_mention", "mentions_per_call_max", "request_bytes_p50", "request_bytes_p99",
        "request_bytes_max", "request_tokens_max", "hot_overhead_p50_ms", "hot_overhead_p99_ms",
        "hot_overhead_max_ms",
    ):  # fmt: skip
        print(f"   {key:<34} {co[key]!s:>12} {un[key]!s:>12}")
    within = max(co["request_tokens_max"], un["request_tokens_max"]) <= out["budget_tokens"]
    met = co["hot_overhead_p99_ms"] <= 3000
    print(f"   every request within the budget (stand-in's token count): {'yes' if within else 'NO'}")
    print(f"   hot p99 overhead <= 3000 ms with coalescing: {'yes' if met else 'NO'}")

"""What the usage ledger costs an LLM call, and what a quota check costs a turn
(docs/decisions.md#spend-ledger, docs/decisions.md#spend-quotas).

A faux call streaming 8 text chunks is made ``CALLS`` times with no usage observer, then with the
usage ledger installed on SQLite and on PostgreSQL (its row committed before the call ends). The
difference of the medians is the per-call cost of recording. Then the ledger is filled with
``ROWS`` rows of 50 users over 30 days and one user's daily-quota check (one indexed range sum)
is timed ``CHECKS`` times. Figures in ms, measured from the calling coroutine (thread hops
included). PostgreSQL: ``SESSIONRAY_TEST_PG_URL`` or ``scripts/test-deps.sh``; unreachable: printed.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from typing import Any

from providers.faux import faux_assistant_message, faux_text, register_faux_provider
from runtime.config.spend import SpendConfig
from runtime.llm.attribution import CallAttribution, attributed
from runtime.llm.stream import complete
from runtime.llm.types import Context, Usage, UserMessage
from runtime.llm.usage import remove_usage_observer
from runtime.memory import Database
from runtime.spend.ledger import install_ledger, write_usage
from runtime.spend.quotas import Quotas
from tests.bench.stats import pct
from tests.memory.pg_schema import create_schema, drop_schema, find_or_start_postgres

CALLS = 300
ROWS = 50_000
CHECKS = 200
OWNER = CallAttribution(bot_id="10001", session_key="onebot11:10001:group:5", user_id="u7", turn_id="m1")


async def _calls() -> list[float]:
    msg = faux_assistant_message([faux_text("x" * 32)])
    msg.usage = Usage(input=1200, output=80)
    model = register_faux_provider(provider="bench-ledger", default_response=msg, chunk_size=4).get_model()
    ctx = Context(messages=[UserMessage(content="hi")])
    out: list[float] = []
    with attributed(OWNER):
        for _ in range(CALLS):
            t0 = time.perf_counter()
            await complete(model, ctx)
            out.append((time.perf_counter() - t0) * 1000)
    return out


def _fill(db: Database) -> None:
    rnd = random.Random(7)
    now = int(time.time() * 1000)
    rows: list[dict[str, Any]] = []
    for i in range(ROWS):
        rows.append(
            {
                "ts": now - rnd.randrange(30 * 86_400_000),
                "bot_id": "10001",
                "session_key": f"onebot11:10001:group:{i % 200}",
                "user_id": f"u{i % 50}",
                "model": "p/m",
                "api": "faux",
                "session_id": "",
                "turn_id": "",
                "reason": "turn",
                "input_tokens": 1000,
                "output_tokens": 50,
                "cache_read_tokens": 0,
                "cache_write_tokens": 0,
                "cost_usd": 0.001,
                "master": False,
            }
        )
        if len(rows) == 5000:
            write_usage(db, rows)
            rows = []


async def _measure(url: str) -> dict[str, Any]:
    db = Database(url)
    db.create_tables()
    ledger = install_ledger(db)
    try:
        with_ledger = await _calls()
        remove_usage_observer(ledger)
        without = await _calls()
        await db.run(lambda: _fill(db))
        quotas = Quotas(
            SpendConfig.model_validate({"quotas": [{"scope": "user", "window": "day", "tokens": 10**9}]})
        )
        checks: list[float] = []
        for _ in range(CHECKS):
            t0 = time.perf_counter()
            assert await quotas.check(db, OWNER) is None
            checks.append((time.perf_counter() - t0) * 1000)
        p50_on, p50_off = pct(with_ledger, 0.5), pct(without, 0.5)
        return {
            "call_p50_ms_without_ledger": round(p50_off, 3),
            "call_p50_ms_with_ledger": round(p50_on, 3),
            "call_p99_ms_with_ledger": round(pct(with_ledger, 0.99), 3),
            "ledger_overhead_p50_ms": round(p50_on - p50_off, 3),
            "quota_check_p50_ms": round(pct(checks, 0.5), 3),
            "quota_check_p99_ms": round(pct(checks, 0.99), 3),
            "ledger_rows": ROWS + CALLS,
        }
    finally:
        remove_usage_observer(ledger)
        db.dispose()


def run() -> dict[str, Any]:
    """Measure both backends, print a table, return ``{"sqlite": {...}, "postgresql": {...}}``."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = asyncio.run(_measure(f"sqlite:///{tmp}/bench.db"))
    pg_url, how = find_or_start_postgres()
    if pg_url is None:
        results["postgresql"] = {"error": how}
    else:
        url, schema = create_schema(pg_url, prefix="bench")
        try:
            results["postgresql"] = asyncio.run(_measure(url))
        finally:
            drop_schema(pg_url, schema)
    print(
        f"   usage ledger: a faux call of 8 chunks ({CALLS} calls), a daily-quota check over {ROWS} rows (ms)"
    )
    print(
        f"   {'backend':<11} {'call p50 off':>12} {'call p50 on':>11} {'overhead':>9} "
        f"{'check p50':>9} {'check p99':>9}"
    )
    for name, r in results.items():
        if "error" in r:
            print(f"   {name:<11} NOT MEASURED: {r['error']}")
            continue
        print(
            f"   {name:<11} {r['call_p50_ms_without_ledger']:>12.3f} {r['call_p50_ms_with_ledger']:>11.3f} "
            f"{r['ledger_overhead_p50_ms']:>9.3f} {r['quota_check_p50_ms']:>9.3f} "
            f"{r['quota_check_p99_ms']:>9.3f}"
        )
    return results


if __name__ == "__main__":
    run()

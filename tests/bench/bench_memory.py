"""Session memory latency: ``append_messages`` and ``load_context`` on SQLite and PostgreSQL.

A session of 200 messages (user/assistant turns of ~200 characters) is built with one
``append_messages`` call per message (200 append samples); then its context is loaded 100 times
(each load decodes all 200 messages). Figures are p50/p99 in ms, measured from the calling
coroutine (thread hop included). SQLite uses a file in a temporary directory; PostgreSQL uses
``SESSIONRAY_TEST_PG_URL`` or the local cluster of ``scripts/test-deps.sh`` (a fresh schema, dropped
afterwards). If PostgreSQL is unreachable that is printed and only SQLite is reported.

Note: the ``scripts/test-deps.sh`` cluster runs with ``fsync=off``; the table shows the server's
``fsync``/``synchronous_commit`` so a reader knows what a commit cost includes.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from typing import Any

from sqlalchemy import text

from runtime.llm.types import AssistantMessage, TextContent, UserMessage
from runtime.memory import ContextRepository, Database
from tests.bench.stats import pct
from tests.memory.pg_schema import create_schema, drop_schema, find_or_start_postgres

MESSAGES = 200
LOADS = 100


async def _measure(url: str) -> dict[str, Any]:
    db = Database(url)
    db.create_tables()
    try:
        repo = ContextRepository(db)
        sid = await repo.get_or_create_active("console:bench:private:u1")
        appends: list[float] = []
        for i in range(MESSAGES):
            msg: Any = (
                UserMessage(
                    content=f"question {i}: " + "x" * 190, sender={"id": "u1", "name": "U", "roles": []}
                )
                if i % 2 == 0
                else AssistantMessage(content=[TextContent(text=f"answer {i}: " + "y" * 190)], model="m")
            )
            t0 = time.perf_counter()
            await repo.append_messages(sid, [msg])
            appends.append((time.perf_counter() - t0) * 1000)
        loads: list[float] = []
        for _ in range(LOADS):
            t0 = time.perf_counter()
            ctx = await repo.load_context(sid)
            loads.append((time.perf_counter() - t0) * 1000)
        assert len(ctx.messages) == MESSAGES
        settings = ""
        if db.dialect == "postgresql":
            with db.engine.connect() as conn:
                fsync = conn.execute(text("SHOW fsync")).scalar()
                sync = conn.execute(text("SHOW synchronous_commit")).scalar()
            settings = f"fsync={fsync} synchronous_commit={sync}"
        else:
            settings = "WAL synchronous=NORMAL"
        return {
            "append_p50_ms": round(pct(appends, 0.5), 3),
            "append_p99_ms": round(pct(appends, 0.99), 3),
            "append_mean_ms": round(statistics.fmean(appends), 3),
            "load_p50_ms": round(pct(loads, 0.5), 3),
            "load_p99_ms": round(pct(loads, 0.99), 3),
            "messages": MESSAGES,
            "settings": settings,
        }
    finally:
        db.dispose()


def run() -> dict[str, Any]:
    """Measure both backends, print a table, return ``{"sqlite": {...}, "postgresql": {...}}``
    (``postgresql`` is ``{"error": "..."}`` when no server is reachable)."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = asyncio.run(_measure(f"sqlite:///{tmp}/bench.db"))
    pg_url, how = find_or_start_postgres()
    if pg_url is None:
        results["postgresql"] = {"error": how}
    else:
        try:
            url, schema = create_schema(pg_url, prefix="bench")
        except Exception as exc:
            results["postgresql"] = {"error": f"PostgreSQL unreachable at {pg_url} ({how}): {exc}"}
        else:
            try:
                results["postgresql"] = asyncio.run(_measure(url))
            finally:
                drop_schema(pg_url, schema)
    print(f"   session memory, a {MESSAGES}-message session (ms; append = one message per call)")
    print(
        f"   {'backend':<11} {'append p50':>10} {'append p99':>10} {'load p50':>9} {'load p99':>9}  settings"
    )
    for name, r in results.items():
        if "error" in r:
            print(f"   {name:<11} NOT MEASURED: {r['error']}")
            continue
        print(
            f"   {name:<11} {r['append_p50_ms']:>10.2f} {r['append_p99_ms']:>10.2f} "
            f"{r['load_p50_ms']:>9.2f} {r['load_p99_ms']:>9.2f}  {r['settings']}"
        )
    return results


if __name__ == "__main__":
    run()

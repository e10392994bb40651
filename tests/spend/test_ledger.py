"""The usage ledger records every LLM call exactly once, with its owner, tokens and cost, and the
row is committed before the caller sees the call end (SQLite and PostgreSQL, faux models)."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, inspect, select

from providers.faux import faux_assistant_message, faux_text, register_faux_provider
from runtime.llm.abort import AbortController
from runtime.llm.attribution import attributed
from runtime.llm.options import StreamOptions
from runtime.llm.stream import complete, stream
from runtime.llm.types import AssistantMessage, Context, Model, ModelCost, Usage, UserMessage
from runtime.llm.usage import add_usage_observer, priced, remove_usage_observer
from runtime.memory import Database
from runtime.spend.ledger import USAGE_TABLE

PRICES = ModelCost(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
USAGE = Usage(input=120, output=30, cache_read=50, cache_write=10)
CTX = Context(messages=[UserMessage(content="hi")])


def scripted(text: str = "ok", usage: Usage = USAGE) -> AssistantMessage:
    msg = faux_assistant_message([faux_text(text)])
    msg.usage = usage.model_copy()
    return msg


def priced_model(provider: str, **faux: Any) -> Model:
    handle = register_faux_provider(
        provider=provider, models=[Model(id="m", api="faux", cost=PRICES)], **faux
    )
    return handle.get_model()


async def rows(db: Database) -> list[dict[str, Any]]:
    def read() -> list[dict[str, Any]]:
        with db.connection() as conn:
            return [dict(r._mapping) for r in conn.execute(select(USAGE_TABLE).order_by(USAGE_TABLE.c.id))]

    return await db.run(read)


def test_create_tables_creates_the_ledger_with_its_indexes(db: Database) -> None:
    insp = inspect(db.engine)
    assert insp.has_table("llm_usage")
    assert {i["name"]: i["column_names"] for i in insp.get_indexes("llm_usage")} == {
        "ix_llm_usage_user_ts": ["user_id", "ts"],
        "ix_llm_usage_chat_ts": ["session_key", "ts"],
        "ix_llm_usage_bot_ts": ["bot_id", "ts"],
        "ix_llm_usage_ts": ["ts"],
    }


async def test_n_calls_sum_to_n_times_the_usage_exactly(db: Database, metric: Callable[..., float]) -> None:
    model = priced_model("ledger-n", default_response=scripted())
    n = 25
    with attributed(
        bot_id="10001", session_key="onebot11:10001:group:5", user_id="42", session_id="s#1", turn_id="m9"
    ):
        for _ in range(n):
            await complete(model, CTX)

    def sums() -> tuple[Any, ...]:
        c = USAGE_TABLE.c
        q = select(
            func.count(),
            func.sum(c.input_tokens),
            func.sum(c.output_tokens),
            func.sum(c.cache_read_tokens),
            func.sum(c.cache_write_tokens),
            func.sum(c.cost_usd),
        )
        with db.connection() as conn:
            return tuple(conn.execute(q).one())

    count, inp, out, cr, cw, usd = await db.run(sums)
    assert (count, inp, out, cr, cw) == (n, n * 120, n * 30, n * 50, n * 10)
    one = priced(PRICES, USAGE).total
    assert one == pytest.approx((120 * 3.0 + 30 * 15.0 + 50 * 0.3 + 10 * 3.75) / 1e6)
    assert usd == pytest.approx(n * one)
    (row, *_) = await rows(db)
    assert {
        k: row[k]
        for k in (
            "bot_id",
            "session_key",
            "user_id",
            "model",
            "api",
            "session_id",
            "turn_id",
            "reason",
            "master",
        )
    } == {
        "bot_id": "10001",
        "session_key": "onebot11:10001:group:5",
        "user_id": "42",
        "model": "ledger-n/m",
        "api": "faux",
        "session_id": "s#1",
        "turn_id": "m9",
        "reason": "turn",
        "master": False,
    }
    assert metric("sessionray_llm_tokens_total", api="faux", kind="input", model="ledger-n/m") == n * 120
    assert metric("sessionray_llm_tokens_total", api="faux", kind="cache_write", model="ledger-n/m") == n * 10
    assert metric("sessionray_llm_cost_usd_total", model="ledger-n/m") == pytest.approx(n * one)


async def test_the_row_is_committed_before_the_call_ends(db: Database) -> None:
    model = priced_model("ledger-commit", default_response=scripted())
    for i in range(1, 6):
        events = [e async for e in stream(model, CTX)]
        assert events[-1].type == "done"
        assert len(await rows(db)) == i  # already there when the terminal event arrived


async def test_failed_and_aborted_calls_are_recorded_once(db: Database) -> None:
    failing = priced_model("ledger-err")  # no script: the call ends with an error event
    msg = await complete(failing, CTX)
    assert msg.stop_reason == "error"
    slow = priced_model(
        "ledger-abort", chunk_size=1, chunk_delay_s=0.05, default_response=scripted("x" * 200)
    )
    ctl = AbortController()
    s = stream(slow, CTX, StreamOptions(signal=ctl.signal))
    async for event in s:
        if event.type == "text_delta":
            ctl.abort("stop")
    assert (await s.result()).stop_reason == "aborted"
    got = [(r["model"], r["input_tokens"], r["output_tokens"]) for r in await rows(db)]
    assert got == [("ledger-err/m", 0, 0), ("ledger-abort/m", 120, 30)]  # usage reported before the abort


async def test_an_observer_that_fails_never_breaks_the_call(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(call: Any) -> None:
        raise RuntimeError("observer down")

    add_usage_observer(broken)
    try:
        model = priced_model("ledger-broken", default_response=scripted("fine"))
        with caplog.at_level(logging.ERROR, logger="sessionray.llm.usage"):
            msg = await complete(model, CTX)
    finally:
        remove_usage_observer(broken)
    assert (msg.stop_reason, msg.text()) == ("stop", "fine")
    assert len(await rows(db)) == 1
    assert "observer down" in caplog.text


def test_a_session_hosts_repository_creates_the_ledger_tables_on_a_fresh_database(tmp_path: Path) -> None:
    """A session host creates ``llm_usage`` and the delivery tables with the memory tables at
    start-up, in a fresh process that imported nothing else first (the package exports are lazy:
    docs/decisions.md#ops-lazy-exports)."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    code = (
        "import types\n"
        "from actors.placement.hosts.support import open_repository\n"
        f"repo = open_repository(types.SimpleNamespace(database=types.SimpleNamespace(url={url!r})))\n"
        "from sqlalchemy import inspect\n"
        "print(sorted(inspect(repo.db.engine).get_table_names()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "'llm_usage'" in out.stdout and "'delivery_ledger'" in out.stdout, out.stdout

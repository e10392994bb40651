"""Usage reports group the ledger by user, chat, bot or model, most expensive first, within a time
range and optional filters (SQLite, PostgreSQL); ``parse_since`` reads spans and ISO times."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.memory import Database
from runtime.spend.ledger import write_usage
from runtime.spend.report import UsageRow, parse_since, usage_report, usage_totals

DAY = 86_400_000
T0 = 1_764_892_800_000  # 2025-12-05T00:00:00Z


def row(
    ts: int, user: str, chat: str, model: str, inp: int, out: int, usd: float, **kw: Any
) -> dict[str, Any]:
    return {
        "ts": ts,
        "bot_id": kw.get("bot", "10001"),
        "session_key": chat,
        "user_id": user,
        "model": model,
        "api": "openai-completions",
        "session_id": "",
        "turn_id": "",
        "reason": kw.get("reason", "turn"),
        "input_tokens": inp,
        "output_tokens": out,
        "cache_read_tokens": kw.get("cr", 0),
        "cache_write_tokens": kw.get("cw", 0),
        "cost_usd": usd,
        "master": False,
    }


@pytest.fixture
def ledger(db: Database) -> Database:
    g5, g6 = "onebot11:10001:group:5", "onebot11:10001:group:6"
    write_usage(
        db,
        [
            row(T0 - DAY, "1", g5, "a/big", 1000, 100, 9.0),  # before the range
            row(T0 + 1, "1", g5, "a/big", 100, 10, 0.50, cr=7),
            row(T0 + 2, "1", g5, "a/small", 50, 5, 0.01, cw=3),
            row(T0 + 3, "2", g5, "a/big", 300, 30, 1.50),
            row(T0 + 4, "3", g6, "a/small", 40, 4, 0.02, bot="20002"),
            row(T0 + DAY, "2", g6, "a/big", 500, 50, 2.0),  # after until
        ],
    )
    return db


async def test_by_user_most_expensive_first(ledger: Database) -> None:
    got = await usage_report(ledger, "user", T0, T0 + DAY)
    assert got == [
        UsageRow("2", 1, 300, 30, 0, 0, pytest.approx(1.50)),  # type: ignore[arg-type]
        UsageRow("1", 2, 150, 15, 7, 3, pytest.approx(0.51)),  # type: ignore[arg-type]
        UsageRow("3", 1, 40, 4, 0, 0, pytest.approx(0.02)),  # type: ignore[arg-type]
    ]
    assert got[0].as_dict()["key"] == "2"


async def test_by_chat_bot_and_model_and_filters(ledger: Database) -> None:
    by_chat = await usage_report(ledger, "chat", T0, T0 + DAY)
    assert [(r.key, r.calls) for r in by_chat] == [
        ("onebot11:10001:group:5", 3),
        ("onebot11:10001:group:6", 1),
    ]
    by_bot = await usage_report(ledger, "bot", T0)  # no until: the later row counts too
    assert [(r.key, r.calls, r.input_tokens) for r in by_bot] == [("10001", 4, 950), ("20002", 1, 40)]
    by_model = await usage_report(ledger, "model", T0, T0 + DAY, chat="onebot11:10001:group:5")
    assert [(r.key, r.calls) for r in by_model] == [("a/big", 2), ("a/small", 1)]
    one_user = await usage_report(ledger, "model", T0, T0 + DAY, user="1", model="a/big")
    assert [(r.key, r.calls, r.output_tokens) for r in one_user] == [("a/big", 1, 10)]
    assert [r.key for r in await usage_report(ledger, "user", T0, T0 + DAY, limit=1)] == ["2"]
    assert await usage_report(ledger, "user", T0 + 2 * DAY) == []


async def test_totals_sum_every_matching_call_whatever_the_limit(ledger: Database) -> None:
    total, groups = await usage_totals(ledger, "user", T0, T0 + DAY)
    assert (total, groups) == (UsageRow("total", 4, 490, 49, 7, 3, pytest.approx(2.03)), 3)  # type: ignore[arg-type]
    assert [r.key for r in await usage_report(ledger, "user", T0, T0 + DAY, limit=1)] == ["2"]
    in_g5, models = await usage_totals(ledger, "model", T0, chat="onebot11:10001:group:5")
    assert (in_g5.calls, in_g5.input_tokens, models) == (3, 450, 2)
    assert await usage_totals(ledger, "bot", T0 + 2 * DAY) == (UsageRow("total", 0, 0, 0, 0, 0, 0.0), 0)
    with pytest.raises(ValueError, match="cannot group usage by 'team'"):
        await usage_totals(ledger, "team", 0)  # type: ignore[arg-type]


async def test_bad_arguments_are_refused(db: Database) -> None:
    with pytest.raises(ValueError, match="cannot group usage by 'team'"):
        await usage_report(db, "team", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit must be"):
        await usage_report(db, "user", 0, limit=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24h", T0 - DAY),
        ("7d", T0 - 7 * DAY),
        ("30m", T0 - 30 * 60_000),
        ("90s", T0 - 90_000),
        ("2w", T0 - 14 * DAY),
        (" 1 d ", T0 - DAY),
        ("2025-12-01", T0 - 4 * DAY),
        ("2025-12-05T08:00+08:00", T0),
        ("2025-12-05T01:00", T0 + 3_600_000),
    ],
)
def test_parse_since(text: str, expected: int) -> None:
    assert parse_since(text, now=T0) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "24", "5y", "2025-13-01", "-3h"])
def test_parse_since_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="use a span back from now"):
        parse_since(text, now=T0)

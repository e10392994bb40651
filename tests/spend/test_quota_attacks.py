"""Attacks on quotas: windows at the edges of the zone's clock (midnight in the configured zone,
half-hour and 45-minute daylight-saving shifts), USD sums that float arithmetic leaves a hair
under the limit, and huge counts (docs/decisions.md#spend-quotas; SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from runtime.config.spend import SpendConfig
from runtime.llm.attribution import CallAttribution
from runtime.memory import Database
from runtime.spend.ledger import write_usage
from runtime.spend.quotas import Quotas, window_bounds

SH = ZoneInfo("Asia/Shanghai")
OWNER = CallAttribution(bot_id="10001", session_key="onebot11:10001:group:5", user_id="42")


def ms(*args: int, tz: ZoneInfo = SH) -> int:
    return int(datetime(*args, tzinfo=tz).timestamp() * 1000)


def quotas(**entry: Any) -> Quotas:
    return Quotas(SpendConfig.model_validate({"timezone": "Asia/Shanghai", "quotas": [entry]}))


def spent(db: Database, ts: int, tokens: int, usd: float = 0.0) -> None:
    row = {
        "ts": ts,
        "bot_id": "10001",
        "session_key": "onebot11:10001:group:5",
        "user_id": "42",
        "model": "p/m",
        "api": "faux",
        "input_tokens": tokens,
        "cost_usd": usd,
    }
    write_usage(db, [row])


async def test_the_day_rolls_over_at_midnight_in_the_configured_zone(db: Database) -> None:
    q = quotas(scope="user", window="day", tokens=100)
    midnight = ms(2026, 12, 6)  # 16:00 UTC on the 5th
    spent(db, midnight - 1, 100)  # the last millisecond of the 5th in Shanghai
    st = await q.check(db, OWNER, at_ms=midnight - 1)
    assert st is not None and st.use.reset_ms == midnight
    assert await q.check(db, OWNER, at_ms=midnight) is None  # a new day: nothing used yet
    spent(db, midnight, 99)
    assert await q.check(db, OWNER, at_ms=midnight + 1) is None
    spent(db, midnight + 1, 1)
    assert await q.check(db, OWNER, at_ms=midnight + 2) is not None


async def test_usd_spent_exactly_up_to_the_limit_in_many_small_calls_is_exceeded(db: Database) -> None:
    q = quotas(scope="user", window="day", usd=1.0)
    for i in range(10):
        spent(db, ms(2026, 12, 5, 10, i), 1, usd=0.1)  # 0.1 ten times sums to 0.9999999999999999
    st = await q.check(db, OWNER, at_ms=ms(2026, 12, 5, 12))
    assert st is not None and st.usd_left == 0.0


async def test_huge_counts_sum_exactly(db: Database) -> None:
    q = quotas(scope="user", window="month", tokens=4 * 10**15)
    for _ in range(3):
        spent(db, ms(2026, 12, 5, 10), 10**15)
    (st,) = await q.status(db, OWNER, at_ms=ms(2026, 12, 5, 12))
    assert (st.use.tokens, st.tokens_left, st.exceeded) == (3 * 10**15, 10**15, False)


@pytest.mark.parametrize(
    "zone", ["Australia/Lord_Howe", "Pacific/Chatham", "Asia/Kathmandu", "Europe/Berlin"]
)
def test_every_instant_lies_in_its_own_hour_and_day(zone: str) -> None:
    tz = ZoneInfo(zone)
    start = int(datetime(2026, 1, 1, tzinfo=ZoneInfo("UTC")).timestamp() * 1000)
    for at in range(start, start + 366 * 86_400_000, 15 * 60_000):
        for window in ("hour", "day"):
            lo, hi = window_bounds(window, at, tz)  # type: ignore[arg-type]
            assert lo <= at < hi, (zone, window, at)

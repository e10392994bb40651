"""Quotas: calendar windows in the configured zone, defaults and per-id overrides, and the check
before a turn — exact at the boundary, from SQL sums over the shared ledger (SQLite, PostgreSQL)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from runtime.config import ConfigError, parse_config
from runtime.config.spend import SpendConfig
from runtime.llm.attribution import CallAttribution
from runtime.memory import Database
from runtime.spend.ledger import write_usage
from runtime.spend.quotas import Limit, Quotas, window_bounds

SH = ZoneInfo("Asia/Shanghai")
UTC = ZoneInfo("UTC")


def ms(*args: int, tz: ZoneInfo = UTC) -> int:
    return int(datetime(*args, tzinfo=tz).timestamp() * 1000)


@pytest.mark.parametrize(
    ("window", "tz", "start", "end"),
    [
        ("hour", UTC, (2026, 12, 31, 20), (2026, 12, 31, 21)),
        ("day", UTC, (2026, 12, 31), (2027, 1, 1)),
        ("month", UTC, (2026, 12, 1), (2027, 1, 1)),
        ("day", SH, (2027, 1, 1), (2027, 1, 2)),  # 20:30 UTC is already the 1st in Shanghai
        ("month", SH, (2027, 1, 1), (2027, 2, 1)),
    ],
)
def test_windows_follow_the_zone(
    window: Any, tz: ZoneInfo, start: tuple[int, ...], end: tuple[int, ...]
) -> None:
    at = ms(2026, 12, 31, 20, 30)
    assert window_bounds(window, at, tz) == (ms(*start, tz=tz), ms(*end, tz=tz))


def test_a_day_across_a_dst_change_is_23_hours() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    start, end = window_bounds("day", ms(2026, 3, 29, 12, tz=berlin), berlin)
    assert end - start == 23 * 3_600_000


def owner(
    user: str = "42", *, chat: str = "onebot11:10001:group:5", bot: str = "10001", master: bool = False
) -> CallAttribution:
    return CallAttribution(bot_id=bot, session_key=chat, user_id=user, master=master)


def quotas(*entries: dict[str, Any], **extra: Any) -> Quotas:
    return Quotas(SpendConfig.model_validate({"quotas": list(entries), **extra}))


def test_overrides_replace_the_default_of_their_window_only() -> None:
    q = quotas(
        {"scope": "user", "window": "day", "tokens": 100},
        {"scope": "user", "window": "hour", "tokens": 10},
        {"scope": "user", "window": "day", "id": "7", "usd": 1.5},
        {"scope": "user", "window": "hour", "id": "8"},  # lifted
        {"scope": "global", "window": "month", "usd": 300},
    )
    assert q.limits(owner("42")) == [
        Limit("user", "42", "hour", 10, None),
        Limit("user", "42", "day", 100, None),
        Limit("global", "", "month", None, 300.0),
    ]
    assert q.limits(owner("7"), ["user"]) == [
        Limit("user", "7", "hour", 10, None),
        Limit("user", "7", "day", None, 1.5),
    ]
    assert q.limits(owner("8"), ["user"]) == [Limit("user", "8", "day", 100, None)]


@pytest.mark.parametrize(
    ("spend", "problem"),
    [
        ({"timezone": "Mars/Olympus"}, "spend.timezone: unknown time zone 'Mars/Olympus'"),
        ({"quotas": [{"scope": "global", "id": "x", "tokens": 1}]}, "a `global` quota has no `id`"),
        ({"quotas": [{"scope": "user"}]}, "a quota needs `tokens` and/or `usd`"),
        ({"quotas": [{"scope": "team", "tokens": 1}]}, "spend.quotas.0.scope"),
        (
            {"exceeded_text": "over {quota}"},
            "spend.exceeded_text: cannot fill the template (KeyError: 'quota')",
        ),
        (
            {"quotas": [{"scope": "chat", "tokens": 1}, {"scope": "chat", "tokens": 2}]},
            "spend.quotas: two `chat` quotas for the same window `day`",
        ),
    ],
)
def test_bad_quota_config_names_the_key(spend: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"spend": spend})
    assert problem in str(err.value)


def spent(db: Database, at: int, tokens: int, usd: float = 0.0, **who: Any) -> None:
    row = {
        "ts": at,
        "bot_id": "10001",
        "session_key": "onebot11:10001:group:5",
        "user_id": "42",
        "model": "p/m",
        "api": "faux",
        "session_id": "",
        "turn_id": "",
        "reason": "turn",
        "input_tokens": tokens,
        "output_tokens": 0,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "cost_usd": usd,
        "master": False,
        **who,
    }
    write_usage(db, [row])


async def test_check_is_exact_at_the_boundary(db: Database) -> None:
    now = ms(2026, 12, 5, 12)
    q = quotas({"scope": "user", "window": "day", "tokens": 1000})
    spent(db, ms(2026, 12, 4, 23, 59), 5000)  # yesterday: not counted
    spent(db, ms(2026, 12, 5, 0, 0), 600)
    spent(db, ms(2026, 12, 5, 11), 399, user_id="43")  # someone else
    spent(db, ms(2026, 12, 5, 11), 399, bot_id="20002")  # the same id with another bot
    spent(db, ms(2026, 12, 5, 11), 399)
    assert await q.check(db, owner(), at_ms=now) is None  # 999 < 1000
    spent(db, ms(2026, 12, 5, 11, 30), 1)
    st = await q.check(db, owner(), at_ms=now)
    assert st is not None and (st.limit.scope, st.use.tokens, st.tokens_left) == ("user", 1000, 0)
    assert st.use.reset_ms == ms(2026, 12, 6)
    assert await q.check(db, owner(master=True), at_ms=now) is None  # masters are exempt
    assert await q.check(db, owner("43"), at_ms=now) is None


async def test_usd_chat_bot_and_global_scopes(db: Database) -> None:
    now = ms(2026, 12, 5, 12)
    spent(db, ms(2026, 12, 5, 1), 10, usd=0.30, session_key="onebot11:10001:group:6", user_id="1")
    spent(db, ms(2026, 12, 5, 2), 10, usd=0.25, user_id="2")
    q = quotas({"scope": "chat", "window": "month", "usd": 0.25})
    st = await q.check(db, owner("3"), at_ms=now)
    assert st is not None and (st.limit.scope, st.use.usd) == ("chat", pytest.approx(0.25))
    assert await q.check(db, owner("3", chat="onebot11:10001:group:7"), at_ms=now) is None
    q = quotas({"scope": "bot", "window": "day", "usd": 0.6})
    assert await q.check(db, owner("3", chat="x"), at_ms=now) is None  # 0.55 < 0.6
    q = quotas({"scope": "global", "window": "hour", "tokens": 5})
    assert await q.check(db, owner(), at_ms=now) is None  # nothing in this hour
    st = await q.check(db, owner(), at_ms=ms(2026, 12, 5, 2, 30))
    assert st is not None and st.limit.scope == "global"


def test_session_features_read_the_spend_section() -> None:
    from runtime.session.features import AgentFeatures

    config = parse_config({"spend": {"timezone": "Asia/Shanghai", "quotas": [{"scope": "bot", "usd": 3}]}})
    q = AgentFeatures.from_config(config).quotas
    assert q is not None and q.tz == SH
    assert q.limits(owner()) == [Limit("bot", "10001", "day", None, 3.0)]
    assert AgentFeatures.from_config(parse_config({})).quotas.enabled is False  # type: ignore[union-attr]

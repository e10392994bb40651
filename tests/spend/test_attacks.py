"""Attacks on the spend features with bad input: usage a provider reports wrongly, prices and
limits that make no sense, the database down while a call is recorded or a quota checked
(docs/decisions.md#spend-ledger, docs/decisions.md#spend-quotas)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError

from providers.faux import faux_assistant_message, faux_text, register_faux_provider
from runtime.config import ConfigError, load_config
from runtime.config.spend import QuotaConfig, SpendConfig
from runtime.llm.attribution import CallAttribution
from runtime.llm.stream import complete
from runtime.llm.types import AssistantMessage, Context, Model, ModelCost, Usage, UserMessage
from runtime.memory import Database
from runtime.spend.quotas import Quotas
from tests.spend.test_ledger import rows

CTX = Context(messages=[UserMessage(content="hi")])
PRICES = ModelCost(input=3.0, output=15.0)


def answer(usage: Usage) -> AssistantMessage:
    msg = faux_assistant_message([faux_text("fine")])
    msg.usage = usage
    return msg


def model(provider: str, usage: Usage) -> Model:
    handle = register_faux_provider(
        provider=provider, models=[Model(id="m", api="faux", cost=PRICES)], default_response=answer(usage)
    )
    return handle.get_model()


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (Usage(input=-500, output=-7), (0, 0, 0, 0)),
        (Usage.model_construct(input=float("nan"), output=12, cache_read=0, cache_write=0), (0, 12, 0, 0)),
        (Usage.model_construct(input="40", output=None, cache_read=True, cache_write=2.9), (40, 0, 0, 2)),
        (Usage(input=10**15, output=3), (10**15, 3, 0, 0)),
    ],
)
async def test_bad_reported_usage_is_recorded_sanely_and_the_call_finishes(
    db: Database, metric: Any, usage: Usage, expected: tuple[int, int, int, int]
) -> None:
    msg = await complete(model("attack-usage", usage), CTX)
    assert (msg.stop_reason, msg.text()) == ("stop", "fine")
    u = msg.usage  # the turn sees the same sane counts (context budget calibration, stats)
    assert (u.input, u.output, u.cache_read, u.cache_write) == expected
    (row,) = await rows(db)
    got = (row["input_tokens"], row["output_tokens"], row["cache_read_tokens"], row["cache_write_tokens"])
    assert got == expected
    assert math.isfinite(row["cost_usd"]) and row["cost_usd"] >= 0
    assert row["cost_usd"] == pytest.approx(expected[0] * 3.0 / 1e6 + expected[1] * 15.0 / 1e6)


async def test_a_nan_or_negative_cost_from_an_adapter_is_repriced(db: Database, metric: Any) -> None:
    usage = Usage(input=1000, output=100)
    usage.cost.total = float("nan")
    await complete(model("attack-nan-cost", usage), CTX)
    usage2 = Usage(input=1000, output=100)
    usage2.cost.total = -5.0
    await complete(model("attack-neg-cost", usage2), CTX)
    assert [r["cost_usd"] for r in await rows(db)] == [pytest.approx(0.0045)] * 2


async def test_the_database_down_while_recording_never_breaks_the_call_and_is_counted(
    db: Database, metric: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def down(fn: Any) -> Any:
        raise OperationalError("INSERT", {}, Exception("connection refused"))

    monkeypatch.setattr(db, "run_write", down)
    msg = await complete(model("attack-db-down", Usage(input=5, output=5)), CTX)
    assert (msg.stop_reason, msg.text()) == ("stop", "fine")
    assert metric("sessionray_usage_ledger_failures_total") == 1.0
    assert metric("sessionray_llm_tokens_total", api="faux", kind="input", model="attack-db-down/m") == 5.0


async def test_a_quota_check_with_the_database_down_fails_closed(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/decisions.md#spend-quotas: a turn whose quota cannot be read does not start."""
    quotas = Quotas(SpendConfig(quotas=[QuotaConfig(scope="user", tokens=10)]))
    owner = CallAttribution(bot_id="b", session_key="k", user_id="u")

    async def down(fn: Any) -> Any:
        raise OperationalError("SELECT", {}, Exception("connection refused"))

    monkeypatch.setattr(db, "run", down)
    with pytest.raises(OperationalError):
        await quotas.check(db, owner)
    master = CallAttribution(bot_id="b", session_key="k", user_id="u", master=True)
    assert await quotas.check(db, master) is None  # masters never touch SQL


BASE = """
ai:
  providers:
    main:
      api: openai-completions
      base_url: http://127.0.0.1:9/v1
      limits: {limits}
      models: [{{id: m1, cost: {cost}}}]
  agent: {agent}
spend: {spend}
"""


@pytest.mark.parametrize(
    ("part", "value", "where", "why"),
    [
        ("cost", "{input: -1}", "ai.providers.main.models.0.cost.input", "greater than or equal to 0"),
        ("cost", "{output: .nan}", "ai.providers.main.models.0.cost.output", "finite number"),
        ("cost", "{cache_read: .inf}", "ai.providers.main.models.0.cost.cache_read", "finite number"),
        ("limits", "{max_wait_s: .inf}", "ai.providers.main.limits.max_wait_s", "finite number"),
        ("spend", "{quotas: [{scope: user, usd: .inf}]}", "spend.quotas.0.usd", "finite number"),
        ("spend", "{quotas: [{scope: user, tokens: true}]}", "spend.quotas.0.tokens", "valid integer"),
        ("spend", "{quotas: [{scope: user, window: daily, tokens: 5}]}", "spend.quotas.0.window", "'day'"),
        ("spend", "{quotas: [{scope: user}]}", "spend.quotas.0", "needs `tokens` and/or `usd`"),
        ("spend", "{quotas: [{scope: chat, id: 12345, tokens: 5}]}", "spend.quotas.0", "session key"),
        ("spend", "{timezone: Mars/Olympus}", "spend.timezone", "unknown time zone"),
        ("spend", "{timezone: UTC+8}", "spend.timezone", "unknown time zone"),
        (
            "agent",
            "{coalesce: {busy_notice_interval_s: .inf}}",
            "ai.agent.coalesce.busy_notice_interval_s",
            "finite number",
        ),
    ],
)
def test_absurd_spend_config_is_refused_naming_the_key(
    tmp_path: Path, part: str, value: str, where: str, why: str
) -> None:
    fields = {"limits": "null", "cost": "{}", "agent": "{}", "spend": "{}", part: value}
    path = tmp_path / "sessionray.yaml"
    path.write_text(BASE.format(**fields), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert where in str(err.value) and why in str(err.value), str(err.value)

"""complete_structured per tier: the validated instance on success, and on failure a
StructuredOutputError whose ``raw``, ``reason`` and ``tier`` say what the last attempt was
(docs/decisions.md#structured-one-retry)."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from providers.faux import faux_assistant_message, faux_text, faux_tool_call
from runtime import Context, UserMessage
from runtime.reply import StructuredOutputError, complete_structured


class Intent(StrEnum):
    REFUND = "REFUND"
    OTHER = "OTHER"


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    intent: Intent
    action: str
    arguments: dict[str, str]


GOOD = {"intent": "REFUND", "action": "ASK_ORDER_ID", "arguments": {"product": "shoes"}}
BAD = {"intent": "refund", "action": "ASK_ORDER_ID", "arguments": {}}


def ctx() -> Context:
    return Context(system_prompt="Decide.", messages=[UserMessage(content="return my shoes", timestamp=1)])


def answer(tier: str, body: dict[str, Any]) -> Any:
    if tier == "tool":
        return faux_assistant_message([faux_tool_call("Decision", body)])
    return faux_assistant_message([faux_text(json.dumps(body))])


@pytest.mark.parametrize("tier", ["native", "tool", "prompt"])
async def test_each_tier_returns_the_validated_instance(faux, cache, deltas, tier: str) -> None:
    faux.set_responses([answer(tier, GOOD)])
    value = await complete_structured(faux.get_model(), ctx(), Decision, mode=tier, cache=cache)  # type: ignore[arg-type]
    assert value == Decision(intent=Intent.REFUND, action="ASK_ORDER_ID", arguments={"product": "shoes"})
    assert deltas.structured() == {(tier, "first_try"): 1}


@pytest.mark.parametrize("tier", ["native", "tool", "prompt"])
async def test_each_tier_raises_with_raw_reason_and_tier(faux, cache, deltas, tier: str) -> None:
    faux.set_responses([answer(tier, BAD), answer(tier, {**BAD, "extra": 1})])
    with pytest.raises(StructuredOutputError) as info:
        await complete_structured(faux.get_model(), ctx(), Decision, mode=tier, cache=cache)  # type: ignore[arg-type]
    err = info.value
    assert (err.tier, err.output_type) == (tier, "Decision")
    assert json.loads(err.raw) == {**BAD, "extra": 1}  # the retry's raw output
    assert err.reason == "intent: Input should be 'REFUND' or 'OTHER'; extra: Extra inputs are not permitted"
    assert faux.call_count == 2  # the answer and exactly one retry
    assert deltas.structured() == {(tier, "failed"): 1}


async def test_a_provider_error_raises_with_the_provider_reason(faux, cache, deltas) -> None:
    faux.set_responses([faux_assistant_message([], "error", error_message="HTTP 503: overloaded")])
    with pytest.raises(StructuredOutputError) as info:
        await complete_structured(faux.get_model(), ctx(), Decision, mode="auto", cache=cache)
    assert (info.value.tier, info.value.reason, info.value.raw) == (
        "native",
        "provider error: HTTP 503: overloaded",
        "",
    )

"""complete_structured: tiers, the cached capability probe, one retry with the error, explicit
fallbacks, log records and counters
(docs/decisions.md#structured-one-retry, docs/decisions.md#structured-every-outcome-counted)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from providers.faux import faux_assistant_message, faux_text, faux_thinking, faux_tool_call
from runtime import AbortController, Context, StreamOptions, UserMessage
from runtime.reply.capability import CapabilityCache
from runtime.reply.json_schema import strict_json_schema
from runtime.reply.probe import probe_capability
from runtime.reply.structured import StructuredOutputError, complete_structured, run_structured


class Intent(BaseModel):
    intent: Literal["REFUND_REQUEST", "ORDER_QUERY", "UNKNOWN"]
    confidence: float
    need_human: bool


GOOD = {"intent": "REFUND_REQUEST", "confidence": 0.9, "need_human": False}
SAFE = Intent(intent="UNKNOWN", confidence=0.0, need_human=True)


def ctx() -> Context:
    return Context(system_prompt="You classify intents.", messages=[UserMessage(content="退货", timestamp=1)])


def text(s: str) -> Any:
    return faux_assistant_message([faux_text(s)])


def error(msg: str) -> Any:
    return faux_assistant_message([], "error", error_message=msg)


async def test_native_first_try_sends_generated_schema(faux, cache, deltas) -> None:
    faux.set_responses([faux_assistant_message([faux_thinking("hmm {"), faux_text(json.dumps(GOOD))])])
    out = await run_structured(faux.get_model(), ctx(), Intent, cache=cache)
    assert (out.value, out.tier, out.outcome, out.reason, out.calls) == (
        Intent(**GOOD),
        "native",
        "first_try",
        None,
        1,
    )
    opts = faux.calls[0].options
    assert opts is not None
    assert (opts.output_schema, opts.output_schema_name, opts.tool_choice) == (
        strict_json_schema(Intent),
        "Intent",
        None,
    )
    assert strict_json_schema(Intent)["required"] == ["intent", "confidence", "need_human"]
    assert faux.calls[0].context.tools is None
    assert cache.get(faux.get_model()) == "native"
    assert deltas.structured() == {("native", "first_try"): 1}
    assert deltas.downgrades() == {}


async def test_downgrade_native_tool_prompt_and_cached_capability(faux, cache, deltas) -> None:
    faux.set_responses(
        [
            error("HTTP 400: response_format json_schema is not supported by this model"),
            error("HTTP 400: tool_choice is not supported"),
            text(json.dumps(GOOD)),
        ]
    )
    model = faux.get_model()
    out = await run_structured(model, ctx(), Intent, cache=cache)
    assert (out.value, out.tier, out.outcome, out.calls) == (Intent(**GOOD), "prompt", "first_try", 3)
    assert out.downgrades == [("native", "tool"), ("tool", "prompt")]
    tier_of_call = [
        (c.options.output_schema is not None, c.options.tool_choice, [t.name for t in c.context.tools or []])
        for c in faux.calls
        if c.options is not None
    ]
    assert tier_of_call == [(True, None, []), (False, "Intent", ["Intent"]), (False, None, [])]
    assert "JSON Schema:" in faux.calls[2].context.system_prompt
    assert cache.get(model) == "prompt"
    assert deltas.downgrades() == {("native", "tool"): 1, ("tool", "prompt"): 1}
    # the cached capability: the next call goes straight to the prompt tier, one call
    faux.set_responses([text(json.dumps(GOOD))])
    again = await run_structured(model, ctx(), Intent, cache=cache)
    assert (again.tier, again.outcome, again.calls, faux.call_count) == ("prompt", "first_try", 1, 4)
    assert deltas.structured() == {("prompt", "first_try"): 2}


async def test_native_200_off_schema_downgrades_to_tool(faux, deltas) -> None:
    cache = CapabilityCache(downgrade_after=1)  # one off-schema answer is enough evidence
    faux.set_responses(
        [
            text('{"intention": "退货", "confidence": "high"}'),
            faux_assistant_message([faux_tool_call("Intent", GOOD)]),
        ]
    )
    out = await run_structured(faux.get_model(), ctx(), Intent, cache=cache)
    assert (out.value, out.tier, out.outcome, out.downgrades) == (
        Intent(**GOOD),
        "tool",
        "first_try",
        [("native", "tool")],
    )
    assert cache.get(faux.get_model()) == "tool"
    assert deltas.downgrades() == {("native", "tool"): 1}
    assert deltas.structured() == {("tool", "first_try"): 1}


async def test_off_schema_answers_count_against_the_callers_downgrade_after(faux, deltas) -> None:
    """docs/decisions.md#structured-downgrade-on-evidence: with the caller's cache the first
    off-schema native answer takes its retry at ``native``; a valid first answer restarts the
    streak; the ``downgrade_after``-th in a row moves the model and the call goes on at ``tool``."""
    cache, model = CapabilityCache(downgrade_after=2), faux.get_model()
    prose = text("Sure, a refund.")
    faux.set_responses([prose, text(json.dumps(GOOD)), text(json.dumps(GOOD)), prose, text(json.dumps(GOOD))])
    first = await run_structured(model, ctx(), Intent, cache=cache)
    assert (first.tier, first.outcome, first.calls, first.downgrades) == ("native", "corrected", 2, [])
    assert (cache.get(model), cache.effective(model).failures) == ("native", 1)  # type: ignore[union-attr]
    valid = await run_structured(model, ctx(), Intent, cache=cache)
    assert (valid.outcome, cache.effective(model).failures) == ("first_try", 0)  # type: ignore[union-attr]
    again = await run_structured(model, ctx(), Intent, cache=cache)  # one off-schema answer again
    assert (again.outcome, again.calls, again.downgrades) == ("corrected", 2, [])
    assert deltas.downgrades() == {}
    faux.set_responses([prose, faux_assistant_message([faux_tool_call("Intent", GOOD)])])
    moved = await run_structured(model, ctx(), Intent, cache=cache)  # the second in a row
    assert (moved.value, moved.tier, moved.outcome, moved.calls, moved.downgrades) == (
        Intent(**GOOD), "tool", "first_try", 2, [("native", "tool")]
    )  # fmt: skip
    rec = cache.effective(model)
    assert rec is not None
    assert (rec.tier, rec.source, rec.evidence) == ("tool", "downgrade", "Sure, a refund.")
    assert rec.reason.startswith("2 consecutive off-schema answers at native: (root): Invalid JSON")
    assert deltas.downgrades() == {("native", "tool"): 1}
    # at ``tool`` an answer without the output call takes the retry (no evidence counted)
    for _ in range(2):
        faux.set_responses([text("no call"), faux_assistant_message([faux_tool_call("Intent", GOOD)])])
        tool = await run_structured(model, ctx(), Intent, cache=cache)
        assert (tool.tier, tool.outcome, tool.downgrades) == ("tool", "corrected", [])
        assert cache.get(model) == "tool"


async def test_without_a_cache_the_first_off_schema_native_answer_moves_on(faux, deltas) -> None:
    """The documented default (docs/replies.md#complete_structured-in-your-own-code): no cache →
    the process-wide one, and one 200 that ignores the schema moves the call to ``tool``."""
    from runtime.reply.capability import CAPABILITIES

    faux.set_responses([text("prose"), faux_assistant_message([faux_tool_call("Intent", GOOD)])])
    out = await run_structured(faux.get_model(), ctx(), Intent)
    assert (out.tier, out.outcome, out.calls) == ("tool", "first_try", 2)
    assert out.downgrades == [("native", "tool")]
    assert CAPABILITIES.get(faux.get_model()) == "tool"  # the provider name is unique to this test
    assert deltas.downgrades() == {("native", "tool"): 1}


async def test_a_check_rule_failure_is_not_evidence_against_the_tier(faux, deltas) -> None:
    """A schema-valid answer that breaks the caller's ``check`` gets the retry at the same tier and
    moves nothing, even with ``downgrade_after=1``."""
    cache = CapabilityCache(downgrade_after=1)
    human = {**GOOD, "need_human": True}
    faux.set_responses([text(json.dumps(human)), text(json.dumps(GOOD))])
    out = await run_structured(
        faux.get_model(), ctx(), Intent, cache=cache,
        check=lambda v: "no human for refunds" if v.need_human else None,
    )  # fmt: skip
    assert (out.tier, out.outcome, out.reason) == ("native", "corrected", "no human for refunds")
    assert out.downgrades == []
    assert cache.get(faux.get_model()) == "native" and deltas.downgrades() == {}


@pytest.mark.parametrize("compat", [{"structured_output": "tool"}, {"supports_json_schema": False}])
async def test_compat_seeds_the_tier(faux, cache, deltas, compat) -> None:
    model = faux.get_model().model_copy(update={"compat": compat})
    faux.set_responses([faux_assistant_message([faux_tool_call("Intent", GOOD)])])
    assert await complete_structured(model, ctx(), Intent, cache=cache) == Intent(**GOOD)
    assert faux.calls[0].options is not None and faux.calls[0].options.tool_choice == "Intent"
    assert deltas.structured() == {("tool", "first_try"): 1}


async def test_one_retry_carries_the_validation_error(faux, cache, deltas, request_text) -> None:
    bad = '{"intent": "REFUND_REQUEST", "confidence": "high", "need_human": false}'
    faux.set_responses([text(bad), text(json.dumps(GOOD))])
    out = await run_structured(faux.get_model(), ctx(), Intent, mode="prompt", cache=cache)
    assert (out.value, out.tier, out.outcome, out.calls) == (Intent(**GOOD), "prompt", "corrected", 2)
    assert out.reason == "confidence: Input should be a valid number"
    retry = request_text(faux.calls[1].context)
    assert "confidence: Input should be a valid number" in retry and bad in retry
    assert deltas.structured() == {("prompt", "corrected"): 1}


@pytest.mark.parametrize(
    "raw",
    [
        "```json\n" + json.dumps(GOOD) + "\n```",  # fenced: never stripped
        "Sure! " + json.dumps(GOOD),  # prose around JSON: never extracted
        '{"intent": "REFUND_REQUEST", "confidence": 0.9}',  # missing field
        '{"intent": "退货", "confidence": 0.9, "need_human": false}',  # not in the enum
    ],
)
async def test_invalid_twice_returns_the_safe_default_and_logs(faux, cache, deltas, caplog, raw) -> None:
    faux.set_responses([text(raw), text(raw)])
    with caplog.at_level(logging.INFO, logger="runtime.reply.structured"):
        value = await complete_structured(
            faux.get_model(), ctx(), Intent, mode="prompt", default=SAFE, cache=cache
        )
    assert value == SAFE
    assert faux.call_count == 2
    records = [r.structured for r in caplog.records if hasattr(r, "structured")]  # type: ignore[attr-defined]
    assert len(records) == 1
    rec = records[0]
    assert (rec["tier"], rec["outcome"], rec["raw"], rec["output_type"]) == (
        "prompt",
        "default",
        raw,
        "Intent",
    )
    assert rec["reason"]
    assert deltas.structured() == {("prompt", "default"): 1}


async def test_invalid_twice_without_default_raises_with_context(faux, cache, deltas) -> None:
    faux.set_responses([faux_assistant_message([faux_tool_call("Intent", {"intent": "x"})])] * 2)
    with pytest.raises(StructuredOutputError) as info:
        await complete_structured(faux.get_model(), ctx(), Intent, mode="tool", cache=cache)
    err = info.value
    assert (err.tier, err.raw, err.output_type) == ("tool", '{"intent": "x"}', "Intent")
    assert "intent: Input should be 'REFUND_REQUEST', 'ORDER_QUERY' or 'UNKNOWN'" in err.reason
    assert deltas.structured() == {("tool", "failed"): 1}


async def test_tool_tier_without_the_output_call_is_invalid(faux, cache, deltas) -> None:
    faux.set_responses([text(json.dumps(GOOD)), faux_assistant_message([faux_tool_call("Intent", GOOD)])])
    out = await run_structured(faux.get_model(), ctx(), Intent, mode="tool", cache=cache)
    assert (out.outcome, out.reason) == ("corrected", "no call of the output tool 'Intent'")
    assert deltas.structured() == {("tool", "corrected"): 1}


async def test_retry_bounded_by_injectable_clock(faux, cache, deltas) -> None:
    never = asyncio.Event()
    asked: list[float] = []

    async def hang(context: Any, options: Any) -> Any:
        await never.wait()
        raise AssertionError("unreachable")

    async def fake_sleep(seconds: float) -> None:
        asked.append(seconds)  # the deadline fires at once: no real waiting

    faux.set_responses([text("not json"), hang])
    out = await run_structured(faux.get_model(), ctx(), Intent, mode="prompt", cache=cache, sleep=fake_sleep)
    assert (out.outcome, out.reason, asked) == ("failed", "retry failed: timeout after 30.0 s", [30.0])
    assert deltas.structured() == {("prompt", "failed"): 1}


async def test_cancellation_raises_even_with_default(faux, cache, deltas) -> None:
    ctl = AbortController()

    async def cancel_then_hang(context: Any, options: Any) -> Any:
        ctl.abort("user cancelled")
        await asyncio.Event().wait()

    faux.set_responses([cancel_then_hang])
    with pytest.raises(StructuredOutputError) as info:
        await complete_structured(
            faux.get_model(),
            ctx(),
            Intent,
            options=StreamOptions(signal=ctl.signal),
            default=SAFE,
            cache=cache,
        )
    assert (info.value.reason, info.value.tier) == ("aborted", "native")
    assert deltas.structured() == {("native", "failed"): 1}


async def test_provider_error_is_not_a_capability_downgrade(faux, cache, deltas) -> None:
    faux.set_responses([error("connection reset by peer")])
    value = await complete_structured(faux.get_model(), ctx(), Intent, default=SAFE, cache=cache)
    assert value == SAFE
    assert (faux.call_count, deltas.downgrades()) == (1, {})
    assert deltas.structured() == {("native", "default"): 1}


async def test_probe_capability_caches(faux, cache) -> None:
    faux.set_responses(
        [
            error("HTTP 400 unsupported response_format"),
            faux_assistant_message([faux_tool_call("probe", {"ok": True})]),
        ]
    )
    model = faux.get_model()
    assert await probe_capability(model, cache=cache) == "tool"
    assert await probe_capability(model, cache=cache) == "tool"
    assert faux.call_count == 2


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("HTTP 400: response_format json_schema is not supported by this model", True),
        ("HTTP 400: tool_choice is not supported", True),
        ("HTTP 422: Extra inputs are not permitted", True),
        ("HTTP 400: This model's maximum context length is 8192 tokens", False),
        ("HTTP 400: prompt is too long: 210000 tokens > 200000 maximum", False),
        ("HTTP 404: model_not_found: The model `gpt-9` does not exist", False),
        ("HTTP 401: invalid api key", False),
        ("HTTP 503 overloaded", False),
        ("connection reset by peer", False),
    ],
)
def test_capability_error_classification(message: str, expected: bool) -> None:
    from runtime.reply.capability import is_capability_error

    assert is_capability_error(message) is expected


async def test_context_length_400_is_not_a_downgrade(faux, cache, deltas) -> None:
    """One over-long prompt must not demote the model for good (the downgrade is cached)."""
    faux.set_responses([error("HTTP 400: This model's maximum context length is 8192 tokens")])
    value = await complete_structured(faux.get_model(), ctx(), Intent, default=SAFE, cache=cache)
    assert (value, faux.call_count, cache.get(faux.get_model())) == (SAFE, 1, None)
    assert deltas.downgrades() == {}
    assert deltas.structured() == {("native", "default"): 1}

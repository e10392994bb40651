"""Example contracts ``IntentResult`` and ``ActionDecision`` (docs/decisions.md#structured-tiers)
through :func:`runtime.reply.structured.complete_structured`, driven by the scripted faux model.

Run it: ``.venv/bin/python examples/contracts.py`` (offline; prints one line per scenario).

The scenarios are a digital-human customer service ("I want to return the shoes I
bought yesterday, I can't remember the order number"):

1. ``IntentResult`` at the native tier, valid on the first try.
2. ``ActionDecision`` whose first answer drifts (``"intention"``, ``"confidence": "high"`` style
   mistakes) and is corrected by the one retry that carries the validation error.
3. ``IntentResult`` that stays invalid: the safe default ``UNKNOWN`` / ``need_human=True`` is used,
   and the fallback is logged and counted — never silent.
4. ``ActionDecision`` that stays invalid without a default: ``StructuredOutputError`` with the raw
   output, the reason and the tier.
"""

from __future__ import annotations

import asyncio
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

if __package__ in (None, ""):  # allow `python examples/contracts.py` from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from providers.faux import (
    faux_assistant_message,
    faux_text,
    faux_tool_call,
    register_faux_provider,
    unregister_faux_provider,
)
from runtime import Context, UserMessage
from runtime.reply.capability import CapabilityCache
from runtime.reply.structured import StructuredOutputError, complete_structured, run_structured

__all__ = ["SAFE_INTENT", "Action", "ActionDecision", "Intent", "IntentResult", "run_demo"]


class Intent(StrEnum):
    """Allowed intents."""

    REFUND_REQUEST = "REFUND_REQUEST"
    ORDER_QUERY = "ORDER_QUERY"
    COMPLAINT = "COMPLAINT"
    SMALL_TALK = "SMALL_TALK"
    UNKNOWN = "UNKNOWN"


class Action(StrEnum):
    """Allowed actions: a whitelist enum, never a free verb."""

    QUERY_ORDER = "QUERY_ORDER"
    CREATE_TICKET = "CREATE_TICKET"
    TRANSFER_HUMAN = "TRANSFER_HUMAN"
    ASK_CLARIFY = "ASK_CLARIFY"
    RENDER_CARD = "RENDER_CARD"


class IntentResult(BaseModel):
    """What the user wants; ``confidence`` is a number in [0, 1], never ``"high"``."""

    model_config = ConfigDict(extra="forbid")

    intent: Intent
    confidence: float = Field(ge=0.0, le=1.0)
    slots: dict[str, str]
    """Extracted slots, e.g. ``{"product": "shoes"}``."""
    need_human: bool


class ActionDecision(BaseModel):
    """The next step of the agent as a state-machine jump."""

    model_config = ConfigDict(extra="forbid")

    action: Action
    arguments: dict[str, str]
    reason: str


SAFE_INTENT = IntentResult(intent=Intent.UNKNOWN, confidence=0.0, slots={}, need_human=True)
"""The safe default of an explicit fallback (docs/decisions.md#structured-one-retry)."""

USER = "我昨天买的那双鞋要退，订单号记不清了"


def _context(task: str) -> Context:
    return Context(
        system_prompt=f"You are Xiao An, a customer-service agent. {task}",
        messages=[UserMessage(content=USER, timestamp=0)],
    )


async def run_demo() -> dict[str, Any]:
    """Run the four scenarios against a scripted faux model; return what each produced.

    Returns:
        ``{"intent": IntentResult, "action": (ActionDecision, outcome, reason), "fallback":
        IntentResult, "error": (reason, raw, tier), "calls": int}``.
    """
    good_intent = {
        "intent": "REFUND_REQUEST",
        "confidence": 0.9,
        "slots": {"product": "鞋"},
        "need_human": False,
    }
    drift = {"action": "query the order", "arguments": {}, "reason": "user wants a refund"}
    good_action = {"action": "ASK_CLARIFY", "arguments": {"missing": "order_id"}, "reason": "no order number"}
    handle = register_faux_provider(
        [
            faux_assistant_message([faux_text(json.dumps(good_intent, ensure_ascii=False))]),  # 1
            faux_assistant_message([faux_tool_call("ActionDecision", drift)]),  # 2: invalid enum
            faux_assistant_message([faux_tool_call("ActionDecision", good_action)]),  # 2: retry ok
            faux_assistant_message([faux_text('{"intention": "退货", "confidence": "high"}')]),  # 3
            faux_assistant_message([faux_text('好的！{"intent": "REFUND_REQUEST"}')]),  # 3: retry
            faux_assistant_message([faux_text("```json\n{}\n```")]),  # 4
            faux_assistant_message([faux_text("```json\n{}\n```")]),  # 4: retry
        ],
        provider="contracts-demo",
        models=["demo-model"],
    )
    try:
        model = handle.get_model()
        cache = CapabilityCache()
        intent = await complete_structured(
            model, _context("Classify the intent."), IntentResult, mode="native", cache=cache
        )
        action = await run_structured(
            model, _context("Decide the next action."), ActionDecision, mode="tool", cache=cache
        )
        fallback = await complete_structured(
            model,
            _context("Classify the intent."),
            IntentResult,
            mode="prompt",
            default=SAFE_INTENT,
            cache=cache,
        )
        try:
            await complete_structured(model, _context("Decide."), ActionDecision, mode="prompt", cache=cache)
            error: tuple[str, str, str] = ("", "", "")
        except StructuredOutputError as exc:
            error = (exc.reason, exc.raw, exc.tier)
        return {
            "intent": intent,
            "action": (action.value, action.outcome, action.reason),
            "fallback": fallback,
            "error": error,
            "calls": handle.call_count,
        }
    finally:
        unregister_faux_provider("contracts-demo")


def main() -> None:
    """Print the demo's results."""
    out = asyncio.run(run_demo())
    print("1 first try :", out["intent"].model_dump_json())
    value, outcome, reason = out["action"]
    print(f"2 {outcome:10}:", value.model_dump_json(), "| first error:", reason)
    print("3 default   :", out["fallback"].model_dump_json())
    print("4 error     :", out["error"])
    print("LLM calls   :", out["calls"])


if __name__ == "__main__":
    main()

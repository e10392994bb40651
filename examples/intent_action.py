"""Intent + action decision with :func:`runtime.reply.complete_structured`: every tier (native →
tool → prompt) and every fallback branch, on the faux model (which fakes only the model's answers;
the tiers, validation, retry, downgrades, logs and counters are the real ones).

Run it: ``.venv/bin/python examples/intent_action.py`` (offline; one line per scenario).

The decision is a small closed pydantic model — an ``Intent`` enum, an ``Action`` enum and string
``arguments`` — so a model can neither invent an intent nor a verb
(docs/decisions.md#structured-tiers). Each scenario starts from a fresh capability cache in
``mode="auto"`` unless it says otherwise, so the tier chain is visible. The cache takes one
off-schema answer as enough evidence (``downgrade_after=1``; a session's cache uses
``ai.downgrade_after``, default 2, and retries at the same tier until then):

=====================  =====================================================================
scenario               what the fake model does → what the caller gets
=====================  =====================================================================
``native``             valid JSON under the native schema → the decision (``first_try``)
``native_rejected``    HTTP 400 "response_format not supported" → downgrade to ``tool`` → valid call
``native_ignored``     200 with prose under the schema → downgrade to ``tool`` → no output call →
                       the one retry (with the error) calls it → ``corrected``
``tool_rejected``      (model known at ``tool``) HTTP 400 on ``tool_choice`` → downgrade to
                       ``prompt`` → invalid twice → the safe default (``TRANSFER_HUMAN``)
``prompt_invalid``     (model known at ``prompt``) invalid twice, no default →
                       ``StructuredOutputError`` (raw, reason, tier)
``provider_error``     HTTP 503 (not a capability problem: no downgrade) → ``StructuredOutputError``
``retry_timeout``      invalid, then the retry hangs past its deadline → ``StructuredOutputError``
``cancelled``          the caller cancels → ``StructuredOutputError("aborted")`` even with a default
=====================  =====================================================================
"""

from __future__ import annotations

import asyncio
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

if __package__ in (None, ""):  # allow `python examples/intent_action.py` from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from providers.faux import (
    FauxProviderHandle,
    faux_assistant_message,
    faux_text,
    faux_tool_call,
    register_faux_provider,
    unregister_faux_provider,
)
from runtime import AbortController, Context, StreamOptions, UserMessage
from runtime.reply import StructuredOutputError, complete_structured
from runtime.reply.capability import CapabilityCache, Tier
from runtime.reply.structured import run_structured

__all__ = ["SAFE_DECISION", "Action", "Decision", "Intent", "run_demo"]

PROVIDER = "intent-action-demo"


class Intent(StrEnum):
    """What the user wants."""

    REFUND = "REFUND"
    ORDER_STATUS = "ORDER_STATUS"
    SMALL_TALK = "SMALL_TALK"
    UNKNOWN = "UNKNOWN"


class Action(StrEnum):
    """What the agent does next: a whitelist, never a free verb."""

    ASK_ORDER_ID = "ASK_ORDER_ID"
    LOOKUP_ORDER = "LOOKUP_ORDER"
    REPLY = "REPLY"
    TRANSFER_HUMAN = "TRANSFER_HUMAN"


class Decision(BaseModel):
    """One intent + action decision (closed: no extra keys)."""

    model_config = ConfigDict(extra="forbid")

    intent: Intent
    action: Action
    arguments: dict[str, str]


SAFE_DECISION = Decision(intent=Intent.UNKNOWN, action=Action.TRANSFER_HUMAN, arguments={})
"""The explicit fallback when the model cannot produce a valid decision."""

GOOD = {"intent": "REFUND", "action": "ASK_ORDER_ID", "arguments": {"product": "shoes"}}
DRIFT = '{"intent": "refund", "action": "ask for the order id", "arguments": {}}'


def _text(text: str) -> Any:
    return faux_assistant_message([faux_text(text)])


def _call(arguments: dict[str, Any]) -> Any:
    return faux_assistant_message([faux_tool_call("Decision", arguments)])


def _error(message: str) -> Any:
    return faux_assistant_message([], "error", error_message=message)


def _context() -> Context:
    return Context(
        system_prompt="You route customer messages: decide the intent and the next action.",
        messages=[UserMessage(content="I want to return the shoes I bought yesterday", timestamp=0)],
    )


async def _hang(context: Context, options: Any) -> Any:
    await asyncio.Event().wait()  # never answers: the retry's deadline ends it


async def _scenario(
    handle: FauxProviderHandle, steps: list[Any], *, known: Tier | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Run one decision; return what the caller saw (value or error) and how it went."""
    handle.set_responses(steps)
    cache = CapabilityCache(downgrade_after=1)
    model = handle.get_model()
    if known is not None:
        cache.record(model, known)
    before = handle.call_count
    out: dict[str, Any] = {}
    if kwargs.pop("outcome", False):  # the full story: tier, outcome, downgrades
        story = await run_structured(model, _context(), Decision, cache=cache, **kwargs)
        out.update(value=story.value, tier=story.tier, outcome=story.outcome, downgrades=story.downgrades)
    else:
        try:
            out["value"] = await complete_structured(model, _context(), Decision, cache=cache, **kwargs)
        except StructuredOutputError as exc:
            out["error"] = {"reason": exc.reason, "raw": exc.raw, "tier": exc.tier}
    out["calls"] = handle.call_count - before
    out["cached_tier"] = cache.get(model)
    return out


async def _no_wait(seconds: float) -> None:
    """The deadline timer of ``retry_timeout``: fires at once (the demo does not wait 30 s)."""


async def run_demo() -> dict[str, dict[str, Any]]:
    """Run every scenario of the module docstring against one faux model.

    Returns:
        ``{scenario: {"value" | "error", "calls", "cached_tier", ...}}``; ``error`` is
        ``{"reason", "raw", "tier"}`` of the :class:`StructuredOutputError`.
    """
    handle = register_faux_provider([], provider=PROVIDER, models=["decider"])
    try:
        s: dict[str, dict[str, Any]] = {}
        s["native"] = await _scenario(handle, [_text(json.dumps(GOOD))], outcome=True)
        s["native_rejected"] = await _scenario(
            handle,
            [_error("HTTP 400: response_format json_schema is not supported by this model"), _call(GOOD)],
            outcome=True,
        )
        s["native_ignored"] = await _scenario(
            handle,
            [_text("Sure! The customer wants a refund."), _text("I think REFUND."), _call(GOOD)],
            outcome=True,
        )
        s["tool_rejected"] = await _scenario(
            handle,
            [_error("HTTP 400: tool_choice is not supported"), _text(DRIFT), _text("```json\n{}\n```")],
            known="tool",
            default=SAFE_DECISION,
            outcome=True,
        )
        s["prompt_invalid"] = await _scenario(handle, [_text(DRIFT), _text(DRIFT)], known="prompt")
        s["provider_error"] = await _scenario(handle, [_error("HTTP 503: overloaded")])
        s["retry_timeout"] = await _scenario(
            handle, [_text(DRIFT), _hang], known="prompt", sleep=_no_wait, retry_timeout=30.0
        )
        ctl = AbortController()
        ctl.abort("the user left")
        s["cancelled"] = await _scenario(
            handle, [_hang], options=StreamOptions(signal=ctl.signal), default=SAFE_DECISION
        )
        return s
    finally:
        unregister_faux_provider(PROVIDER)


def main() -> None:
    """Print one line per scenario."""
    for name, out in asyncio.run(run_demo()).items():
        if "error" in out:
            err = out["error"]
            what = f"StructuredOutputError at {err['tier']}: {err['reason']}"
        else:
            value = out["value"].model_dump_json()
            path = " → ".join([*(src for src, _ in out["downgrades"]), out["tier"]])
            what = f"{out['outcome']} via {path}: {value}"
        print(f"{name:16} {what} ({out['calls']} calls)")


if __name__ == "__main__":
    main()

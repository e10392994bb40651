"""The context budget inside a real (Ray-free) session turn: SessionCore + SQLite + the faux model
(docs/decisions.md#agent-context-budget). A group chat of 500 stored messages (chatter never
addressed to the bot, answered mentions with tool calls) after a compaction summary: the turn's
LLM call gets the summary, the newest history that fits and the current message, within the
budget; the per-model override wins; ``null`` sends everything; reported usage calibrates the
next turn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from providers.faux import (
    FauxCall,
    FauxProviderHandle,
    faux_assistant_message,
    faux_text,
    faux_tool_call,
    register_faux_provider,
)
from runtime.agent.context_budget import CALIBRATION, DEFAULT_BUDGET_TOKENS, BudgetPolicy
from runtime.config import AiConfig
from runtime.config.ai import DEFAULT_CONTEXT_BUDGET_TOKENS
from runtime.llm.tokens import estimate_request_tokens
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Context,
    CustomMessage,
    Message,
    TextContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.memory.transcripts import TranscriptStore
from runtime.reply.sender import SUMMARY_INTRO, convert_for_llm
from runtime.session.chat_history import make_chat_history_tool
from runtime.session.context_window import budget_policy
from runtime.session.core import SessionCore
from runtime.session.turn import SessionSetup, TurnInput
from tests.session.recorder import Recorder

KEY = "onebot11:10001:group:300"
SUMMARY = "Earlier: Alice asked about coupons; Bob likes tea."


def reply(text: str) -> AssistantMessage:
    segments = [{"type": "text", "data": {"text": text}}]
    return faux_assistant_message([faux_text(json.dumps({"segments": segments}))])


def turn(seq: int, text: str) -> TurnInput:
    return TurnInput(
        seq=seq,
        session_key=KEY,
        platform="onebot11",
        bot_id="10001",
        message_id=f"now-{seq}",
        scene_type="group",
        scene_id="300",
        sender={"id": "42", "name": "Carol", "roles": []},
        text=text,
        segments=[{"type": "text", "data": {"text": text}}],
        time_ms=1_700_000_000_000,
    )


def group_chat(n: int) -> list[AgentMessage]:
    """``n`` stored messages: group chatter never addressed to the bot, and every 7th position an
    answered mention (inbound marker, the mention, a tool call, its result, the answer)."""
    out: list[AgentMessage] = []
    i = 0
    while len(out) < n:
        who = {"id": str(1000 + i % 9), "name": f"user{i % 9}", "roles": []}
        if i % 7 == 6:
            out += [
                CustomMessage(custom_type="im_inbound", data={"message_id": f"old-{i}", "seq": i}),
                UserMessage(content=f"@bot question {i:04d} about the weather", sender=who),
                AssistantMessage(
                    content=[ToolCall(id=f"call{i}", name="weather", arguments={"city": f"c{i}"})],
                    stop_reason="toolUse",
                ),
                ToolResultMessage(
                    tool_call_id=f"call{i}", tool_name="weather", content=[TextContent(text="sunny " * 30)]
                ),
                AssistantMessage(content=[TextContent(text=f"answer {i:04d}: it is sunny today")]),
            ]
        else:
            out.append(UserMessage(content=f"chatter {i:04d} " + "blah " * 12, sender=who))
        i += 1
    return out[:n]


def sent_tokens(call: FauxCall) -> int:
    """The estimate of a request as the faux model received it (the reply contract's system
    prompt addition and output schema included)."""
    options = call.options
    return estimate_request_tokens(call.context, options.output_schema if options is not None else None)


@pytest.fixture
def faux() -> Iterator[FauxProviderHandle]:
    CALIBRATION.reset()
    handle = register_faux_provider(provider="ctxb", models=["main", "small"])
    yield handle
    handle.unregister()
    CALIBRATION.reset()


@pytest.fixture
async def chat(tmp_path: Path) -> Any:
    """A session with 40 summarized messages, then 500 stored ones; yields the repository, the
    stored messages after the summary as the model is sent them, and a function reading them again."""
    db = Database(f"sqlite:///{tmp_path / 'budget.db'}")
    db.create_tables()
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    ids = await repo.append_messages(sid, group_chat(40))
    await repo.add_summary(sid, SUMMARY, ids[-1])
    await repo.append_messages(sid, group_chat(500))

    async def sent_form() -> list[Message]:
        """The stored messages after the summary's anchor, as the model is sent them."""
        return convert_for_llm([s.message for s in await repo.load_stored(sid, after_id=ids[-1])], "group")

    yield repo, await sent_form(), sent_form
    db.dispose()


async def run(repo: Any, setup: SessionSetup, *texts: str) -> SessionCore:
    core = await SessionCore.open(KEY, repo, setup, Recorder(), max_concurrent_turns=1)
    for seq, text in enumerate(texts, start=1):
        result = await core.submit(turn(seq, text))
        assert result.outcome == "ok", result
    return core


def history_of(ctx: Context, stored: list[Message]) -> list[Message]:
    """The sent history (between the summary and the current message); asserts it is the newest
    stored messages, contiguous, and that the cut lies between whole tool units."""
    first, *history, last = ctx.messages
    assert isinstance(first, UserMessage) and str(first.content).startswith(SUMMARY_INTRO)
    assert SUMMARY in str(first.content)
    assert isinstance(last, UserMessage) and isinstance(last.content, str)
    assert history == stored[len(stored) - len(history) :]
    if history:
        assert not isinstance(history[0], ToolResultMessage)
        before = stored[len(stored) - len(history) - 1]
        assert not (isinstance(before, AssistantMessage) and before.tool_calls())  # no call cut off
    calls = [c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls()]
    results = [m.tool_call_id for m in history if isinstance(m, ToolResultMessage)]
    assert calls == results and "interrupted" not in json.dumps([m.model_dump() for m in history])
    return history


async def test_long_group_chat_sends_summary_newest_history_and_current_within_budget(
    chat: Any, faux: FauxProviderHandle
) -> None:
    repo, stored, _ = chat
    faux.set_responses([reply("done")])
    setup = SessionSetup(
        model=faux.get_model("main"), system_prompt="Be brief.", context_budget=BudgetPolicy(3000)
    )
    core = await run(repo, setup, "what is the weather?")
    ctx = faux.calls[0].context
    assert 3000 - 200 < sent_tokens(faux.calls[0]) <= 3000  # filled up to the budget, never over
    assert "Be brief." in (ctx.system_prompt or "")
    history = history_of(ctx, stored)
    assert 20 < len(history) < len(stored) / 2
    assert any(isinstance(m, ToolResultMessage) for m in history)
    assert any(isinstance(m, UserMessage) and "chatter" in str(m.content) for m in history)
    current = ctx.messages[-1]
    assert isinstance(current, UserMessage) and str(current.content).endswith("] what is the weather?")
    # what was left out stays in SQL
    assert await repo.count_messages(core.session_id) >= 540


async def test_the_per_model_override_wins(chat: Any, faux: FauxProviderHandle) -> None:
    repo, stored, _ = chat
    faux.set_responses([reply("done")])
    policy = BudgetPolicy(8000, {"ctxb/small": 2500})  # ~1,900 of them: the reply contract's schema
    await run(repo, SessionSetup(model=faux.get_model("small"), context_budget=policy), "hello?")
    assert 2500 - 200 < sent_tokens(faux.calls[0]) <= 2500
    assert 0 < len(history_of(faux.calls[0].context, stored)) < 40


@pytest.mark.parametrize("policy", [BudgetPolicy(None), BudgetPolicy(100, {"ctxb/main": None})])
async def test_a_null_budget_sends_every_message(
    chat: Any, faux: FauxProviderHandle, policy: BudgetPolicy
) -> None:
    repo, stored, _ = chat
    faux.set_responses([reply("done")])
    await run(repo, SessionSetup(model=faux.get_model("main"), context_budget=policy), "all?")
    assert history_of(faux.calls[0].context, stored) == stored


async def test_reported_usage_shrinks_the_next_window(chat: Any, faux: FauxProviderHandle) -> None:
    repo, stored, sent_form = chat

    def reports_double(context: Context, options: Any) -> AssistantMessage:
        msg = reply("done")
        msg.usage = Usage(input=2 * sent_tokens(FauxCall(faux.get_model("main"), context, options)))
        return msg

    faux.set_responses([reports_double, reply("again")])
    setup = SessionSetup(model=faux.get_model("main"), context_budget=BudgetPolicy(6000))
    await run(repo, setup, "first?", "second?")
    first, second = faux.calls
    assert sent_tokens(first) > 3000
    assert CALIBRATION.factor("ctxb/main") == 2.0
    assert 6000 - 400 < 2 * sent_tokens(second) <= 6000  # the calibrated estimate fills the budget
    now_stored = await sent_form()  # with both turns: the second call saw the first turn's
    cut = next(i for i, m in enumerate(now_stored) if str(getattr(m, "content", "")).endswith("] second?"))
    now_stored = now_stored[:cut]
    assert len(history_of(second.context, now_stored)) < len(history_of(first.context, stored))


async def test_a_left_out_message_is_still_found_by_chat_history(
    tmp_path: Path, faux: FauxProviderHandle
) -> None:
    db = Database(f"sqlite:///{tmp_path / 'history.db'}")
    db.create_tables()
    repo = ContextRepository(db)
    old = UserMessage(content="the coupon code is XYZ-42", sender={"id": "7", "name": "Dan", "roles": []})
    await TranscriptStore(db).record_inbound(
        message_id="old-1",
        platform="onebot11",
        bot_id="10001",
        scene_id="300",
        scene_type="group",
        sender_id="7",
        sender_name="Dan",
        text="the coupon code is XYZ-42",
        time_ms=1_700_000_000_000,
    )
    sid = await repo.get_or_create_active(KEY)
    await repo.append_messages(sid, [old, *group_chat(400)])
    faux.set_responses(
        [
            faux_assistant_message(faux_tool_call("chat_history", {"query": "coupon"}, id="h1")),
            reply("XYZ-42"),
        ]
    )
    tool = make_chat_history_tool(db, platform="onebot11", bot_id="10001", scene_id="300")
    setup = SessionSetup(model=faux.get_model("main"), tools=[tool], context_budget=BudgetPolicy(3000))
    await run(repo, setup, "what was the coupon code?")
    first, second = faux.calls
    assert "XYZ-42" not in json.dumps(first.context.model_dump())  # left out of the window
    found = second.context.messages[-1]
    assert isinstance(found, ToolResultMessage)
    text = "".join(b.text for b in found.content if isinstance(b, TextContent))
    assert "Dan (7): the coupon code is XYZ-42" in text
    db.dispose()


def test_config_keys_build_the_policy() -> None:
    ai = AiConfig.model_validate(
        {
            "agent": {"context_budget_tokens": 6000},
            "providers": {
                "p": {
                    "api": "faux",
                    "models": [
                        {"id": "small", "context_budget_tokens": 1500},
                        {"id": "open", "context_budget_tokens": None},
                        {"id": "plain"},
                    ],
                }
            },
        }
    )
    assert budget_policy(ai) == BudgetPolicy(6000, {"p/small": 1500, "p/open": None})
    assert budget_policy(AiConfig()) == BudgetPolicy(8000, {})
    assert DEFAULT_CONTEXT_BUDGET_TOKENS == DEFAULT_BUDGET_TOKENS  # the config spells the agent's default
    unbounded = AiConfig.model_validate({"agent": {"context_budget_tokens": None}})
    assert budget_policy(unbounded).default_tokens is None
    with pytest.raises(ValueError, match="context_budget_tokens"):
        AiConfig.model_validate({"agent": {"context_budget_tokens": 0}})

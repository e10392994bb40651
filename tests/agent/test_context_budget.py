"""The context budget step of the agent wing (docs/decisions.md#agent-context-budget): the window
choice (newest first, tool pairs whole, current turn never cut), the fixed part over budget, the
per-model policy, the calibration, and a real Agent run against the faux model."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from providers.faux import FauxProviderHandle, faux_assistant_message, register_faux_provider
from runtime.agent.agent import Agent
from runtime.agent.context_budget import (
    BudgetPolicy,
    TokenCalibration,
    chain_transforms,
    install_context_budget,
    select_window,
)
from runtime.llm.tokens import estimate_request_tokens
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Context,
    CustomMessage,
    Model,
    TextContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)


@pytest.fixture
def faux() -> Iterator[FauxProviderHandle]:
    handle = register_faux_provider(provider="budgetfaux", models=["m", "big"])
    yield handle
    handle.unregister()


def user(text: str) -> UserMessage:
    return UserMessage(content=text)


def said(text: str) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=text)])


def calls(*ids: str) -> AssistantMessage:
    return AssistantMessage(
        content=[ToolCall(id=i, name="lookup", arguments={}) for i in ids], stop_reason="toolUse"
    )


def result(call_id: str) -> ToolResultMessage:
    return ToolResultMessage(tool_call_id=call_id, tool_name="lookup", content=[TextContent(text="r")])


# ------------------------------------------------------------------ select_window (pure)


def test_window_is_newest_first_and_keeps_a_tool_batch_whole() -> None:
    msgs: list[AgentMessage] = [
        user("u0"),  # 0
        said("a1"),  # 1
        user("u2"),  # 2
        calls("c1", "c2"),  # 3
        result("c1"),  # 4
        result("c2"),  # 5
        said("a6"),  # 6
        user("now"),  # 7: the current turn
    ]
    costs = [10] * len(msgs)
    # a message-by-message cut at 45 would start at the result of c2 (index 5); the batch 3-5 goes
    # whole or not at all, and without it the oldest kept unit (a6) is an assistant message
    w = select_window(msgs, costs, budget_tokens=45, fixed_tokens=0, current_start=7)
    assert w.messages == [msgs[7]]
    assert (w.estimated_tokens, w.left_out, w.over_budget) == (10, 7, False)
    # room for the batch and the user message before it: 2..7
    w = select_window(msgs, costs, budget_tokens=60, fixed_tokens=0, current_start=7)
    assert w.messages == msgs[2:]
    assert (w.estimated_tokens, w.left_out) == (60, 2)
    # the fixed part counts: 20 tokens of system prompt + tools leave room for 2..7 only at 80
    w = select_window(msgs, costs, budget_tokens=79, fixed_tokens=20, current_start=7)
    assert w.messages == [msgs[7]]
    w = select_window(msgs, costs, budget_tokens=80, fixed_tokens=20, current_start=7)
    assert w.messages == msgs[2:]


def test_window_never_starts_on_a_tool_result_even_when_history_opens_with_one() -> None:
    msgs: list[AgentMessage] = [result("orphan"), user("u1"), said("a2"), user("now")]
    w = select_window(msgs, [10] * 4, budget_tokens=30, fixed_tokens=0, current_start=3)
    assert w.messages == msgs[1:]


def test_pinned_summary_and_current_turn_are_always_sent() -> None:
    summary = CustomMessage(custom_type="summary", data={"summary": "old"})
    msgs: list[AgentMessage] = [summary, user("u1"), said("a2"), user("u3"), said("a4")]
    msgs += [user("now"), calls("t1"), result("t1")]  # the current turn: prompt + its tool batch
    costs = [50, 10, 10, 10, 10, 10, 10, 10]
    pinned: Callable[[AgentMessage], bool] = lambda m: isinstance(m, CustomMessage)  # noqa: E731
    w = select_window(msgs, costs, budget_tokens=100, fixed_tokens=0, current_start=5, pinned=pinned)
    assert w.messages == [summary, msgs[3], msgs[4], *msgs[5:]]  # with a summary, a4 alone may open
    assert w.estimated_tokens == 100
    # over budget: summary + current turn are sent anyway, with no history
    w = select_window(msgs, costs, budget_tokens=60, fixed_tokens=0, current_start=5, pinned=pinned)
    assert w.messages == [summary, *msgs[5:]]
    assert (w.over_budget, w.left_out, w.estimated_tokens) == (True, 4, 80)


def test_zero_cost_markers_ride_along_and_are_not_counted_as_left_out() -> None:
    marker = CustomMessage(custom_type="im_inbound", data={"message_id": "x"})
    msgs: list[AgentMessage] = [user("u0"), said("a1"), marker, user("u2"), said("a3"), user("now")]
    costs = [10, 10, 0, 10, 10, 10]
    w = select_window(msgs, costs, budget_tokens=30, fixed_tokens=0, current_start=5)
    assert w.messages == [msgs[3], msgs[4], msgs[5]]  # a3 alone would open with the assistant
    assert w.left_out == 2  # u0, a1 (the marker is never sent)


def test_null_budget_keeps_everything_and_calibration_scales_the_limit() -> None:
    msgs: list[AgentMessage] = [user("u0"), said("a1"), user("u2"), said("a3"), user("now")]
    costs = [10] * 5
    w = select_window(msgs, costs, budget_tokens=None, fixed_tokens=5, current_start=4)
    assert (w.messages, w.estimated_tokens, w.left_out) == (msgs, 55, 0)
    assert select_window(msgs, costs, budget_tokens=60, fixed_tokens=0, current_start=4).messages == msgs
    # the provider counts twice the estimate: the same budget holds half as many raw tokens
    w = select_window(msgs, costs, budget_tokens=60, fixed_tokens=0, current_start=4, factor=2.0)
    assert w.messages == msgs[2:]
    with pytest.raises(ValueError, match="costs"):
        select_window(msgs, costs[:2], budget_tokens=50, fixed_tokens=0, current_start=4)


def test_a_cost_function_is_asked_only_as_far_as_the_window_reaches() -> None:
    msgs: list[AgentMessage] = [user(f"u{i}") if i % 2 == 0 else said(f"a{i}") for i in range(1000)]
    asked: list[int] = []

    def cost(i: int) -> int:
        asked.append(i)
        return 10

    w = select_window(msgs, cost, budget_tokens=100, fixed_tokens=0, current_start=998)
    assert w.messages == msgs[990:]
    assert min(asked) >= 980 and len(asked) < 30  # the 980 older messages were never measured


# ------------------------------------------------------------------ policy, calibration, chain


def test_policy_per_model_override_wins_and_null_means_no_budget() -> None:
    policy = BudgetPolicy(8000, {"p/small": 500, "p/unbounded": None})
    assert policy.tokens_for(Model(id="small", api="faux", provider="p")) == 500
    assert policy.tokens_for(Model(id="unbounded", api="faux", provider="p")) is None
    assert policy.tokens_for(Model(id="other", api="faux", provider="p")) == 8000
    assert BudgetPolicy(None).tokens_for(Model(id="x", api="faux")) is None
    with pytest.raises(ValueError, match=">= 1"):
        BudgetPolicy(0)
    with pytest.raises(ValueError, match="p/x"):
        BudgetPolicy(10, {"p/x": -1})


def test_calibration_is_bounded_and_smoothed() -> None:
    cal = TokenCalibration(low=0.5, high=4.0, smoothing=0.5)
    assert cal.factor("p/m") == 1.0
    assert cal.observe("p/m", 100, 300) == 3.0  # first observation: taken as it is
    assert cal.observe("p/m", 100, 100) == 2.0  # then an average: 3 + 0.5 × (1 - 3)
    assert cal.observe("p/m", 100, 10_000) == 3.0  # 100× is clamped to 4
    assert cal.observe("p/m", 0, 50) is None and cal.observe("p/m", 50, 0) is None
    assert cal.factor("p/m") == 3.0 and cal.factor("p/other") == 1.0
    assert cal.observe("p/low", 100, 1) == 0.5
    cal.reset()
    assert cal.factor("p/m") == 1.0
    with pytest.raises(ValueError):
        TokenCalibration(low=2.0)


async def test_chain_runs_hooks_in_order_and_skips_none() -> None:
    async def first(messages: list[AgentMessage], signal: Any) -> list[AgentMessage]:
        return [*messages, user("first")]

    def second(messages: list[AgentMessage], signal: Any) -> list[AgentMessage]:
        return [*messages, user("second")]

    assert chain_transforms(None, None) is None
    assert chain_transforms(None, second) is second
    chained = chain_transforms(first, None, second)
    assert chained is not None
    out = await chained([user("x")], None)
    assert [m.content for m in out if isinstance(m, UserMessage)] == ["x", "first", "second"]


# ------------------------------------------------------------------ a real Agent run


def long_chat(n: int) -> list[AgentMessage]:
    """``n`` messages: a user message and an assistant answer in turn, each ~100 characters."""
    out: list[AgentMessage] = []
    for i in range(n):
        text = f"message {i:04d} " + "x" * 86
        out.append(user(text) if i % 2 == 0 else said(text))
    return out


def sent_tokens(ctx: Context) -> int:
    """The estimate of what the model was sent (system prompt, tools, rendered messages)."""
    return estimate_request_tokens(ctx)


def first_number(ctx: Context) -> int:
    text = ctx.messages[0].content
    assert isinstance(text, str)
    return int(text.split()[1])


async def test_agent_run_sends_the_newest_history_within_budget(
    faux: FauxProviderHandle, metric: Callable[..., float]
) -> None:
    history = long_chat(500)
    faux.set_responses([faux_assistant_message("ok")])
    agent = Agent(model=faux.get_model("m"), system_prompt="You are a bot. " * 20, messages=history)
    budget = install_context_budget(agent, BudgetPolicy(2000), calibration=TokenCalibration())
    await agent.prompt("the question now")
    ctx = faux.calls[0].context
    assert sent_tokens(ctx) <= 2000
    assert sent_tokens(ctx) > 2000 - 40  # filled: one more message (~30 tokens) would not fit
    assert ctx.messages[-1] == UserMessage(content="the question now", timestamp=ctx.messages[-1].timestamp)
    kept = ctx.messages[:-1]
    assert kept == history[len(history) - len(kept) :]  # the newest, contiguous
    assert isinstance(kept[0], UserMessage)
    assert budget.last is not None and budget.last.left_out == 500 - len(kept)
    assert metric("sessionray_llm_history_left_out_total", model="budgetfaux/m") == 500 - len(kept)
    assert metric("sessionray_llm_context_tokens_count", model="budgetfaux/m") == 1
    assert metric("sessionray_llm_context_tokens_sum", model="budgetfaux/m") == budget.last.estimated_tokens
    assert agent.state.messages[:500] == history  # nothing was removed from the context itself


async def test_reported_usage_calibrates_the_next_window(faux: FauxProviderHandle) -> None:
    cal = TokenCalibration()
    history = long_chat(300)

    def reports_triple(context: Context, options: Any) -> AssistantMessage:
        msg = faux_assistant_message("ok")
        msg.usage = Usage(input=3 * sent_tokens(context) - 100, cache_read=100)
        return msg

    faux.set_responses([reports_triple, faux_assistant_message("ok")])
    for question in ("first", "second"):
        agent = Agent(model=faux.get_model("m"), messages=history)
        install_context_budget(agent, BudgetPolicy(3000), calibration=cal)
        await agent.prompt(question)
    first, second = faux.calls[0].context, faux.calls[1].context
    assert cal.factor("budgetfaux/m") == pytest.approx(3.0, rel=0.01)
    assert 3 * sent_tokens(second) <= 3000 < 3 * sent_tokens(first)
    assert len(second.messages) < len(first.messages) / 2
    assert first_number(second) > first_number(first)  # still the newest, fewer of them


async def test_over_budget_sends_the_current_message_alone_and_logs_once(
    faux: FauxProviderHandle, metric: Callable[..., float], caplog: pytest.LogCaptureFixture
) -> None:
    faux.set_responses([faux_assistant_message("ok"), faux_assistant_message("ok")])
    caplog.set_level(logging.WARNING, logger="runtime.agent.context_budget")
    for _ in range(2):
        agent = Agent(model=faux.get_model("big"), system_prompt="rules " * 400, messages=long_chat(20))
        install_context_budget(agent, BudgetPolicy(8000, {"budgetfaux/big": 100}))
        await agent.prompt("help")
    for call in faux.calls:
        assert [m.content for m in call.context.messages if isinstance(m, UserMessage)] == ["help"]
        assert len(call.context.messages) == 1
    assert metric("sessionray_llm_context_over_budget_total", model="budgetfaux/big") == 2
    assert metric("sessionray_llm_history_left_out_total", model="budgetfaux/big") == 40
    assert len([r for r in caplog.records if "budgetfaux/big" in r.getMessage()]) == 1


async def test_an_async_converter_is_measured_too(faux: FauxProviderHandle) -> None:
    async def convert(messages: list[AgentMessage]) -> list[Any]:
        return [m for m in messages if not isinstance(m, CustomMessage)]

    faux.set_responses([faux_assistant_message("ok")])
    agent = Agent(model=faux.get_model("m"), messages=long_chat(200), convert_to_llm=convert)
    budget = install_context_budget(agent, BudgetPolicy(1000), calibration=TokenCalibration())
    await agent.prompt("q")
    assert sent_tokens(faux.calls[0].context) <= 1000 < sent_tokens(faux.calls[0].context) + 40
    assert budget.last is not None and budget.last.left_out > 150


# ------------------------------------------------------------------ the memo a session keeps


def test_a_kept_memo_chooses_every_window_as_a_fresh_choice_does() -> None:
    """docs/decisions.md#agent-incremental-convert: with the memo updated call by call as the
    context grows (and restarted when it does not), each window, its cost and its left-out count
    equal a choice made from nothing."""
    from runtime.agent.context_budget import BudgetMemo

    def pinned(m: AgentMessage) -> bool:
        return isinstance(m, CustomMessage) and m.custom_type == "summary"

    pattern: list[AgentMessage] = [
        CustomMessage(custom_type="summary", data={}),
        user("a"), said("b"), calls("c1", "c2"), result("c1"), result("c2"),
        CustomMessage(custom_type="im_reply", data={}), said("d"),
    ]  # fmt: skip
    context = [*pattern, *[m.model_copy() for _ in range(6) for m in pattern[1:]]]  # 50 messages
    costs = [(7 * i) % 23 + 1 for i in range(len(context))]
    memo = BudgetMemo(pinned)
    grown: list[AgentMessage] = []
    for n, m in enumerate(context, 1):
        grown.append(m)
        memo.update(list(grown))
        for budget in (None, 1, 40, 90, 200, 10_000):
            for start in {n - 1, max(0, n - 3), n}:
                kept = select_window(
                    grown, costs[:n], budget_tokens=budget, fixed_tokens=5, current_start=start, memo=memo
                )
                fresh = select_window(
                    grown, costs[:n], budget_tokens=budget, fixed_tokens=5, current_start=start, pinned=pinned
                )
                assert kept == fresh, (n, budget, start)
    assert memo.sent_before[-1] == sum(1 for m in context if not pinned(m) and m.role != "custom")
    shorter = context[1:10]  # the summary gone: not an extension
    memo.update(shorter)
    assert memo.pinned_at == [] and len(memo.costs) == 9

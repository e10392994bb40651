"""Attacks on the per-turn context budget (docs/decisions.md#agent-context-budget): an empty
context, a tool result far larger than the budget in history and in the current turn, and CJK
text whose estimate is calibrated by the provider's reported usage. Pure, no model."""

from __future__ import annotations

from runtime.agent.context_budget import TokenCalibration, select_window
from runtime.llm.tokens import estimate_tokens
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)


def costs(msgs: list[AgentMessage]) -> list[int]:
    return [estimate_tokens([m]) for m in msgs]


def tool_pair(call_id: str, result_chars: int) -> list[AgentMessage]:
    return [
        AssistantMessage(content=[ToolCall(id=call_id, name="fetch", arguments={})], stop_reason="toolUse"),
        ToolResultMessage(
            tool_call_id=call_id, tool_name="fetch", content=[TextContent(text="x" * result_chars)]
        ),
    ]


def test_an_empty_context_sends_only_the_fixed_part() -> None:
    w = select_window([], [], budget_tokens=100, fixed_tokens=30, current_start=0)
    assert (w.messages, w.estimated_tokens, w.left_out, w.over_budget) == ([], 30, 0, False)
    w = select_window([], [], budget_tokens=10, fixed_tokens=30, current_start=5)
    assert (w.messages, w.over_budget) == ([], True)


def test_a_huge_tool_result_in_history_is_left_out_with_its_call_and_nothing_older_is_sent() -> None:
    msgs: list[AgentMessage] = [
        UserMessage(content="old question"),
        *tool_pair("c1", 4_000_000),  # ~1M tokens
        AssistantMessage(content=[TextContent(text="old answer")]),
        UserMessage(content="new question"),
    ]
    w = select_window(msgs, costs(msgs), budget_tokens=1000, fixed_tokens=100, current_start=4)
    assert w.messages == [msgs[4]]  # the answer after the pair opens no window (assistant first)
    assert w.left_out == 4 and not w.over_budget and w.estimated_tokens <= 1000


def test_a_huge_tool_result_in_the_current_turn_is_sent_and_flagged_over_budget() -> None:
    msgs: list[AgentMessage] = [
        UserMessage(content="q0"),
        UserMessage(content="fetch it"),
        *tool_pair("c1", 400_000),
    ]
    w = select_window(msgs, costs(msgs), budget_tokens=1000, fixed_tokens=100, current_start=1)
    assert w.messages == msgs[1:] and w.over_budget and w.left_out == 1


def test_cjk_history_is_held_to_the_budget_once_reported_usage_calibrated_the_estimate() -> None:
    cjk = "你好，今天的会议改到下午三点了吗？请大家确认一下。"  # 25 chars: ~7 estimated, ~25 real tokens
    msgs: list[AgentMessage] = [UserMessage(content=cjk * 4) for _ in range(200)]
    cost = costs(msgs)
    raw_whole = sum(cost)
    real_per_estimated = 3.5  # what a CJK tokenizer reports per estimated token (~1 token/char)
    cal = TokenCalibration()
    for _ in range(8):
        cal.observe("p/m", raw_whole, int(raw_whole * real_per_estimated))
    f = cal.factor("p/m")
    assert 3.4 < f <= 3.5
    w = select_window(msgs, cost, budget_tokens=2000, fixed_tokens=50, current_start=199, factor=f)
    real_sent = w.estimated_tokens * real_per_estimated
    assert real_sent <= 2000 and w.left_out > 0
    assert w.messages[-1] is msgs[-1] and all(isinstance(m, UserMessage) for m in w.messages)

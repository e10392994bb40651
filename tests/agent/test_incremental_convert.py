"""The conversion kept across the calls of one growing context (docs/decisions.md#agent-incremental-convert):
the same messages as a full ``prepare_replay(convert(...))`` at every call, only the new messages
converted, a new start when the list is not an extension."""

from __future__ import annotations

from typing import Any

from runtime.agent.replay import IncrementalConvert, Prepared, default_convert_to_llm, prepare_replay
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    CustomMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)


def user(text: str) -> UserMessage:
    return UserMessage(content=text)


def calls(*ids: str, stop: str = "toolUse") -> AssistantMessage:
    return AssistantMessage(content=[ToolCall(id=i, name="t", arguments={}) for i in ids], stop_reason=stop)


def result(call_id: str) -> ToolResultMessage:
    return ToolResultMessage(tool_call_id=call_id, tool_name="t", content=[TextContent(text="ok")])


def answer(text: str, stop: str = "stop") -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=text)], stop_reason=stop)


def dumps(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages as data; a synthetic "interrupted" result is stamped when it is made, so the
    time is left out."""
    return [m.model_dump(exclude={"timestamp"}) for m in messages]


def full(messages: list[AgentMessage]) -> list[dict[str, Any]]:
    return dumps(prepare_replay(default_convert_to_llm(messages)))


class Counting:
    """``default_convert_to_llm`` that counts the messages it was given."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, messages: list[AgentMessage]) -> list[Any]:
        self.seen += len(messages)
        return default_convert_to_llm(messages)


# A context grown message by message through every replay case: an open call left without a
# result, an errored answer with its result, a duplicate and an orphan result, a host record.
GROWTH: list[AgentMessage] = [
    user("a"),
    calls("c1", "c2"),
    result("c1"),  # c2 stays open until the next message closes it
    user("b"),
    calls("c3", stop="error"),
    result("c3"),  # its call was dropped: orphan
    CustomMessage(custom_type="im_reply", data={"message_id": "m1"}),
    calls("c4"),
    result("c4"),
    result("c4"),  # duplicate
    answer("done"),
    user("c"),
]


def test_every_call_sends_what_a_full_conversion_sends_and_converts_only_the_new_messages() -> None:
    convert = Counting()
    view = IncrementalConvert(convert)
    context: list[AgentMessage] = []
    for n, m in enumerate(GROWTH, 1):
        context.append(m)
        out = view(list(context))  # a new list each call, as the loop's copy is
        assert isinstance(out, Prepared)
        assert dumps(out) == full(context), f"after {n} messages"
        assert convert.seen == n  # each message converted once
    # the open call c2 got its interrupted result when "b" closed it; c3's orphan result is gone
    ids = [m.tool_call_id for m in view(context) if isinstance(m, ToolResultMessage)]
    assert ids == ["c1", "c2", "c4"]


def test_the_result_of_an_open_call_is_given_at_the_end_and_dropped_once_its_result_comes() -> None:
    view = IncrementalConvert(default_convert_to_llm)
    context: list[AgentMessage] = [user("a"), calls("c1")]
    first = view(context)
    assert [m.role for m in first] == ["user", "assistant", "toolResult"] and first[-1].is_error
    context.append(result("c1"))
    second = view(context)
    assert [m.role for m in second] == ["user", "assistant", "toolResult"] and not second[-1].is_error


def test_a_list_that_does_not_extend_the_last_one_is_converted_from_the_start() -> None:
    convert = Counting()
    view = IncrementalConvert(convert)
    context: list[AgentMessage] = [user("a"), answer("x"), user("b")]
    view(context)
    compacted: list[AgentMessage] = [user("summary"), user("b")]  # the head replaced
    assert dumps(view(compacted)) == full(compacted)
    assert convert.seen == 5
    edited = [user("summary"), answer("y"), user("b")]  # same length, an item replaced
    assert dumps(view(edited)) == full(edited)
    assert convert.seen == 8
    assert view(edited[:1]) == [edited[0]]  # shorter: again from the start
    assert convert.seen == 9


def test_prepare_replay_of_a_whole_list() -> None:
    out = prepare_replay(GROWTH)
    assert [getattr(m, "tool_call_id", m.role) for m in out] == [
        "user", "assistant", "c1", "c2", "user", "custom", "assistant", "c4", "assistant", "user",
    ]  # fmt: skip

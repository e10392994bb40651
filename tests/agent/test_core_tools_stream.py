"""validate_tool_call / AgentTool, and the event-stream guarantees of runtime.llm.events.run_stream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from providers.faux import faux_assistant_message, register_faux_provider
from runtime import (
    AgentTool,
    AssistantMessage,
    Context,
    SimpleStreamOptions,
    ToolCall,
    ToolNotFoundError,
    ToolValidationError,
    UserMessage,
    complete_simple,
    stream_simple,
    validate_tool_call,
)
from runtime.llm.builder import MessageBuilder
from runtime.llm.events import AssistantMessageEventStream, ErrorEvent, run_stream
from runtime.llm.types import Model


class Inner(BaseModel):
    limit: int


class Params(BaseModel):
    city: str
    days: int = 1
    inner: Inner | None = None


async def _noop(call_id: str, params: Any, signal: Any, on_update: Any) -> str:
    return ""


TOOLS = [AgentTool("weather", "Weather.", Params, _noop), AgentTool("other", "", Inner, _noop)]


def call(arguments: Any) -> ToolCall:
    return ToolCall.model_construct(type="toolCall", id="c", name="weather", arguments=arguments)


def test_lax_validation_accepts_numeric_strings() -> None:
    assert validate_tool_call(TOOLS, call({"city": "Oslo", "days": "500"})) == Params(city="Oslo", days=500)
    assert validate_tool_call(TOOLS, call('{"city": "Rome"}')) == Params(city="Rome")


@pytest.mark.parametrize("arguments", ["", "  ", "null", None])
def test_empty_or_null_arguments_mean_empty_object(arguments: Any) -> None:
    with pytest.raises(ToolValidationError) as info:
        validate_tool_call(TOOLS, call(arguments))
    assert (
        str(info.value)
        == 'Validation failed for tool "weather":\n  - city: Field required\nReceived arguments: {}'
    )

    class Nothing(BaseModel):
        pass

    tools = [AgentTool("weather", "", Nothing, _noop)]
    assert validate_tool_call(tools, call(arguments)) == Nothing()


def test_error_names_tool_each_field_and_arguments() -> None:
    with pytest.raises(ToolValidationError) as info:
        validate_tool_call(TOOLS, call({"days": "x", "inner": {"limit": "?"}}))
    err = info.value
    assert (err.tool_name, err.arguments) == ("weather", {"days": "x", "inner": {"limit": "?"}})
    assert err.errors == [
        ("city", "Field required"),
        ("days", "Input should be a valid integer, unable to parse string as an integer"),
        ("inner.limit", "Input should be a valid integer, unable to parse string as an integer"),
    ]
    with pytest.raises(ToolValidationError, match=r"\(arguments\): tool arguments are not valid JSON"):
        validate_tool_call(TOOLS, call('{"city": '))
    with pytest.raises(ToolNotFoundError, match=r'Tool "nope" not found\. Available tools: weather, other'):
        validate_tool_call(TOOLS, ToolCall(id="x", name="nope"))


def test_each_to_tool_gets_a_schema_of_its_own() -> None:
    first = TOOLS[1].to_tool()
    first.parameters["properties"]["limit"]["type"] = "changed by a provider"
    first.parameters["required"].append("x")
    again = TOOLS[1].to_tool().parameters  # the cached schema is untouched
    assert again["properties"]["limit"] == {"title": "Limit", "type": "integer"}
    assert again["required"] == ["limit"]


def test_to_tool_gives_the_json_schema() -> None:
    tool = TOOLS[1].to_tool()
    assert tool.model_dump() == {
        "name": "other",
        "description": "",
        "parameters": {
            "properties": {"limit": {"title": "Limit", "type": "integer"}},
            "required": ["limit"],
            "title": "Inner",
            "type": "object",
        },
    }


MODEL = Model(id="m", api="test-api", provider="p")


async def test_run_stream_producer_without_terminal_event_ends_with_one_error() -> None:
    async def producer(s: AssistantMessageEventStream) -> None:
        MessageBuilder(s, MODEL).text_delta("hi")

    s = run_stream(producer, lambda exc: AssistantMessage(stop_reason="error", error_message=str(exc)))
    events = [e async for e in s]
    assert [e.type for e in events] == ["start", "text_start", "text_delta", "error"]
    assert events[-1].error.error_message == "provider stream ended without a done or error event"


async def test_events_after_the_terminal_event_are_ignored_and_result_needs_no_iteration() -> None:
    late = AssistantMessage(stop_reason="error", error_message="late failure")

    async def producer(s: AssistantMessageEventStream) -> None:
        b = MessageBuilder(s, MODEL)
        b.text_delta("a")
        b.finish()
        s.push(ErrorEvent(reason="error", error=late))  # ignored: the stream already ended

    s = run_stream(producer, lambda exc: AssistantMessage(stop_reason="error"))
    final = await s.result()
    assert (final.stop_reason, final.text()) == ("stop", "a")
    assert [e.type for e in [e async for e in s]] == ["start", "text_start", "text_delta", "text_end", "done"]


async def test_raising_and_cancelled_producers_become_error_events() -> None:
    async def boom(s: AssistantMessageEventStream) -> None:
        raise ConnectionError("reset by peer")

    s = run_stream(boom, lambda exc: AssistantMessage(stop_reason="error", error_message=f"{exc}"))
    assert [(e.type, e.reason, e.error.error_message) for e in [e async for e in s]] == [
        ("error", "error", "reset by peer")
    ]

    started = asyncio.Event()

    async def hang(s: AssistantMessageEventStream) -> None:
        started.set()
        await asyncio.Event().wait()

    s2 = run_stream(hang, lambda exc: AssistantMessage(stop_reason="error", error_message="cancelled"))
    await started.wait()
    assert s2._task is not None
    s2._task.cancel()
    final = await s2.result()
    assert (final.stop_reason, final.error_message) == ("aborted", "cancelled")


async def test_simple_entry_points_route_to_the_faux_api() -> None:
    h = register_faux_provider([faux_assistant_message("a"), faux_assistant_message("b")])
    ctx = Context(messages=[UserMessage(content="x")])
    opts = SimpleStreamOptions(reasoning="high")
    assert (await complete_simple(h.get_model(), ctx, opts)).text() == "a"
    assert [e.type async for e in stream_simple(h.get_model(), ctx)][-1] == "done"
    assert isinstance(h.calls[0].options, SimpleStreamOptions) and h.calls[0].options.reasoning == "high"

"""The faux provider and the stream guarantees it inherits from runtime.llm.events/builder."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from providers.faux import (
    faux_assistant_message,
    faux_text,
    faux_thinking,
    faux_tool_call,
    register_faux_provider,
    unregister_faux_provider,
)
from runtime import (
    AbortController,
    AssistantMessage,
    Context,
    Model,
    StreamOptions,
    TextContent,
    ThinkingContent,
    ToolCall,
    UnknownApiError,
    UserMessage,
    complete,
    get_api_provider,
    stream,
)
from runtime.llm.registry import ApiMismatchError


def ctx(text: str = "hi") -> Context:
    return Context(system_prompt="sys", messages=[UserMessage(content=text, timestamp=1)])


def summarize(ev: Any) -> tuple[Any, ...]:
    """One event as a comparable tuple (type, index, delta/content)."""
    t = ev.type
    if t in ("text_delta", "thinking_delta", "toolcall_delta"):
        return (t, ev.content_index, ev.delta)
    if t in ("text_end", "thinking_end"):
        return (t, ev.content_index, ev.content)
    if t == "toolcall_end":
        return (t, ev.content_index, ev.tool_call.arguments)
    if t in ("text_start", "thinking_start", "toolcall_start"):
        return (t, ev.content_index)
    if t == "done":
        return (t, ev.reason)
    if t == "error":
        return (t, ev.reason, ev.error.error_message)
    return (t,)


async def collect(s: Any) -> list[Any]:
    return [e async for e in s]


async def test_text_thinking_and_tool_call_stream_in_chunks() -> None:
    h = register_faux_provider(
        [
            faux_assistant_message(
                [
                    faux_thinking("hmm ok", signature="sig"),
                    faux_text("hello"),
                    faux_tool_call("echo", {"t": "ab"}, id="c1"),
                ]
            )
        ],
        chunk_size=4,
    )
    events = await collect(stream(h.get_model(), ctx()))
    assert [summarize(e) for e in events] == [
        ("start",),
        ("thinking_start", 0),
        ("thinking_delta", 0, "hmm "),
        ("thinking_delta", 0, "ok"),
        ("thinking_end", 0, "hmm ok"),
        ("text_start", 1),
        ("text_delta", 1, "hell"),
        ("text_delta", 1, "o"),
        ("text_end", 1, "hello"),
        ("toolcall_start", 2),
        ("toolcall_delta", 2, '{"t"'),
        ("toolcall_delta", 2, ': "a'),
        ("toolcall_delta", 2, 'b"}'),
        ("toolcall_end", 2, {"t": "ab"}),
        ("done", "toolUse"),
    ]
    final = events[-1].message
    assert final.model_dump(exclude={"timestamp"}) == AssistantMessage(
        content=[
            ThinkingContent(thinking="hmm ok", signature="sig"),
            TextContent(text="hello"),
            ToolCall(id="c1", name="echo", arguments={"t": "ab"}),
        ],
        api="faux",
        provider="faux",
        model="faux-model",
        stop_reason="toolUse",
    ).model_dump(exclude={"timestamp"})
    assert h.call_count == 1 and h.pending_count == 0
    assert h.calls[0].context == ctx()


async def test_partial_tool_arguments_are_best_effort_parses() -> None:
    h = register_faux_provider(
        [faux_assistant_message([faux_tool_call("w", {"city": "New York"}, id="c")])], chunk_size=5
    )
    partials = []
    async for e in stream(h.get_model(), ctx()):
        if e.type == "toolcall_delta":
            block = e.partial.content[e.content_index]
            partials.append(dict(block.arguments))
    assert partials == [{}, {"city": ""}, {"city": "New Y"}, {"city": "New York"}]


async def test_callable_step_sees_context_and_options() -> None:
    seen: list[Any] = []

    def step(context: Context, options: StreamOptions | None) -> AssistantMessage:
        seen.append((context.messages[-1].content, options.max_tokens if options else None))
        return faux_assistant_message("echo: " + str(context.messages[-1].content))

    async def slow_step(context: Context, options: StreamOptions | None) -> AssistantMessage:
        await asyncio.sleep(0)
        return faux_assistant_message("async")

    h = register_faux_provider([step, slow_step])
    m = h.get_model()
    first = await complete(m, ctx("ping"), StreamOptions(max_tokens=7))
    second = await complete(m, ctx("again"))
    assert (first.text(), first.stop_reason, second.text()) == ("echo: ping", "stop", "async")
    assert seen == [("ping", 7)]
    assert [c.options.max_tokens if c.options else None for c in h.calls] == [7, None]


async def test_empty_queue_is_an_error_event() -> None:
    h = register_faux_provider([])
    events = await collect(stream(h.get_model(), ctx()))
    assert [summarize(e) for e in events] == [
        ("start",),
        (
            "error",
            "error",
            "faux provider 'faux': no scripted response left for call #1 "
            "(script more with set_responses/append_responses)",
        ),
    ]
    assert events[-1].error.stop_reason == "error"


async def test_set_and_append_responses() -> None:
    h = register_faux_provider([faux_assistant_message("a")])
    h.set_responses([faux_assistant_message("b")])
    h.append_responses([faux_assistant_message("c"), faux_assistant_message("d")])
    assert h.pending_count == 3
    texts = [(await complete(h.get_model(), ctx())).text() for _ in range(3)]
    assert texts == ["b", "c", "d"]
    assert (h.pending_count, h.call_count) == (0, 3)


async def test_abort_between_chunks_ends_with_aborted() -> None:
    h = register_faux_provider([faux_assistant_message("abcdefghijkl")], chunk_size=2)
    ctrl = AbortController()
    s = stream(h.get_model(), ctx(), StreamOptions(signal=ctrl.signal))
    got = []
    async for e in s:
        got.append(summarize(e))
        if e.type == "text_delta" and e.delta == "cd":
            ctrl.abort()
    assert got == [
        ("start",),
        ("text_start", 0),
        ("text_delta", 0, "ab"),
        ("text_delta", 0, "cd"),
        ("text_end", 0, "abcd"),
        ("error", "aborted", "aborted"),
    ]
    final = await s.result()
    assert (final.stop_reason, final.text()) == ("aborted", "abcd")


async def test_abort_during_slow_chunk_delay_is_prompt() -> None:
    h = register_faux_provider([faux_assistant_message("x" * 100)], chunk_size=1, chunk_delay_s=30.0)
    ctrl = AbortController()
    s = stream(h.get_model(), ctx(), StreamOptions(signal=ctrl.signal))
    async for e in s:
        if e.type == "text_delta":
            ctrl.abort("user pressed stop")
    final = await asyncio.wait_for(s.result(), 5)
    assert (final.stop_reason, final.error_message, final.text()) == ("aborted", "user pressed stop", "x")


async def test_scripted_error_length_and_raw_arguments() -> None:
    h = register_faux_provider(
        [
            faux_assistant_message([faux_text("partial")], "error", error_message="overloaded"),
            faux_assistant_message([faux_tool_call("w", '{"city": "Par', id="t1")], "length"),
            faux_assistant_message([faux_tool_call("w", "", id="t2"), faux_tool_call("w", "null", id="t3")]),
        ]
    )
    m = h.get_model()
    err = await complete(m, ctx())
    assert (err.stop_reason, err.error_message, err.text()) == ("error", "overloaded", "partial")
    length = await complete(m, ctx())
    assert (length.stop_reason, length.tool_calls()) == (
        "length",
        [ToolCall(id="t1", name="w", arguments={"city": "Par"})],
    )
    empty = await complete(m, ctx())
    assert [(c.id, c.arguments) for c in empty.tool_calls()] == [("t2", {}), ("t3", {})]
    assert empty.stop_reason == "toolUse"


async def test_step_that_raises_becomes_one_error_event() -> None:
    def boom(context: Context, options: StreamOptions | None) -> AssistantMessage:
        raise RuntimeError("kaput")

    h = register_faux_provider([boom])
    events = await collect(stream(h.get_model(), ctx()))
    assert [summarize(e) for e in events] == [("error", "error", "faux step failed: RuntimeError: kaput")]


async def test_unknown_api_lists_registered_ids_and_api_mismatch() -> None:
    register_faux_provider([])
    with pytest.raises(UnknownApiError) as info:
        stream(Model(id="x", api="nope-api"), ctx())
    assert "'nope-api'" in str(info.value) and "faux" in str(info.value)
    with pytest.raises(ApiMismatchError, match="has api 'other', not 'faux'"):
        get_api_provider("faux").stream(Model(id="x", api="other"), ctx(), None)


async def test_unregistered_faux_provider_name_is_an_error_event() -> None:
    register_faux_provider([], provider="p1")
    unregister_faux_provider("p1")
    final = await complete(Model(id="m", api="faux", provider="p1"), ctx())
    assert final.stop_reason == "error"
    assert final.error_message is not None and "'p1'" in final.error_message


async def test_providers_coexist_by_provider_name() -> None:
    a = register_faux_provider([faux_assistant_message("from a")], provider="a")
    b = register_faux_provider([faux_assistant_message("from b")], provider="b", models=["m1", "m2"])
    assert (await complete(b.get_model("m2"), ctx())).model == "m2"
    assert (await complete(a.get_model(), ctx())).text() == "from a"
    with pytest.raises(KeyError, match="m3"):
        b.get_model("m3")


async def test_bounded_call_history_keeps_the_count_and_the_last_contexts() -> None:
    """max_recorded_calls bounds the deep copies a long-lived host keeps; call_count still counts all."""
    from runtime import Context, UserMessage, complete

    handle = register_faux_provider(
        provider="bounded",
        default_response=lambda ctx, opts: faux_assistant_message([faux_text("ok")]),
        max_recorded_calls=2,
    )
    try:
        for i in range(5):
            await complete(handle.get_model(), Context(messages=[UserMessage(content=f"m{i}")]))
        assert handle.call_count == 5
        assert [c.context.messages[0].content for c in handle.calls] == ["m3", "m4"]
        none = register_faux_provider(
            provider="bounded0", default_response=handle.default_response, max_recorded_calls=0
        )
        await complete(none.get_model(), Context(messages=[UserMessage(content="x")]))
        assert (none.call_count, none.calls) == (1, [])
    finally:
        handle.unregister()

"""Wrong shapes inside otherwise valid streams and contexts: tool-call indexes with gaps or reused,
arguments sent as objects, tool ids that collide or are too long, orphan tool results, wrongly
typed ids/signatures/counts, Images API answers of the wrong shape
(docs/decisions.md#llm-cross-provider-handoff)."""

from __future__ import annotations

import hashlib
from typing import Any

from runtime.llm.types import Model
from tests.providers.helpers import ANTHROPIC, GEMINI, OPENAI, model_for, openai_text, run, sse
from tests.providers.replay_server import ReplayServer, Reply


async def test_openai_tool_call_indexes_with_gaps(replay: ReplayServer) -> None:
    def calls(*tcs: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {"tool_calls": list(tcs)}, "finish_reason": finish}]}

    body = sse(
        calls({"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x":'}}),
        calls({"index": 5, "id": "b", "function": {"name": "g", "arguments": "{}"}}),
        calls({"index": 0, "function": {"arguments": "1}"}}),
        calls(finish="tool_calls"),
        done=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, OPENAI))
    assert [(c.id, c.name, c.arguments, c.arguments_error) for c in msg.tool_calls()] == [
        ("a", "f", {"x": 1}, None),  # closed early by the interleaving, repaired at the end
        ("b", "g", {}, None),
    ]
    assert msg.stop_reason == "toolUse"


def test_tool_ids_that_normalize_alike_stay_distinct() -> None:
    from providers.handoff import anthropic_tool_id, transform_messages
    from runtime.llm.types import AssistantMessage, TextContent, ToolCall, ToolResultMessage

    src = {"api": OPENAI, "provider": "o", "model": "gpt"}
    calls = [ToolCall(id="call|1", name="f"), ToolCall(id="call.1", name="f")]
    messages = [
        AssistantMessage(content=calls, stop_reason="toolUse", **src),
        *(
            ToolResultMessage(tool_call_id=c.id, tool_name="f", content=[TextContent(text=c.id)])
            for c in calls
        ),
    ]
    out = transform_messages(messages, Model(id="c", api=ANTHROPIC, provider="a"), anthropic_tool_id)
    first, second = out[0].tool_calls()  # type: ignore[union-attr]
    assert first.id == "call_1" and second.id == "call_1_" + hashlib.sha1(b"call.1").hexdigest()[:8]
    assert [(m.tool_call_id, m.content[0].text) for m in out[1:]] == [  # type: ignore[union-attr]
        (first.id, "call|1"),
        (second.id, "call.1"),
    ]


async def test_openai_arguments_sent_as_an_object(replay: ReplayServer) -> None:
    call = {"index": 0, "id": "a", "type": "function", "function": {"name": "f", "arguments": {"q": "雪"}}}
    body = sse(
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        done=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, OPENAI))
    assert [(c.id, c.name, c.arguments) for c in msg.tool_calls()] == [("a", "f", {"q": "雪"})]
    assert (msg.stop_reason, msg.error_message) == ("toolUse", None)


async def test_long_tool_ids_are_shortened_for_openai(replay: ReplayServer) -> None:
    from runtime.llm.types import (
        AssistantMessage,
        Context,
        TextContent,
        ToolCall,
        ToolResultMessage,
        UserMessage,
    )

    long_id = "srvtoolu_" + "a" * 60  # fine for Anthropic, over OpenAI's 40 characters
    short = long_id[:31] + "_" + hashlib.sha1(long_id.encode()).hexdigest()[:8]
    context = Context(
        messages=[
            UserMessage(content="go", timestamp=1),
            AssistantMessage(
                content=[ToolCall(id=long_id, name="f")],
                api=ANTHROPIC,
                provider="a",
                model="claude",
                stop_reason="toolUse",
            ),
            ToolResultMessage(tool_call_id=long_id, tool_name="f", content=[TextContent(text="done")]),
        ]
    )
    replay.enqueue(Reply(body=sse(openai_text("ok", "stop"), done=True)))
    await run(model_for(replay, OPENAI), context)
    sent = replay.requests[0].json()["messages"]
    assert (sent[1]["tool_calls"][0]["id"], sent[2]["tool_call_id"], len(short)) == (short, short, 40)


def test_orphan_and_duplicate_tool_results_are_dropped() -> None:
    from providers.handoff import transform_messages
    from runtime.llm.types import AssistantMessage, TextContent, ToolCall, ToolResultMessage, UserMessage

    def result(call_id: str, text: str) -> ToolResultMessage:
        return ToolResultMessage(tool_call_id=call_id, tool_name="f", content=[TextContent(text=text)])

    src = {"api": OPENAI, "provider": "o", "model": "gpt", "stop_reason": "toolUse"}
    messages = [
        result("trimmed", "its call was cut from the context"),
        UserMessage(content="hi", timestamp=1),
        AssistantMessage(content=[ToolCall(id="a", name="f")], **src),
        result("a", "first"),
        result("a", "again"),
    ]
    out = transform_messages(messages, Model(id="gpt", api=OPENAI, provider="o"))
    assert [(type(m).__name__, getattr(m, "tool_call_id", None)) for m in out] == [
        ("UserMessage", None),
        ("AssistantMessage", None),
        ("ToolResultMessage", "a"),
    ]
    assert out[2].content == [TextContent(text="first")]  # type: ignore[union-attr]


async def test_image_responses_of_the_wrong_shape_are_errors_in_the_result(replay: ReplayServer) -> None:
    from providers.openai_images import ImageGenerationOptions, ImageModel, generate_images
    from runtime.llm.types import ImageContent, TextContent

    replay.enqueue(
        Reply.error(200, {"data": [{"b64_json": "%%%not-base64%%%"}]}),
        Reply.error(200, {"data": "nope"}),
        Reply.error(200, [1, 2]),
    )
    model = ImageModel(id="gpt-image-1", base_url=replay.base_url + "/v1")
    opts = ImageGenerationOptions(api_key="k-123456")
    got = [(await generate_images(model, "a fox", opts)) for _ in range(3)]
    assert [(r.images, r.error_message) for r in got] == [
        ([], "unexpected response from the Images API: Error: Only base64 data is allowed"),
        ([], "unexpected response from the Images API: AttributeError: 'str' object has no attribute 'get'"),
        ([], "unexpected response from the Images API: AttributeError: 'list' object has no attribute 'get'"),
    ]
    bad_input = [TextContent(text="edit"), ImageContent(data="@@@", mime_type="image/png")]
    result = await generate_images(model, bad_input, opts)
    assert (result.error_message, len(replay.requests)) == ("input image 0 is not valid base64", 3)


async def test_openai_index_reused_by_a_second_call(replay: ReplayServer) -> None:
    def piece(tc: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {"tool_calls": [tc]}, "finish_reason": finish}]}

    body = sse(
        piece({"index": 0, "id": "a", "function": {"name": "f", "arguments": '{"x": 1}'}}),
        piece({"index": 0, "id": "b", "function": {"name": "g", "arguments": '{"y": '}}),
        piece({"index": 0, "function": {"arguments": "2}"}}, "tool_calls"),
        done=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, OPENAI))
    assert [(c.id, c.name, c.arguments, c.arguments_error) for c in msg.tool_calls()] == [
        ("a", "f", {"x": 1}, None),
        ("b", "g", {"y": 2}, None),
    ]


async def test_wrong_typed_ids_signatures_and_counts_never_reach_the_message(replay: ReplayServer) -> None:
    """A message must validate when read back from storage: junk ids/signatures are ignored, junk
    token counts end the stream as malformed (content kept)."""
    gemini = {
        "responseId": 7,
        "candidates": [
            {"content": {"parts": [{"text": "ok", "thoughtSignature": ["x"]}]}, "finishReason": "STOP"}
        ],
        "usageMetadata": {"promptTokenCount": 3.0, "candidatesTokenCount": 2},
    }
    replay.enqueue(
        Reply(body=sse(gemini)),
        Reply(body=sse(openai_text("Hi"), {"id": "c1", "choices": [], "usage": {"prompt_tokens": 1.5}})),
    )
    _, first = await run(model_for(replay, GEMINI))
    _, second = await run(model_for(replay, OPENAI))
    assert (first.text(), first.response_id, first.content[0].text_signature, first.usage.input) == (  # type: ignore[union-attr]
        "ok",
        None,
        None,
        3,
    )
    assert (second.stop_reason, second.text(), second.error_message) == (
        "error",
        "Hi",
        "malformed event from the provider: usage: token count input=1.5 is not a whole number",
    )
    for msg in (first, second):
        assert type(msg).model_validate_json(msg.model_dump_json()) == msg


async def test_image_call_to_a_stalling_server_times_out(replay: ReplayServer) -> None:
    import asyncio

    from providers.openai_images import ImageGenerationOptions, ImageModel, generate_images

    replay.enqueue(Reply.error(200, {"data": []}, head_delay_s=30))
    model = ImageModel(id="gpt-image-1", base_url=replay.base_url + "/v1")
    result = await generate_images(model, "a fox", ImageGenerationOptions(api_key="k-123456", timeout=0.3))
    assert (result.images, result.error_message) == ([], "timeout: no complete response within 0.3 s")
    assert await asyncio.to_thread(replay.requests[0].finished.wait, 10)
    assert replay.requests[0].outcome == "disconnected"

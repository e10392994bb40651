"""Cross-provider handoff (docs/decisions.md#llm-cross-provider-handoff): an OpenAI-made context
sent to Anthropic and Gemini."""

from __future__ import annotations

from providers.handoff import IMAGE_PLACEHOLDER, MISSING_RESULT_TEXT, anthropic_tool_id, transform_messages
from runtime.llm.types import (
    AssistantMessage,
    Context,
    CustomMessage,
    ImageContent,
    Model,
    TextContent,
    ThinkingContent,
    Tool,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from tests.providers.helpers import model_for, run, sse
from tests.providers.replay_server import ReplayServer, Reply

LONG_ID = "call|" + "x" * 80  # invalid character and too long for Anthropic
OK_ID = "call_abc"


def openai_context() -> Context:
    """A DeepSeek/OpenAI conversation: thinking, two tool calls (one answered), an errored turn, images."""
    src = {"api": "openai-completions", "provider": "ds", "model": "deepseek-reasoner"}
    return Context(
        system_prompt="sys",
        tools=[Tool(name="weather", description="w")],
        messages=[
            UserMessage(
                content=[TextContent(text="look"), ImageContent(data="iVBORw0KGgo=", mime_type="image/png")],
                timestamp=1,
            ),
            AssistantMessage(
                content=[
                    ThinkingContent(thinking="User wants weather.", signature="sig-openai"),
                    ThinkingContent(thinking="   "),
                    TextContent(text="Checking."),
                    ToolCall(id=LONG_ID, name="weather", arguments={"city": "Paris"}),
                    ToolCall(id=OK_ID, name="weather", arguments={"city": "Rome"}),
                ],
                **src,
            ),
            ToolResultMessage(tool_call_id=LONG_ID, tool_name="weather", content=[TextContent(text="sunny")]),
            CustomMessage(custom_type="im_notice", data={"x": 1}),
            AssistantMessage(
                content=[ToolCall(id="dead", name="weather")],
                stop_reason="error",
                error_message="boom",
                **src,
            ),
            ToolResultMessage(
                tool_call_id="dead", tool_name="weather", content=[TextContent(text="never sent")]
            ),
            UserMessage(content="and Rome?", timestamp=2),
        ],
    )


def test_anthropic_tool_id_rules() -> None:
    assert anthropic_tool_id("call_abc-1") == "call_abc-1"
    assert anthropic_tool_id("a.b:c") == "a_b_c"
    long = anthropic_tool_id(LONG_ID)
    assert len(long) == 64 and long.startswith("call_xxxx") and long != anthropic_tool_id(LONG_ID + "y")


def test_same_model_keeps_signatures_and_drops_nothing() -> None:
    ctx = openai_context()
    target = Model(id="deepseek-reasoner", api="openai-completions", provider="ds", input=["text", "image"])
    out = transform_messages(ctx.messages, target)
    assistant = out[1]
    assert isinstance(assistant, AssistantMessage)
    assert assistant.content[0] == ThinkingContent(thinking="User wants weather.", signature="sig-openai")
    assert [m.role for m in out] == ["user", "assistant", "toolResult", "toolResult", "user"]
    missing = out[3]
    assert isinstance(missing, ToolResultMessage)
    assert (missing.tool_call_id, missing.is_error, missing.content) == (
        OK_ID,
        True,
        [TextContent(text=MISSING_RESULT_TEXT)],
    )


async def test_openai_context_to_anthropic_request(replay: ReplayServer) -> None:
    replay.enqueue(Reply(body=sse({"type": "message_stop"}, events=True)))
    model = model_for(replay, "anthropic-messages", "claude-sonnet-4-5", input=["text"])
    await run(model, openai_context())
    long = anthropic_tool_id(LONG_ID)
    assert replay.requests[0].json()["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "look"}, {"type": "text", "text": IMAGE_PLACEHOLDER}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "User wants weather."},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": long, "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": OK_ID, "name": "weather", "input": {"city": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": long,
                    "content": [{"type": "text", "text": "sunny"}],
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": OK_ID,
                    "content": [{"type": "text", "text": MISSING_RESULT_TEXT}],
                    "is_error": True,
                },
            ],
        },
        {"role": "user", "content": "and Rome?"},
    ]


async def test_openai_context_to_gemini_request(replay: ReplayServer) -> None:
    replay.enqueue(
        Reply(body=sse({"candidates": [{"content": {"parts": [{"text": "ok"}]}, "finishReason": "STOP"}]}))
    )
    model = model_for(replay, "google-generative-ai", "gemini-2.5-flash", input=["text", "image"])
    await run(model, openai_context())
    body = replay.requests[0].json()
    assert body["contents"] == [
        {
            "role": "user",
            "parts": [{"text": "look"}, {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}],
        },
        {
            "role": "model",
            "parts": [
                {"text": "User wants weather."},
                {"text": "Checking."},
                {"functionCall": {"id": LONG_ID, "name": "weather", "args": {"city": "Paris"}}},
                {"functionCall": {"id": OK_ID, "name": "weather", "args": {"city": "Rome"}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"id": LONG_ID, "name": "weather", "response": {"output": "sunny"}}},
                {
                    "functionResponse": {
                        "id": OK_ID,
                        "name": "weather",
                        "response": {"error": MISSING_RESULT_TEXT},
                    }
                },
            ],
        },
        {"role": "user", "parts": [{"text": "and Rome?"}]},
    ]
    assert body["systemInstruction"] == {"parts": [{"text": "sys"}]}


async def test_anthropic_signed_thinking_is_replayed_only_to_the_same_model(replay: ReplayServer) -> None:
    replay.enqueue(*[Reply(body=sse({"type": "message_stop"}, events=True)) for _ in range(2)])
    same = model_for(replay, "anthropic-messages", "claude-x")
    prior = AssistantMessage(
        api="anthropic-messages",
        provider="p",
        model="claude-x",
        content=[
            ThinkingContent(thinking="t", signature="S1"),
            ThinkingContent(thinking="", signature="R", redacted=True),
            TextContent(text="answer"),
        ],
    )
    ctx = Context(
        messages=[UserMessage(content="q", timestamp=1), prior, UserMessage(content="q2", timestamp=2)]
    )
    await run(same, ctx)
    await run(same.model_copy(update={"id": "claude-y"}), ctx)
    assert replay.requests[0].json()["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "t", "signature": "S1"},
        {"type": "redacted_thinking", "data": "R"},
        {"type": "text", "text": "answer"},
    ]
    assert replay.requests[1].json()["messages"][1]["content"] == [
        {"type": "text", "text": "t"},
        {"type": "text", "text": "answer"},
    ]

"""The request bodies our providers send, checked against the official SDKs' own request types
(docs/decisions.md#provider-request-bodies): ``openai.types.chat.CompletionCreateParamsStreaming``
and ``anthropic.types.MessageCreateParamsStreaming`` (``openai`` and ``anthropic`` are dev
dependencies). The body is read from the real HTTP request the replay server received; it must
validate (pydantic ``TypeAdapter`` of the SDK's TypedDict) and come back unchanged — a field the
SDK type does not have is dropped by validation, so any difference names a field the API no
longer takes."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
from pydantic import TypeAdapter

from runtime.llm.options import SimpleStreamOptions
from runtime.llm.stream import stream_simple
from runtime.llm.types import (
    AssistantMessage,
    Context,
    ImageContent,
    Model,
    TextContent,
    ThinkingContent,
    Tool,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from tests.providers.helpers import ANTHROPIC, OPENAI, model_for
from tests.providers.replay_server import ReplayServer, Reply

OPENAI_SDK = TypeAdapter(CompletionCreateParamsStreaming)
ANTHROPIC_SDK = TypeAdapter(MessageCreateParamsStreaming)
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(24)).decode()
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
LEVELS = ["off", "minimal", "low", "medium", "high"]
OPTION_SETS: list[dict[str, Any]] = [
    {},
    {"temperature": 0.3, "max_tokens": 300, "tool_choice": "auto"},
    {"tool_choice": "required"},
    {"tool_choice": "clock"},
    {"tool_choice": "none"},
    {"output_schema": SCHEMA, "output_schema_name": "reply"},
]


def plain(value: Any) -> Any:
    """A validated value as plain JSON data (the SDK's ``Iterable`` fields validate lazily:
    walking them here validates every item)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if value is None or isinstance(value, str | bytes | int | float | bool):
        return value
    return [plain(v) for v in value]


def sdk_problems(adapter: TypeAdapter[Any], body: dict[str, Any]) -> str | None:
    """``None`` when ``body`` is a valid SDK request that validation keeps unchanged, else why not."""
    try:
        kept = plain(adapter.validate_python(body))
    except Exception as exc:
        return str(exc)
    return None if kept == body else f"not in the SDK type: {_dropped(body, kept)}"


def _dropped(sent: Any, kept: Any, path: str = "") -> list[str]:
    if isinstance(sent, dict) and isinstance(kept, dict):
        out = [f"{path}.{k}" for k in sent if k not in kept]
        return out + [p for k in sent if k in kept for p in _dropped(sent[k], kept[k], f"{path}.{k}")]
    if isinstance(sent, list) and isinstance(kept, list):
        return [
            p
            for i, (a, b) in enumerate(zip(sent, kept, strict=False))
            for p in _dropped(a, b, f"{path}[{i}]")
        ]
    return [] if sent == kept else [f"{path} ({sent!r} → {kept!r})"]


def rich_context(model: Model) -> Context:
    """Every message and block kind a session sends: system prompt, user text and image, an
    assistant turn of this model with signed thinking, text and a tool call, a tool result with
    text and an image, then the next user message; one tool."""
    assistant = AssistantMessage(
        api=model.api,
        provider=model.provider,
        model=model.id,
        content=[
            ThinkingContent(thinking="the user wants the time", signature="sig-1"),
            TextContent(text="let me check"),
            ToolCall(id="t1", name="clock", arguments={"tz": "UTC"}),
        ],
        stop_reason="toolUse",
    )
    result = ToolResultMessage(
        tool_call_id="t1",
        tool_name="clock",
        content=[TextContent(text="12:00"), ImageContent(data=PNG, mime_type="image/png")],
    )
    return Context(
        system_prompt="be brief",
        messages=[
            UserMessage(
                content=[TextContent(text="time?"), ImageContent(data=PNG, mime_type="image/png")],
                timestamp=1,
            ),
            assistant,
            result,
            UserMessage(content="thanks", timestamp=2),
        ],
        tools=[
            Tool(
                name="clock",
                description="Current time.",
                parameters={"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
            )
        ],
    )


async def sent_body(
    replay: ReplayServer, fixture: Path, model: Model, level: str, opts: dict[str, Any]
) -> Any:
    replay.enqueue(Reply.fixture(fixture))
    options = SimpleStreamOptions(api_key="sk-test-key-123456", reasoning=level, **opts)  # type: ignore[arg-type]
    await stream_simple(model, rich_context(model), options).result()
    return replay.requests[-1].json()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("profile", ["openai", "generic"])
async def test_openai_bodies_are_sdk_requests(
    replay: ReplayServer, fixtures_dir: Path, profile: str, level: str
) -> None:
    model = model_for(replay, OPENAI, "o4-mini", reasoning=profile == "openai", input=["text", "image"],
                      compat={"profile": profile})  # fmt: skip
    fixture = fixtures_dir / "openai" / "chat_stream_text_with_usage.sse"
    for opts in OPTION_SETS:
        body = await sent_body(replay, fixture, model, level, opts)
        assert sdk_problems(OPENAI_SDK, body) is None, (opts, body)
        if profile == "openai" and level != "off":
            assert body["reasoning_effort"] == level  # ``minimal`` too: the API has it


@pytest.mark.parametrize("level", LEVELS)
async def test_anthropic_bodies_are_sdk_requests(
    replay: ReplayServer, fixtures_dir: Path, level: str
) -> None:
    model = model_for(replay, ANTHROPIC, "claude-x", reasoning=True, input=["text", "image"])
    fixture = fixtures_dir / "anthropic" / "messages_stream_text.sse"
    for opts in OPTION_SETS:
        body = await sent_body(replay, fixture, model, level, opts)
        assert sdk_problems(ANTHROPIC_SDK, body) is None, (opts, body)
        assert "temperature" not in body  # the Messages API no longer takes sampling parameters
        assert ("thinking" in body) is (level != "off")


async def test_anthropic_temperature_only_by_compat_and_never_with_thinking(
    replay: ReplayServer, fixtures_dir: Path
) -> None:
    fixture = fixtures_dir / "anthropic" / "messages_stream_text.sse"
    legacy = model_for(replay, ANTHROPIC, "claude-old", reasoning=True, compat={"send_temperature": True})
    assert (await sent_body(replay, fixture, legacy, "off", {"temperature": 0.3}))["temperature"] == 0.3
    thinking = await sent_body(replay, fixture, legacy, "low", {"temperature": 0.3})
    assert "temperature" not in thinking and thinking["thinking"]["type"] == "enabled"
    assert sdk_problems(ANTHROPIC_SDK, thinking) is None


def test_the_check_names_what_the_sdk_does_not_take() -> None:
    body = {"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    assert sdk_problems(ANTHROPIC_SDK, body) is None
    assert (
        sdk_problems(ANTHROPIC_SDK, {**body, "temperature": 0.2}) == "not in the SDK type: ['.temperature']"
    )
    chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    assert sdk_problems(OPENAI_SDK, {**chat, "reasoning_effort": "minimal"}) is None
    assert "reasoning_effort" in (sdk_problems(OPENAI_SDK, {**chat, "reasoning_effort": "tiny"}) or "")

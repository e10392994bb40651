"""The request bodies our providers send, checked against the official SDKs' own request types
(docs/decisions.md#provider-request-bodies): ``openai.types.chat.CompletionCreateParamsStreaming``,
``anthropic.types.MessageCreateParamsStreaming`` and, for Gemini, the ``google.genai.types`` models
of each part of the REST ``GenerateContentRequest`` (``openai``, ``anthropic`` and ``google-genai``
are dev dependencies). The body is read from the real HTTP request the replay server received; it
must validate (pydantic ``TypeAdapter`` of the SDK's type) and come back unchanged — a field the
SDK type does not have is dropped by validation (OpenAI, Anthropic) or refused (the Google models
forbid extra fields; a snake_case name comes back camelCase), so any difference names a field the
API no longer takes."""

from __future__ import annotations

import base64
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from anthropic.types.message_create_params import MessageCreateParamsStreaming
from google.genai import types as genai
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
from pydantic import BaseModel, TypeAdapter, ValidationError

from providers.google_generative_ai import THINKING_BUDGETS
from runtime.llm.options import SimpleStreamOptions
from runtime.llm.stream import stream_simple
from runtime.llm.types import (
    NO_TEXT,
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
from tests.providers.helpers import ANTHROPIC, GEMINI, OPENAI, model_for
from tests.providers.replay_server import ReplayServer, Reply

OPENAI_SDK = TypeAdapter(CompletionCreateParamsStreaming)
ANTHROPIC_SDK = TypeAdapter(MessageCreateParamsStreaming)
GOOGLE_SDK: dict[str, TypeAdapter[Any]] = {
    "contents": TypeAdapter(list[genai.Content]),
    "systemInstruction": TypeAdapter(genai.Content),
    "generationConfig": TypeAdapter(genai.GenerationConfig),
    "tools": TypeAdapter(list[genai.Tool]),
    "toolConfig": TypeAdapter(genai.ToolConfig),
}
"""The REST ``GenerateContentRequest`` fields we send → the SDK type of each (the SDK has no type
for the REST body itself: its ``GenerateContentConfig`` is split into these same top-level fields)."""
GOOGLE_SIGNATURE = base64.b64encode(b"opaque thought signature").decode()
"""Gemini thought signatures are base64 bytes (``Part.thought_signature``)."""
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


def google_problems(body: dict[str, Any]) -> str | None:
    """``None`` when every field of the Gemini REST ``body`` is one of :data:`GOOGLE_SDK` and its
    value validates (JSON mode: bytes are base64) without warnings and dumps back by alias
    unchanged, else why not."""
    unknown = [f".{k}" for k in body if k not in GOOGLE_SDK]
    if unknown:
        return f"not in the REST request: {unknown}"
    for key, value in body.items():
        adapter = GOOGLE_SDK[key]
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            try:
                parsed = adapter.validate_json(json.dumps(value))
            except ValidationError as exc:
                return f".{key}: {exc}"
        if warned:  # the SDK's enums take an unknown value with only a warning: not a value the API has
            return f".{key}: {'; '.join(str(w.message) for w in warned)}"
        extras = _model_extras(parsed, f".{key}")
        if extras:  # a model that allows extra fields keeps them: name them all the same
            return f"not in the SDK type: {extras}"
        kept = adapter.dump_python(parsed, mode="json", by_alias=True, exclude_none=True)
        if kept != value:
            return f"not in the SDK type: {_dropped(value, kept, f'.{key}')}"
    return None


def _model_extras(value: Any, path: str) -> list[str]:
    if isinstance(value, BaseModel):
        own = [f"{path}.{k}" for k in value.model_extra or {}]
        return own + [p for name in type(value).model_fields
                      for p in _model_extras(getattr(value, name), f"{path}.{name}")]  # fmt: skip
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _model_extras(v, f"{path}[{i}]")]
    return []


def rich_context(model: Model, signature: str = "sig-1", call_signature: str | None = None) -> Context:
    """Every message and block kind a session sends: system prompt, user text and image, an
    assistant turn of this model with signed thinking (``signature``), text and a tool call
    (signed with ``call_signature``, as Gemini does), a tool result with text and an image, then
    the next user message; one tool."""
    assistant = AssistantMessage(
        api=model.api,
        provider=model.provider,
        model=model.id,
        content=[
            ThinkingContent(thinking="the user wants the time", signature=signature),
            TextContent(text="let me check"),
            ToolCall(id="t1", name="clock", arguments={"tz": "UTC"}, thought_signature=call_signature),
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
    replay: ReplayServer,
    fixture: Path,
    model: Model,
    level: str,
    opts: dict[str, Any],
    context: Context | None = None,
) -> Any:
    """The JSON body of the request one call with ``opts`` sent (``context``: :func:`rich_context`)."""
    replay.enqueue(Reply.fixture(fixture))
    options = SimpleStreamOptions(api_key="sk-test-key-123456", reasoning=level, **opts)  # type: ignore[arg-type]
    await stream_simple(model, context or rich_context(model), options).result()
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


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("reasoning", [True, False])
async def test_google_bodies_are_sdk_requests(
    replay: ReplayServer, fixtures_dir: Path, reasoning: bool, level: str
) -> None:
    model = model_for(replay, GEMINI, "gemini-2.5-flash", reasoning=reasoning, input=["text", "image"])
    fixture = fixtures_dir / "gemini" / "stream_text.sse"
    context = rich_context(model, signature=GOOGLE_SIGNATURE, call_signature=GOOGLE_SIGNATURE)
    for opts in OPTION_SETS:
        body = await sent_body(replay, fixture, model, level, opts, context)
        assert google_problems(body) is None, (opts, body)
        assert set(body) >= {"contents", "generationConfig", "systemInstruction", "tools"}
        assert ("toolConfig" in body) is ("tool_choice" in opts)
        thinking = body["generationConfig"].get("thinkingConfig")
        if not reasoning:
            assert thinking is None
        elif level == "off":
            assert thinking == {"includeThoughts": True}
        else:
            assert thinking == {"includeThoughts": True, "thinkingBudget": THINKING_BUDGETS[level]}
        if "output_schema" in opts:  # the native structured tier
            assert body["generationConfig"]["responseJsonSchema"] == SCHEMA
            assert body["generationConfig"]["responseMimeType"] == "application/json"


def test_the_check_names_what_the_sdk_does_not_take() -> None:
    body = {"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    assert sdk_problems(ANTHROPIC_SDK, body) is None
    assert (
        sdk_problems(ANTHROPIC_SDK, {**body, "temperature": 0.2}) == "not in the SDK type: ['.temperature']"
    )
    chat = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    assert sdk_problems(OPENAI_SDK, {**chat, "reasoning_effort": "minimal"}) is None
    assert "reasoning_effort" in (sdk_problems(OPENAI_SDK, {**chat, "reasoning_effort": "tiny"}) or "")
    gemini = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"seed": 1}}
    assert google_problems(gemini) is None
    assert google_problems({**gemini, "safety": []}) == "not in the REST request: ['.safety']"
    snake = {**gemini, "generationConfig": {"max_output_tokens": 5}}
    assert google_problems(snake) == "not in the SDK type: ['.generationConfig.max_output_tokens']"
    unknown = {**gemini, "toolConfig": {"functionCallingConfig": {"mode": "ANY", "force": True}}}
    assert "force" in (google_problems(unknown) or "")
    bad_mode = {**gemini, "toolConfig": {"functionCallingConfig": {"mode": "X"}}}
    assert google_problems(bad_mode) == ".toolConfig: X is not a valid FunctionCallingConfigMode"


# --------------------------------------------------------------------------- user turns
# docs/decisions.md#llm-user-turns: a user message with nothing to send goes as NO_TEXT; a body is
# never empty and never ends on the assistant (a Context that would is refused before sending).

SDK_CHECKS = {
    OPENAI: ("openai/chat_stream_text_with_usage.sse", lambda body: sdk_problems(OPENAI_SDK, body)),
    ANTHROPIC: ("anthropic/messages_stream_text.sse", lambda body: sdk_problems(ANTHROPIC_SDK, body)),
    GEMINI: ("gemini/stream_text.sse", google_problems),
}


def turns(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(role, content)`` of the body's conversation (OpenAI's system message left out)."""
    if "contents" in body:
        return [(c["role"], c["parts"]) for c in body["contents"]]
    return [(m["role"], m["content"]) for m in body["messages"] if m["role"] not in ("system", "developer")]


def said(model: Model, text: str, content: Any = None) -> AssistantMessage:
    return AssistantMessage(api=model.api, provider=model.provider, model=model.id,
                            content=content or [TextContent(text=text)], stop_reason="stop")  # fmt: skip


def empty_user_contexts(model: Model) -> list[tuple[list[Any], int]]:
    """Contexts whose user messages have nothing to send (a QQ face alone stored before its
    placeholder existed), with the number of user turns the body must have."""
    empty: list[Any] = ["", "  \n", [], [TextContent(text="")], [TextContent(text=" ")]]
    out: list[tuple[list[Any], int]] = [([UserMessage(content=e, timestamp=1)], 1) for e in empty]
    history = [UserMessage(content="hi", timestamp=1), said(model, "hello")]
    out += [([*history, UserMessage(content=e, timestamp=2)], 2) for e in empty]
    out.append(
        ([UserMessage(content="", timestamp=1), said(model, "?"), UserMessage(content="ok", timestamp=2)], 2)
    )
    return out


@pytest.mark.parametrize("api", [OPENAI, ANTHROPIC, GEMINI])
async def test_an_empty_user_message_is_sent_as_the_no_text_placeholder(
    replay: ReplayServer, fixtures_dir: Path, api: str
) -> None:
    model = model_for(replay, api, "m", input=["text", "image"])
    fixture, problems = SDK_CHECKS[api]
    for messages, user_turns in empty_user_contexts(model):
        context = Context(system_prompt="be brief", messages=messages)
        body = await sent_body(replay, fixtures_dir / fixture, model, "off", {}, context)
        assert problems(body) is None, (messages, body)
        sent = turns(body)
        assert sent and sent[-1][0] == "user", body  # never empty, never ending on the assistant
        assert sum(role == "user" for role, _ in sent) == user_turns, body
        assert NO_TEXT in json.dumps(body, ensure_ascii=False), body


@pytest.mark.parametrize("api", [OPENAI, ANTHROPIC, GEMINI])
async def test_a_context_without_a_user_turn_to_answer_is_refused_before_sending(
    replay: ReplayServer, api: str
) -> None:
    model = model_for(replay, api, "m")
    options = SimpleStreamOptions(api_key="sk-test-key-123456")
    for messages, why in [
        ([], "the context has no message for the model to answer"),
        ([UserMessage(content="hi", timestamp=1), said(model, "hello")], "ends on the assistant's message"),
    ]:
        result = await stream_simple(model, Context(system_prompt="s", messages=messages), options).result()
        assert result.stop_reason == "error" and why in (result.error_message or ""), (messages, result)
    assert replay.requests == []  # nothing was sent

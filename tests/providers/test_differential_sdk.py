"""Differential tests: our final message equals what the official SDKs' own stream accumulators build
from the same bytes. Both sides read the same fixture from the replay server over
loopback; the SDKs are dev dependencies (``openai``, ``anthropic``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from runtime.llm.types import AssistantMessage, TextContent, ThinkingContent, ToolCall
from tests.providers.helpers import model_for, run
from tests.providers.replay_server import ReplayServer, Reply

OPENAI_FIXTURES = [
    "chat_stream_text_with_usage.sse",
    "chat_stream_tool_call_single.sse",
    "chat_stream_deepseek_reasoning.sse",
]
ANTHROPIC_FIXTURES = [
    "messages_stream_text.sse",
    "messages_stream_tool_use.sse",
    "messages_stream_thinking_docs.sse",
]
OPENAI_STOP = {"stop": "stop", "length": "length", "tool_calls": "toolUse"}
ANTHROPIC_STOP = {"end_turn": "stop", "max_tokens": "length", "tool_use": "toolUse"}


def ours_projection(msg: AssistantMessage) -> dict[str, Any]:
    """Our message in the SDK-neutral shape both sides are compared in."""
    blocks: list[tuple[Any, ...]] = []
    for b in msg.content:
        if isinstance(b, TextContent):
            blocks.append(("text", b.text))
        elif isinstance(b, ThinkingContent):
            blocks.append(("thinking", b.thinking, b.signature))
        elif isinstance(b, ToolCall):
            blocks.append(("tool", b.id, b.name, b.arguments))
    u = msg.usage
    return {
        "id": msg.response_id,
        "blocks": blocks,
        "stop": msg.stop_reason,
        "usage": (u.input, u.output, u.cache_read, u.cache_write),
    }


@pytest.mark.parametrize("name", OPENAI_FIXTURES)
async def test_openai_sdk_accumulator_agrees(replay: ReplayServer, fixtures_dir: Path, name: str) -> None:
    path = fixtures_dir / "openai" / name
    small = path.stat().st_size < 5000
    replay.enqueue(Reply.fixture(path, seed=11), Reply.fixture(path, seed=12, max_chunk=3 if small else 64))
    _, ours = await run(model_for(replay, "openai-completions"))

    client = openai.AsyncOpenAI(base_url=replay.base_url + "/v1", api_key="sk-x", max_retries=0)
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    sdk_stream = await client.chat.completions.create(
        model="m1", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    async for chunk in sdk_stream:
        state.handle_chunk(chunk)
    final = state.get_final_completion()
    await client.close()

    choice = final.choices[0]
    m = choice.message
    blocks: list[tuple[Any, ...]] = []
    reasoning = getattr(m, "reasoning_content", None)
    if reasoning:
        blocks.append(("thinking", reasoning, None))
    if m.content:
        blocks.append(("text", m.content))
    for tc in m.tool_calls or []:
        blocks.append(("tool", tc.id, tc.function.name, json.loads(tc.function.arguments or "{}")))
    assert final.usage is not None
    cached = (
        (final.usage.prompt_tokens_details.cached_tokens or 0) if final.usage.prompt_tokens_details else 0
    )
    sdk = {
        "id": final.id,
        "blocks": blocks,
        "stop": OPENAI_STOP[choice.finish_reason],
        "usage": (final.usage.prompt_tokens - cached, final.usage.completion_tokens, cached, 0),
    }
    assert ours_projection(ours) == sdk


@pytest.mark.parametrize("name", ANTHROPIC_FIXTURES)
async def test_anthropic_sdk_accumulator_agrees(replay: ReplayServer, fixtures_dir: Path, name: str) -> None:
    path = fixtures_dir / "anthropic" / name
    replay.enqueue(Reply.fixture(path, seed=13), Reply.fixture(path, seed=14, max_chunk=3))
    _, ours = await run(model_for(replay, "anthropic-messages"))

    client = anthropic.AsyncAnthropic(base_url=replay.base_url, api_key="sk-x", max_retries=0)
    async with client.messages.stream(
        model="m1", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        if name == "messages_stream_thinking_docs.sse":
            # The docs sample's message_delta has no usage; the SDK's accumulator dereferences it and
            # fails. Compare with the snapshot it had built up to that event (content and stop_reason).
            with pytest.raises(AttributeError, match="output_tokens"):
                await s.get_final_message()
            final = s.current_message_snapshot
        else:
            final = await s.get_final_message()
    await client.close()

    blocks: list[tuple[Any, ...]] = []
    for b in final.content:
        if b.type == "text":
            blocks.append(("text", b.text))
        elif b.type == "thinking":
            blocks.append(("thinking", b.thinking, b.signature))
        elif b.type == "tool_use":
            blocks.append(("tool", b.id, b.name, b.input))
    u = getattr(final, "usage", None)
    usage = (
        (
            u.input_tokens or 0,
            u.output_tokens or 0,
            u.cache_read_input_tokens or 0,
            u.cache_creation_input_tokens or 0,
        )
        if u is not None
        else (0, 0, 0, 0)
    )
    sdk = {
        "id": final.id,
        "blocks": blocks,
        "stop": ANTHROPIC_STOP[final.stop_reason or "end_turn"],
        "usage": usage,
    }
    assert ours_projection(ours) == sdk


async def test_anthropic_sdk_and_we_both_report_overloaded(replay: ReplayServer, fixtures_dir: Path) -> None:
    path = fixtures_dir / "anthropic/messages_stream_error_overloaded.sse"
    replay.enqueue(Reply.fixture(path), Reply.fixture(path))
    _, ours = await run(model_for(replay, "anthropic-messages"))
    client = anthropic.AsyncAnthropic(base_url=replay.base_url, api_key="sk-x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as info:
        async with client.messages.stream(
            model="m1", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        ) as s:
            await s.get_final_message()
    await client.close()
    assert info.value.body == {
        "type": "error",
        "error": {"details": None, "type": "overloaded_error", "message": "Overloaded"},
    }
    assert (ours.stop_reason, ours.error_message) == ("error", "overloaded_error: Overloaded")

"""openai-completions: every OpenAI fixture replayed over loopback, plus the bug shapes."""

from __future__ import annotations

import json
from pathlib import Path

from runtime.llm.types import (
    AssistantMessage,
    Context,
    TextContent,
    ThinkingContent,
    Tool,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from tests.providers.helpers import dump, hello, model_for, run, sse, usage
from tests.providers.replay_server import ReplayServer, Reply

API = "openai-completions"


def _chunk(delta: dict, finish: str | None = None, **extra: object) -> dict:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


async def test_text_with_usage_fixture(replay: ReplayServer, fixtures_dir: Path) -> None:
    replay.enqueue(Reply.fixture(fixtures_dir / "openai/chat_stream_text_with_usage.sse", seed=1))
    events, msg = await run(model_for(replay, API))
    assert dump(msg) == {
        "role": "assistant",
        "content": [
            {
                "type": "text",
                "text": "I'm unable to provide real-time weather updates. To get the current weather in San "
                "Francisco, I recommend checking a reliable weather website or a weather app.",
                "text_signature": None,
            }
        ],
        "api": API,
        "provider": "p",
        "model": "m1",
        "usage": usage(input=14, output=30),
        "stop_reason": "stop",
        "error_message": None,
        "response_id": "chatcmpl-ABfw031mOJeYCSHe4yI2ZjOA6kMJL",
    }
    kinds = [e.type for e in events]
    assert kinds[:2] == ["start", "text_start"] and kinds[-2:] == ["text_end", "done"]
    assert set(kinds[2:-2]) == {"text_delta"}
    assert "".join(e.delta for e in events if e.type == "text_delta") == msg.text()
    # the request: roles, streaming usage, token field, auth header
    req = replay.requests[0]
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == "Bearer sk-test-key-123456"
    assert req.json() == {
        "model": "m1",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 4096,
    }


async def test_tool_call_fixture(replay: ReplayServer, fixtures_dir: Path) -> None:
    replay.enqueue(
        Reply.fixture(fixtures_dir / "openai/chat_stream_tool_call_single.sse", seed=2, max_chunk=7)
    )
    events, msg = await run(model_for(replay, API))
    assert dump(msg)["content"] == [
        {
            "type": "toolCall",
            "id": "call_4XzlGBLtUe9dy3GVNV4jhq7h",
            "name": "get_weather",
            "arguments": {"city": "New York City"},
            "thought_signature": None,
        }
    ]
    assert msg.stop_reason == "toolUse"
    assert dump(msg)["usage"] == usage(input=44, output=16)
    assert msg.response_id == "chatcmpl-ABfwERreu9s99xXsVuOWtIB2UOx62"
    deltas = [e.delta for e in events if e.type == "toolcall_delta"]
    assert deltas == ['{"', "city", '":"', "New", " York", " City", '"}']


async def test_deepseek_reasoning_fixture(replay: ReplayServer, fixtures_dir: Path) -> None:
    path = fixtures_dir / "openai/chat_stream_deepseek_reasoning.sse"
    replay.enqueue(Reply.fixture(path, seed=3, max_chunk=300))
    _, msg = await run(model_for(replay, API, "deepseek-reasoner", reasoning=True))
    # oracle: the raw deltas of the fixture, read line by line
    chunks = [json.loads(line[6:]) for line in path.read_text().splitlines() if line.startswith("data: {")]
    thinking = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == 'The word "strawberry" contains three "r"s.'
    assert thinking.startswith('We need to count the number of the letter "r" in the word "s')
    assert len(thinking) == 606
    assert dump(msg) == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": thinking, "signature": None, "redacted": False},
            {"type": "text", "text": text, "text_signature": None},
        ],
        "api": API,
        "provider": "p",
        "model": "deepseek-reasoner",
        "usage": usage(input=18, output=219),
        "stop_reason": "stop",
        "error_message": None,
        "response_id": "cac7192e-e619-40c6-96b0-ed4276bc03ac",
    }


async def test_json_schema_request_and_cost(replay: ReplayServer, fixtures_dir: Path) -> None:
    """output_schema → strict json_schema response_format; OpenAI profile uses max_completion_tokens."""
    replay.enqueue(Reply.fixture(fixtures_dir / "openai/chat_stream_text_with_usage.sse"))
    model = model_for(replay, API, compat={"profile": "openai"}, cost={"input": 2.5, "output": 10.0})
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    _, msg = await run(model, output_schema=schema, output_schema_name="Location", max_tokens=100)
    body = replay.requests[0].json()
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Location", "schema": schema, "strict": True},
    }
    assert body["max_completion_tokens"] == 100 and "max_tokens" not in body
    assert msg.usage.cost.model_dump() == {
        "input": 14 * 2.5 / 1e6,
        "output": 30 * 10.0 / 1e6,
        "cache_read": 0.0,
        "cache_write": 0.0,
        "total": 14 * 2.5 / 1e6 + 30 * 10.0 / 1e6,
    }


# --------------------------------------------------------------------------- bug shapes


async def test_tool_deltas_without_index(replay: ReplayServer) -> None:
    """No ``index``: a new id opens a slot; a delta with neither index nor id continues the latest."""
    body = sse(
        _chunk(
            {
                "role": "assistant",
                "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": ""}}],
            }
        ),
        _chunk({"tool_calls": [{"function": {"arguments": '{"x":'}}]}),
        _chunk({"tool_calls": [{"function": {"arguments": " 1}"}}]}),
        _chunk(
            {"tool_calls": [{"id": "b", "type": "function", "function": {"name": "g", "arguments": '{"y"'}}]}
        ),
        _chunk({"tool_calls": [{"function": {"arguments": ': "z"}'}}]}),
        _chunk({}, "tool_calls"),
        done=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, API))
    assert [c.model_dump() for c in msg.tool_calls()] == [
        {"type": "toolCall", "id": "a", "name": "f", "arguments": {"x": 1}, "thought_signature": None},
        {"type": "toolCall", "id": "b", "name": "g", "arguments": {"y": "z"}, "thought_signature": None},
    ]
    assert msg.stop_reason == "toolUse"


async def test_parallel_interleaved_calls_and_empty_arguments(replay: ReplayServer) -> None:
    """Two calls by index, deltas interleaved; ``arguments: ""`` for a zero-argument tool gives {}."""
    body = sse(
        _chunk({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "now", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 1, "id": "c1", "function": {"name": "add", "arguments": '{"a":'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 1, "function": {"arguments": " 2}"}}]}),
        _chunk({}, "tool_calls"),
        done=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, API))
    assert [(c.id, c.name, c.arguments) for c in msg.tool_calls()] == [
        ("c0", "now", {}),
        ("c1", "add", {"a": 2}),
    ]


async def test_interleaved_late_arguments_are_kept(replay: ReplayServer) -> None:
    body = sse(
        _chunk({"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "f", "arguments": '{"a"'}}]}),
        _chunk({"tool_calls": [{"index": 1, "id": "c1", "function": {"name": "g", "arguments": "{}"}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}),
        _chunk({}, "tool_calls"),
        done=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, API))
    assert [(c.id, c.arguments) for c in msg.tool_calls()] == [("c0", {"a": 1}), ("c1", {})]


async def test_usage_only_in_empty_choices_chunk(replay: ReplayServer) -> None:
    body = sse(
        _chunk({"role": "assistant", "content": "ok"}),
        _chunk({}, "stop"),
        {
            "id": "c1",
            "choices": [],
            "usage": {
                "prompt_tokens": 100,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 60},
            },
        },
        done=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, API))
    assert dump(msg)["usage"] == usage(input=40, output=7, cache_read=60)
    assert msg.text() == "ok" and msg.stop_reason == "stop"


async def test_length_and_max_tokens_inside_tool_json(replay: ReplayServer) -> None:
    """The words ``length``/``max_tokens`` inside argument JSON are data, not a stop reason."""
    args = '{"finish_reason": "length", "max_tokens": 5, "note": "stop_reason max_tokens"}'
    body = sse(
        _chunk(
            {"tool_calls": [{"index": 0, "id": "c0", "function": {"name": "cfg", "arguments": args[:20]}}]}
        ),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[20:]}}]}),
        _chunk({}, "tool_calls"),
        done=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, API))
    assert msg.stop_reason == "toolUse"
    assert msg.tool_calls()[0].arguments == {
        "finish_reason": "length",
        "max_tokens": 5,
        "note": "stop_reason max_tokens",
    }


async def test_length_cuts_tool_json(replay: ReplayServer) -> None:
    """``finish_reason: length`` in the middle of argument JSON: stop_reason length, partial arguments."""
    body = sse(
        _chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c0", "function": {"name": "w", "arguments": '{"city": "New Yo'}}
                ]
            }
        ),
        _chunk({}, "length"),
        done=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, API))
    assert msg.stop_reason == "length"
    assert msg.tool_calls()[0].arguments == {"city": "New Yo"}


async def test_refusal_is_an_error_with_its_text(replay: ReplayServer) -> None:
    body = sse(
        _chunk({"role": "assistant", "content": None, "refusal": "I can't help"}),
        _chunk({}, "stop"),
        done=True,
    )
    replay.enqueue(Reply(body=body))
    events, msg = await run(model_for(replay, API))
    assert (msg.stop_reason, msg.error_message, msg.text()) == (
        "error",
        "refusal: I can't help",
        "I can't help",
    )
    assert events[-1].type == "error"


async def test_deepseek_multi_turn_sends_reasoning_content(replay: ReplayServer, fixtures_dir: Path) -> None:
    """DeepSeek requires the assistant's reasoning_content back with its tool calls."""
    first = sse(
        _chunk({"role": "assistant", "content": None, "reasoning_content": "Need the weather."}),
        _chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_1", "function": {"name": "weather", "arguments": '{"c":"SF"}'}}
                ]
            }
        ),
        _chunk({}, "tool_calls"),
        done=True,
    )
    replay.enqueue(
        Reply(body=first), Reply.fixture(fixtures_dir / "openai/chat_stream_deepseek_reasoning.sse")
    )
    model = model_for(replay, API, "deepseek-reasoner", reasoning=True, compat={"profile": "deepseek"})
    tools = [Tool(name="weather", parameters={"type": "object", "properties": {"c": {"type": "string"}}})]
    ctx = Context(messages=[UserMessage(content="weather?", timestamp=1)], tools=tools)
    _, turn1 = await run(model, ctx)
    assert [type(b) for b in turn1.content] == [ThinkingContent, ToolCall]
    ctx.messages += [
        turn1,
        ToolResultMessage(tool_call_id="call_1", tool_name="weather", content=[TextContent(text="sunny")]),
    ]
    _, turn2 = await run(model, ctx)
    assert turn2.stop_reason == "stop"
    msgs = replay.requests[1].json()["messages"]
    assert msgs == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Need the weather.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"c": "SF"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    assert replay.requests[1].json()["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "description": "", "parameters": tools[0].parameters},
        }
    ]


async def test_local_server_profile_does_not_send_reasoning_content(replay: ReplayServer) -> None:
    """A local OpenAI-compatible server (Ollama/vLLM style) gets no reasoning_content field back."""
    replay.enqueue(Reply(body=sse(_chunk({"content": "fine"}), _chunk({}, "stop"), done=True)))
    prior = AssistantMessage(
        api=API,
        provider="p",
        model="m1",
        content=[ThinkingContent(thinking="hmm"), TextContent(text="hello")],
    )
    ctx = Context(
        messages=[UserMessage(content="a", timestamp=1), prior, UserMessage(content="b", timestamp=2)]
    )
    await run(model_for(replay, API), ctx)
    assert replay.requests[0].json()["messages"] == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "b"},
    ]


async def test_developer_role_for_openai_reasoning_models(replay: ReplayServer) -> None:
    replay.enqueue(Reply(body=sse(_chunk({"content": "x"}), _chunk({}, "stop"), done=True)))
    await run(
        model_for(replay, API, "o4-mini", reasoning=True, compat={"profile": "openai"}),
        hello(),
        tool_choice="auto",
    )
    body = replay.requests[0].json()
    assert body["messages"][0] == {"role": "developer", "content": "be brief"}
    assert "tool_choice" not in body  # no tools: no tool_choice


async def test_reasoning_field_and_tool_result_name(replay: ReplayServer) -> None:
    """vLLM/OpenRouter send ``delta.reasoning``; ``tool_result_needs_name`` adds ``name`` to tool messages."""
    body = sse(_chunk({"reasoning": "think"}), _chunk({"content": "done"}), _chunk({}, "stop"), done=True)
    replay.enqueue(Reply(body=body))
    prior = AssistantMessage(api=API, provider="p", model="m1", content=[ToolCall(id="t1", name="clock")])
    result = ToolResultMessage(tool_call_id="t1", tool_name="clock", content=[TextContent(text="12:00")])
    ctx = Context(messages=[UserMessage(content="time?", timestamp=1), prior, result])
    _, msg = await run(model_for(replay, API, compat={"tool_result_needs_name": True}), ctx)
    assert [b.model_dump() for b in msg.content] == [
        {"type": "thinking", "thinking": "think", "signature": None, "redacted": False},
        {"type": "text", "text": "done", "text_signature": None},
    ]
    assert replay.requests[0].json()["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "12:00", "name": "clock"},
    ]


async def test_json_schema_fixture_as_a_non_streaming_body(replay: ReplayServer, fixtures_dir: Path) -> None:
    """A server that ignores ``stream: true`` answers with one ``chat.completion`` JSON body."""
    replay.enqueue(Reply.fixture(fixtures_dir / "openai/chat_completion_json_schema.json"))
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    events, msg = await run(model_for(replay, API), output_schema=schema)
    assert dump(msg) == {
        "role": "assistant",
        "content": [
            {
                "type": "text",
                "text": '{"city":"San Francisco","temperature":65,"units":"f"}',
                "text_signature": None,
            }
        ],
        "api": API,
        "provider": "p",
        "model": "m1",
        "usage": usage(input=79, output=14),
        "stop_reason": "stop",
        "error_message": None,
        "response_id": "chatcmpl-ABfvbtVnTu5DeC4EFnRYj8mtfOM99",
    }
    assert [e.type for e in events] == ["start", "text_start", "text_delta", "text_end", "done"]
    assert replay.requests[0].json()["response_format"]["json_schema"]["schema"] == schema

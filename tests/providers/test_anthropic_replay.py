"""anthropic-messages: every Anthropic fixture replayed over loopback, plus the bug shapes."""

from __future__ import annotations

import json
from pathlib import Path

from tests.providers.helpers import dump, model_for, run, sse, usage
from tests.providers.replay_server import ReplayServer, Reply

API = "anthropic-messages"


def _base(**kw: object) -> dict:
    return {"api": API, "provider": "p", "model": "m1", "error_message": None, **kw}


async def test_text_fixture(replay: ReplayServer, fixtures_dir: Path) -> None:
    replay.enqueue(Reply.fixture(fixtures_dir / "anthropic/messages_stream_text.sse", seed=4, max_chunk=5))
    events, msg = await run(model_for(replay, API))
    assert dump(msg) == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello there!", "text_signature": None}],
        "usage": usage(input=11, output=6),
        "stop_reason": "stop",
        "response_id": "msg_4QpJur2dWWDjF6C758FbBw5vm12BaVipnK",
        **_base(),
    }
    assert [e.type for e in events] == [
        "start",
        "text_start",
        "text_delta",
        "text_delta",
        "text_delta",
        "text_end",
        "done",
    ]
    req = replay.requests[0]
    assert req.path == "/v1/messages"
    assert req.headers["x-api-key"] == "sk-test-key-123456"
    assert req.headers["anthropic-version"] == "2023-06-01"
    assert req.json() == {
        "model": "m1",
        "max_tokens": 4096,
        "stream": True,
        "system": "be brief",
        "messages": [{"role": "user", "content": "hi"}],
    }


async def test_tool_use_fixture(replay: ReplayServer, fixtures_dir: Path) -> None:
    replay.enqueue(Reply.fixture(fixtures_dir / "anthropic/messages_stream_tool_use.sse", seed=5))
    events, msg = await run(model_for(replay, API))
    assert dump(msg) == {
        "role": "assistant",
        "content": [
            {
                "type": "text",
                "text": "I'll check the current weather in Paris for you.",
                "text_signature": None,
            },
            {
                "type": "toolCall",
                "id": "toolu_01NRLabsLyVHZPKxbKvkfSMn",
                "name": "get_weather",
                "arguments": {"location": "Paris"},
                "thought_signature": None,
            },
        ],
        "usage": usage(input=377, output=65),
        "stop_reason": "toolUse",
        "response_id": "msg_019Q1hrJbZG26Fb9BQhrkHEr",
        **_base(),
    }
    assert [e.delta for e in events if e.type == "toolcall_delta"] == ['{"locati', 'on": "P', "ar", 'is"}']


async def test_thinking_fixture(replay: ReplayServer, fixtures_dir: Path) -> None:
    replay.enqueue(Reply.fixture(fixtures_dir / "anthropic/messages_stream_thinking_docs.sse", seed=6))
    _, msg = await run(model_for(replay, API))
    assert dump(msg) == {
        "role": "assistant",
        "content": [
            {
                "type": "thinking",
                "thinking": "Let me solve this step by step:\n\n1. First break down 27 * 453"
                "\n2. 453 = 400 + 50 + 3\n3. 27 * 400 = 10,800\n4. 27 * 50 = 1,350"
                "\n5. 27 * 3 = 81\n6. 10,800 + 1,350 + 81 = 12,231",
                "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds...",
                "redacted": False,
            },
            {"type": "text", "text": "27 * 453 = 12,231", "text_signature": None},
        ],
        "usage": usage(),
        "stop_reason": "stop",
        "response_id": "msg_01...",
        **_base(),
    }


async def test_overloaded_error_fixture_after_content(replay: ReplayServer, fixtures_dir: Path) -> None:
    """data-only events (no ``event:`` line) fall back to the payload type; the error is not retried
    because content had already arrived."""
    replay.enqueue(Reply.fixture(fixtures_dir / "anthropic/messages_stream_error_overloaded.sse", seed=7))
    events, msg = await run(model_for(replay, API), max_retries=3)
    assert dump(msg) == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello", "text_signature": None}],
        "usage": usage(input=17, output=1),
        "stop_reason": "error",
        "response_id": "msg_01KfpJoAEabmH2iHRRFjQMAG",
        **_base(error_message="overloaded_error: Overloaded"),
    }
    assert events[-1].type == "error" and len(replay.requests) == 1


async def test_overloaded_before_content_is_retried(
    replay: ReplayServer, fixtures_dir: Path, monkeypatch
) -> None:
    import providers.transport as transport

    waits: list[float] = []

    async def no_wait(s: float) -> None:
        waits.append(s)

    monkeypatch.setattr(transport, "_sleep", no_wait)
    overloaded = sse(
        {
            "type": "message_start",
            "message": {"id": "msg_x", "usage": {"input_tokens": 3, "output_tokens": 1}},
        },
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        events=True,
    )
    replay.enqueue(Reply(body=overloaded), Reply.fixture(fixtures_dir / "anthropic/messages_stream_text.sse"))
    _, msg = await run(model_for(replay, API))
    assert (msg.stop_reason, msg.text(), msg.usage.input, len(replay.requests), len(waits)) == (
        "stop",
        "Hello there!",
        11,
        2,
        1,
    )


async def test_empty_input_block_start_and_zero_arg_tool(replay: ReplayServer) -> None:
    """``input: {}`` at block start + deltas must not give ``{}{...}``; only empty ``partial_json`` → {}."""
    body = sse(
        {
            "type": "message_start",
            "message": {
                "id": "m",
                "usage": {
                    "input_tokens": 5,
                    "output_tokens": 1,
                    "cache_read_input_tokens": 7,
                    "cache_creation_input_tokens": 2,
                },
            },
        },
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "t1", "name": "now", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": ""},
        },
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "t2", "name": "add", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"a": 1'},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": "}"},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {"type": "tool_use", "id": "t3", "name": "echo", "input": {"x": "y"}},
        },
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 30}},
        {"type": "message_stop"},
        events=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, API))
    assert [(c.id, c.name, c.arguments) for c in msg.tool_calls()] == [
        ("t1", "now", {}),
        ("t2", "add", {"a": 1}),
        ("t3", "echo", {"x": "y"}),
    ]
    assert dump(msg)["usage"] == usage(input=5, output=30, cache_read=7, cache_write=2)
    assert msg.stop_reason == "toolUse"


async def test_redacted_thinking_unknown_blocks_and_stop_mapping(replay: ReplayServer) -> None:
    body = sse(
        {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 1, "output_tokens": 1}}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "redacted_thinking", "data": "ENCRYPTED"},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "A"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "future_block"}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "B"}},
        {"type": "content_block_stop", "index": 2},
        {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, API))
    assert dump(msg)["content"] == [
        {"type": "thinking", "thinking": "", "signature": "ENCRYPTED", "redacted": True},
        {"type": "text", "text": "A", "text_signature": None},
        {"type": "text", "text": "B", "text_signature": None},
    ]
    assert msg.stop_reason == "length"


async def test_refusal_stop_reason_is_error(replay: ReplayServer) -> None:
    body = sse(
        {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 1, "output_tokens": 1}}},
        {"type": "message_delta", "delta": {"stop_reason": "refusal"}, "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
        events=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, API))
    assert (msg.stop_reason, msg.error_message) == ("error", "stop_reason: refusal")


async def test_non_streaming_message_body(replay: ReplayServer) -> None:
    doc = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m1",
        "stop_reason": "tool_use",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "S"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "find", "input": {"q": "x"}},
        ],
        "usage": {"input_tokens": 10, "output_tokens": 20, "cache_read_input_tokens": 3},
    }
    replay.enqueue(Reply(body=json.dumps(doc).encode(), content_type="application/json"))
    _, msg = await run(model_for(replay, API))
    assert dump(msg) == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "S", "redacted": False},
            {"type": "text", "text": "Let me look.", "text_signature": None},
            {
                "type": "toolCall",
                "id": "toolu_1",
                "name": "find",
                "arguments": {"q": "x"},
                "thought_signature": None,
            },
        ],
        "usage": usage(input=10, output=20, cache_read=3),
        "stop_reason": "toolUse",
        "response_id": "msg_1",
        **_base(),
    }

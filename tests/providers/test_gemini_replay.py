"""google-generative-ai: every Gemini fixture replayed over loopback, plus the bug shapes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from runtime.llm.types import Context, TextContent, Tool, ToolResultMessage, UserMessage
from tests.providers.helpers import dump, model_for, run, sse, usage
from tests.providers.replay_server import ReplayServer, Reply

API = "google-generative-ai"


def _sig(path: Path, n: int) -> str:
    chunks = [json.loads(line[6:]) for line in path.read_text().splitlines() if line.startswith("data: ")]
    return chunks[n]["candidates"][0]["content"]["parts"][0]["thoughtSignature"]


async def test_text_fixture(replay: ReplayServer, fixtures_dir: Path) -> None:
    path = fixtures_dir / "gemini/stream_text.sse"
    replay.enqueue(Reply.fixture(path, seed=8))
    _, msg = await run(model_for(replay, API, "gemini-3-pro-preview", reasoning=True))
    assert dump(msg) == {
        "role": "assistant",
        "content": [
            {
                "type": "text",
                "text": 'There are **3** "r"s in strawberry.\n\nst**r**awbe**rr**y',
                "text_signature": _sig(path, 2),
            },
        ],
        "api": API,
        "provider": "p",
        "model": "gemini-3-pro-preview",
        "usage": usage(input=9, output=23 + 185),
        "stop_reason": "stop",
        "error_message": None,
        "response_id": "bH6LaZW8Fp_3nsEPqtaSwQ4",
    }
    req = replay.requests[0]
    assert req.path == "/v1beta/models/gemini-3-pro-preview:streamGenerateContent"
    assert req.query == {"alt": ["sse"]}
    assert req.headers["x-goog-api-key"] == "sk-test-key-123456"
    assert req.json() == {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "generationConfig": {"maxOutputTokens": 4096, "thinkingConfig": {"includeThoughts": True}},
        "systemInstruction": {"parts": [{"text": "be brief"}]},
    }


async def test_function_call_fixture_mints_id_and_replies_with_it(
    replay: ReplayServer, fixtures_dir: Path
) -> None:
    path = fixtures_dir / "gemini/stream_function_call_gemini3.sse"
    replay.enqueue(
        Reply.fixture(path, seed=9, max_chunk=500), Reply.fixture(fixtures_dir / "gemini/stream_text.sse")
    )
    model = model_for(replay, API, "gemini-3-pro-preview")
    tools = [
        Tool(
            name="weather",
            description="w",
            parameters={"type": "object", "properties": {"location": {"type": "string"}}},
        )
    ]
    ctx = Context(messages=[UserMessage(content="weather in SF?", timestamp=1)], tools=tools)
    _, msg = await run(model, ctx, tool_choice="weather")
    [call] = msg.tool_calls()
    assert re.fullmatch(r"call_[0-9a-f]{12}", call.id)
    assert dump(msg) == {
        "role": "assistant",
        "content": [
            {
                "type": "toolCall",
                "id": call.id,
                "name": "weather",
                "arguments": {"location": "San Francisco"},
                "thought_signature": _sig(path, 0),
            }
        ],
        "api": API,
        "provider": "p",
        "model": "gemini-3-pro-preview",
        "usage": usage(input=29, output=15 + 804),
        "stop_reason": "toolUse",
        "error_message": None,
        "response_id": "QHiLaa6LBrb8vdIPoNztsAg",
    }
    body1 = replay.requests[0].json()
    assert body1["tools"] == [
        {
            "functionDeclarations": [
                {"name": "weather", "description": "w", "parametersJsonSchema": tools[0].parameters}
            ]
        }
    ]
    assert body1["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}
    }
    ctx.messages += [
        msg,
        ToolResultMessage(tool_call_id=call.id, tool_name="weather", content=[TextContent(text="18C fog")]),
    ]
    await run(model, ctx)
    assert replay.requests[1].json()["contents"] == [
        {"role": "user", "parts": [{"text": "weather in SF?"}]},
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"id": call.id, "name": "weather", "args": {"location": "San Francisco"}},
                    "thoughtSignature": _sig(path, 0),
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"id": call.id, "name": "weather", "response": {"output": "18C fog"}}}
            ],
        },
    ]


async def test_calls_in_separate_chunks_stay_separate_and_thoughts(replay: ReplayServer) -> None:
    body = sse(
        {"candidates": [{"content": {"parts": [{"text": "plan", "thought": True}], "role": "model"}}]},
        {
            "candidates": [
                {"content": {"parts": [{"functionCall": {"name": "a", "args": {}}}], "role": "model"}}
            ]
        },
        {
            "candidates": [
                {"content": {"parts": [{"functionCall": {"name": "a", "args": {"k": 1}}}], "role": "model"}}
            ]
        },
        {
            "candidates": [
                {
                    "content": {"parts": [{"functionCall": {"id": "given", "name": "b"}}], "role": "model"},
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 50,
                "cachedContentTokenCount": 20,
                "candidatesTokenCount": 4,
            },
        },
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, API))
    calls = msg.tool_calls()
    assert [(c.name, c.arguments) for c in calls] == [("a", {}), ("a", {"k": 1}), ("b", {})]
    assert calls[2].id == "given" and len({c.id for c in calls}) == 3
    assert dump(msg)["content"][0] == {
        "type": "thinking",
        "thinking": "plan",
        "signature": None,
        "redacted": False,
    }
    assert dump(msg)["usage"] == usage(input=30, output=4, cache_read=20)
    assert msg.stop_reason == "toolUse"


async def test_finish_reasons(replay: ReplayServer) -> None:
    def one(reason: str) -> bytes:
        return sse(
            {"candidates": [{"content": {"parts": [{"text": "x"}], "role": "model"}, "finishReason": reason}]}
        )

    replay.enqueue(Reply(body=one("MAX_TOKENS")), Reply(body=one("SAFETY")), Reply(body=one("RECITATION")))
    results = [(await run(model_for(replay, API)))[1] for _ in range(3)]
    assert [(m.stop_reason, m.error_message, m.text()) for m in results] == [
        ("length", None, "x"),
        ("error", "finishReason: SAFETY", "x"),
        ("error", "finishReason: RECITATION", "x"),
    ]

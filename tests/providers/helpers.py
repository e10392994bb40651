"""Small builders shared by the provider tests."""

from __future__ import annotations

from typing import Any

from runtime.llm.events import AssistantMessageEvent
from runtime.llm.options import StreamOptions
from runtime.llm.stream import stream
from runtime.llm.types import AssistantMessage, Context, Model, UserMessage
from tests.providers.replay_server import ReplayServer

OPENAI, ANTHROPIC, GEMINI = "openai-completions", "anthropic-messages", "google-generative-ai"
"""The api ids of the three built-in streaming providers."""

BASE_PATHS = {"openai-completions": "/v1", "anthropic-messages": "", "google-generative-ai": "/v1beta"}


def model_for(server: ReplayServer, api: str, model_id: str = "m1", **kw: Any) -> Model:
    """A model of ``api`` pointing at the replay server (provider alias ``p``)."""
    kw.setdefault("provider", "p")
    return Model(id=model_id, api=api, base_url=server.base_url + BASE_PATHS[api], **kw)


def hello() -> Context:
    return Context(system_prompt="be brief", messages=[UserMessage(content="hi", timestamp=1)])


async def run(
    model: Model, context: Context | None = None, **opts: Any
) -> tuple[list[AssistantMessageEvent], AssistantMessage]:
    """Stream one call; return every event and the final message."""
    opts.setdefault("api_key", "sk-test-key-123456")
    s = stream(model, context or hello(), StreamOptions(**opts))
    events = [e async for e in s]
    return events, await s.result()


def dump(msg: AssistantMessage) -> dict[str, Any]:
    """The message as a dict without its wall-clock timestamp."""
    return msg.model_dump(exclude={"timestamp"})


def usage(input: int = 0, output: int = 0, cache_read: int = 0, cache_write: int = 0) -> dict[str, Any]:
    return {
        "input": input,
        "output": output,
        "cache_read": cache_read,
        "cache_write": cache_write,
        "total_tokens": input + output + cache_read + cache_write,
        "cost": {"input": 0.0, "output": 0.0, "cache_read": 0.0, "cache_write": 0.0, "total": 0.0},
    }


def sse(*payloads: Any, done: bool = False, events: bool = False) -> bytes:
    """Frame JSON payloads as SSE (``event: <type>`` lines when ``events``)."""
    import json

    out = []
    for p in payloads:
        line = f"data: {json.dumps(p, ensure_ascii=False)}\n\n"
        if events:
            line = f"event: {p['type']}\n" + line
        out.append(line)
    if done:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def openai_text(text: str, finish: str | None = None) -> dict[str, Any]:
    """One Chat Completions stream chunk (id ``c1``) whose delta is ``text``, with ``finish_reason``."""
    return {"id": "c1", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


async def shout(context: Context, options: StreamOptions | None = None) -> AssistantMessage:
    """A faux ``script`` (``tests/providers/test_faux_script.py``): the last user text upper-cased
    (async, to show an awaitable script is awaited)."""
    from runtime.llm.types import TextContent

    text = str(context.messages[-1].content) if context.messages else ""
    return AssistantMessage(content=[TextContent(text=text.upper())])

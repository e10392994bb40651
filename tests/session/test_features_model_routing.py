"""Vision routing (faux text + faux vision model) and the fallback chain (replay server 503 before
content, mid-stream error without fallback) —
docs/decisions.md#model-routing, docs/decisions.md#model-fallback-chain."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from providers import register_builtin_providers
from providers.faux import faux_assistant_message, faux_text, register_faux_provider
from runtime.agent.config import AgentContext, AgentLoopConfig
from runtime.agent.events import AgentEndEvent
from runtime.agent.loop import agent_loop
from runtime.llm.options import StreamOptions
from runtime.llm.types import AssistantMessage, Context, ImageContent, Model, TextContent, UserMessage
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.session.model_routing import (
    IMAGE_PLACEHOLDER,
    FallbackChain,
    fallback_reason,
    guard_images,
    has_image_segments,
    select_model,
)
from tests.providers.replay_server import ReplayServer, Reply

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()
IMAGE_SEGMENT = {"type": "image", "data": {"media": {"kind": "url", "value": "https://img.example/a.png"}}}


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    register_builtin_providers()
    with ReplayServer() as server:
        yield server


def openai_model(server: ReplayServer, provider: str = "primary") -> Model:
    return Model(id="m1", api="openai-completions", provider=provider, base_url=server.base_url + "/v1")


def image_turn() -> UserMessage:
    return UserMessage(
        content=[TextContent(text="what is this?"), ImageContent(data=PNG, mime_type="image/png")]
    )


def sent_blocks(call: Any) -> list[Any]:
    msg = call.context.messages[-1]
    return [(b.type, getattr(b, "text", None)) for b in msg.content]


async def run_loop(model: Model, prompt: UserMessage, stream_fn: Any, **opts: Any) -> AgentEndEvent:
    config = AgentLoopConfig(model=model, stream_fn=stream_fn, stream_options=StreamOptions(**opts))
    events = [e async for e in agent_loop([prompt], AgentContext(), config)]
    end = events[-1]
    assert isinstance(end, AgentEndEvent)
    return end


# ------------------------------------------------------------------ vision routing


async def test_image_turn_goes_to_the_vision_model(metric: Callable[..., float]) -> None:
    text = register_faux_provider([], provider="route-text", models=["text-model"])
    vision = register_faux_provider(
        [faux_assistant_message([faux_text("a cat")])],
        provider="route-vision",
        models=[Model(id="vision-model", api="faux", provider="x", input=["text", "image"])],
    )
    assert has_image_segments([{"type": "text", "data": {"text": "hi"}}, IMAGE_SEGMENT]) is True
    model, route = select_model(text.get_model(), vision.get_model(), has_images=True)
    assert (model.ref(), route) == ("route-vision/vision-model", "vision_model")
    end = await run_loop(model, image_turn(), FallbackChain())
    assert [m.text() for m in end.messages if isinstance(m, AssistantMessage)] == ["a cat"]
    assert text.call_count == 0
    assert sent_blocks(vision.calls[0]) == [("text", "what is this?"), ("image", None)]
    # a text-only turn stays on the main model even with a vision model configured
    assert select_model(text.get_model(), vision.get_model(), has_images=False) == (
        text.get_model(),
        "main_model",
    )
    assert metric("sessionray_vision_routes_total", route="vision_model") == 1.0


async def test_image_to_text_only_model_without_vision_model_becomes_placeholder(
    metric: Callable[..., float],
) -> None:
    text = register_faux_provider(
        [faux_assistant_message([faux_text("I cannot see images, sorry")])],
        provider="route-text2",
        models=["text-model"],
    )
    model, route = select_model(text.get_model(), None, has_images=True)
    assert (model, route) == (text.get_model(), "placeholder")
    end = await run_loop(model, image_turn(), FallbackChain())
    final = end.messages[-1]
    assert isinstance(final, AssistantMessage)
    assert (final.stop_reason, final.text()) == ("stop", "I cannot see images, sorry")
    assert sent_blocks(text.calls[0]) == [("text", "what is this?"), ("text", IMAGE_PLACEHOLDER)]
    assert metric("sessionray_vision_routes_total", route="placeholder") == 1.0


def test_guard_images_keeps_vision_contexts_and_collapses_runs() -> None:
    ctx = Context(
        messages=[
            UserMessage(content=[ImageContent(data=PNG, mime_type="image/png")] * 2 + [TextContent(text="x")])
        ]
    )
    vision = Model(id="v", api="faux", input=["text", "image"])
    assert guard_images(vision, ctx) is ctx
    out = guard_images(Model(id="t", api="faux"), ctx)
    assert out.messages[0].content == [TextContent(text=IMAGE_PLACEHOLDER), TextContent(text="x")]  # type: ignore[union-attr]
    assert ctx.messages[0].content[0] == ImageContent(data=PNG, mime_type="image/png")  # type: ignore[index]


# ------------------------------------------------------------------ fallback chain


async def test_503_before_content_moves_to_the_next_model_and_session_records_it(
    replay: ReplayServer, tmp_path: Path, metric: Callable[..., float]
) -> None:
    replay.enqueue(Reply.error(503, {"error": {"message": "upstream unavailable"}}))
    backup = register_faux_provider(
        [faux_assistant_message([faux_text("from the backup")])], provider="backup"
    )
    chain = FallbackChain([backup.get_model()])
    end = await run_loop(
        openai_model(replay), UserMessage(content="hi"), chain, api_key="sk-x", max_retries=0
    )
    final = end.messages[-1]
    assert isinstance(final, AssistantMessage)
    assert (final.stop_reason, final.text(), final.provider, final.model) == (
        "stop",
        "from the backup",
        "backup",
        "faux-model",
    )
    assert len(replay.requests) == 1 and backup.call_count == 1
    assert chain.switches == [("primary/m1", "backup/faux-model", "server_error")]
    assert chain.answered == backup.get_model()
    assert (
        metric(
            "sessionray_model_fallbacks_total",
            from_api="openai-completions",
            to_api="faux",
            reason="server_error",
        )
        == 1.0
    )
    # agent_sessions.model records the model that answered
    db = Database(f"sqlite:///{tmp_path / 'm.db'}")
    db.create_tables()
    try:
        repo = ContextRepository(db)
        sid = await repo.get_or_create_active("console:bot:private:u1", model="primary/m1")
        await repo.append_messages(sid, end.messages)
        info = await repo.get_session(sid)
        assert info is not None and info.model == "backup/faux-model"
    finally:
        db.dispose()


async def test_error_after_content_started_does_not_fall_back(
    replay: ReplayServer, fixtures_dir: Path, metric: Callable[..., float]
) -> None:
    body = (fixtures_dir / "openai/chat_stream_text_with_usage.sse").read_bytes()
    cut = body.index(b"\n\n", body.index(b'" unable"')) + 2  # after two content deltas
    replay.enqueue(Reply(body=body, cut_after=cut))
    backup = register_faux_provider([faux_assistant_message([faux_text("never used")])], provider="backup2")
    chain = FallbackChain([backup.get_model()])
    end = await run_loop(
        openai_model(replay), UserMessage(content="hi"), chain, api_key="sk-x", max_retries=2
    )
    final = end.messages[-1]
    assert isinstance(final, AssistantMessage)
    assert (final.stop_reason, final.provider, final.text()) == ("error", "primary", "I'm unable")
    assert (backup.call_count, chain.switches, len(replay.requests)) == (0, [], 1)
    assert (
        metric(
            "sessionray_model_fallbacks_total",
            from_api="openai-completions",
            to_api="faux",
            reason="connection",
        )
        == 0.0
    )


async def test_429_after_retries_then_connection_failure_then_answer(replay: ReplayServer) -> None:
    replay.enqueue(
        Reply.error(429, {"error": {"message": "slow down"}}, headers={"retry-after": "0"}),
        Reply.error(429, {"error": {"message": "slow down"}}, headers={"retry-after": "0"}),
    )
    closed = Model(id="m2", api="openai-completions", provider="dead", base_url="http://127.0.0.1:9/v1")
    backup = register_faux_provider([faux_assistant_message([faux_text("third time")])], provider="backup3")
    chain = FallbackChain([closed, backup.get_model()], get_api_key=lambda provider: f"key-{provider}")
    end = await run_loop(
        openai_model(replay), UserMessage(content="hi"), chain, api_key="sk-x", max_retries=1
    )
    assert [m.text() for m in end.messages if isinstance(m, AssistantMessage)] == ["third time"]
    assert len(replay.requests) == 2  # one try + one retry, then the switch
    assert chain.switches == [
        ("primary/m1", "dead/m2", "rate_limited"),
        ("dead/m2", "backup3/faux-model", "connection"),
    ]
    assert backup.calls[0].options is not None and backup.calls[0].options.api_key == "key-backup3"


async def test_client_error_is_not_retried_elsewhere(replay: ReplayServer) -> None:
    replay.enqueue(Reply.error(400, {"error": {"message": "bad request"}}))
    backup = register_faux_provider([faux_assistant_message([faux_text("no")])], provider="backup4")
    chain = FallbackChain([backup.get_model()])
    end = await run_loop(
        openai_model(replay), UserMessage(content="hi"), chain, api_key="sk-x", max_retries=0
    )
    final = end.messages[-1]
    assert isinstance(final, AssistantMessage)
    assert (final.stop_reason, final.error_message, backup.call_count) == (
        "error",
        "HTTP 400: bad request",
        0,
    )


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        ("HTTP 503: down", "server_error"),
        ("HTTP 500: oops", "server_error"),
        ("HTTP 429: slow", "rate_limited"),
        ("HTTP 529: overloaded_error: Overloaded", "overloaded"),
        ("overloaded_error: Overloaded", "overloaded"),
        ("connection error: ConnectError: refused", "connection"),
        ("timeout: ReadTimeout", "connection"),
        ("HTTP 401: bad key", None),
        ("schema rejected", None),
    ],
)
def test_fallback_reason(error: str, reason: str | None) -> None:
    assert fallback_reason(AssistantMessage(stop_reason="error", error_message=error)) == reason
    assert fallback_reason(AssistantMessage(stop_reason="aborted", error_message=error)) is None

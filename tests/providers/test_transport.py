"""The common transport: SSE decoding, retries, errors, keys, timeouts, abort
(docs/decisions.md#llm-transport)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import pytest

import providers.transport as transport
from providers.transport import SSEDecoder, error_message_from_body, retry_delay_s
from runtime.llm.abort import AbortController
from runtime.llm.options import StreamOptions
from runtime.llm.stream import stream
from tests.providers.helpers import hello, model_for, run, sse
from tests.providers.replay_server import ReplayServer, Reply

OPENAI = "openai-completions"


def _text_chunk(text: str, finish: str | None = None) -> dict:
    return {"id": "c", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


# --------------------------------------------------------------------------- SSE decoding


def test_decoder_every_split_point_keeps_multibyte_characters() -> None:
    raw = 'event: x\ndata: {"t": "雪☃ok"}\r\n\r\n: comment\ndata: a\ndata: b\n\ndata: [DONE]\n\n'.encode()
    expected = [("x", '{"t": "雪☃ok"}'), (None, "a\nb"), (None, "[DONE]")]
    for cut in range(len(raw) + 1):
        d = SSEDecoder()
        assert d.feed(raw[:cut]) + d.feed(raw[cut:]) + d.flush() == expected, cut
    d = SSEDecoder()
    assert [e for b in raw for e in d.feed(bytes([b]))] == expected  # one byte per read


def test_decoder_flushes_an_unterminated_last_event() -> None:
    d = SSEDecoder()
    assert d.feed(b'data: {"a": 1}\ndata:x') == []
    assert d.flush() == [(None, '{"a": 1}\nx')]


async def test_three_byte_character_split_across_two_reads(replay: ReplayServer) -> None:
    body = sse(_text_chunk("雪"), _text_chunk("", "stop"), done=True)
    cut = body.index("雪".encode()) + 1  # inside the 3-byte character
    replay.enqueue(Reply(body=body, splits=[cut], delay_s=0.05))
    _, msg = await run(model_for(replay, OPENAI))
    assert (msg.text(), msg.stop_reason) == ("雪", "stop")


def test_error_message_and_retry_after_parsing() -> None:
    assert (
        error_message_from_body(429, b'{"error": {"message": "Rate limit", "type": "requests"}}')
        == "HTTP 429: requests: Rate limit"
    )
    assert error_message_from_body(
        529, b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    ) == ("HTTP 529: overloaded_error: Overloaded")
    assert error_message_from_body(
        400, b'[{"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}]'
    ) == ("HTTP 400: INVALID_ARGUMENT: bad")
    assert error_message_from_body(502, b"<html>bad gateway</html>") == "HTTP 502: <html>bad gateway</html>"
    assert retry_delay_s(0, httpx.Headers({"retry-after": "3"})) == 3.0
    assert retry_delay_s(0, httpx.Headers({"retry-after-ms": "250", "retry-after": "3"})) == 0.25
    assert retry_delay_s(0, httpx.Headers({"retry-after": "9999"})) == transport.MAX_RETRY_DELAY_S
    assert 0.5 <= retry_delay_s(0) <= 0.625 and 2.0 <= retry_delay_s(2) <= 2.5


# --------------------------------------------------------------------------- retries and errors


async def test_429_with_retry_after_then_success(
    replay: ReplayServer, fixtures_dir: Path, waits: list[float]
) -> None:
    replay.enqueue(
        Reply.error(
            429, {"error": {"message": "Rate limit reached", "type": "tokens"}}, headers={"retry-after": "2"}
        ),
        Reply.fixture(fixtures_dir / "openai/chat_stream_text_with_usage.sse"),
    )
    events, msg = await run(model_for(replay, OPENAI))
    assert waits == [2.0]
    assert msg.stop_reason == "stop" and msg.text().startswith("I'm unable")
    assert [r.json() == replay.requests[0].json() for r in replay.requests] == [True, True]
    assert [e.type for e in events].count("start") == 1


async def test_retries_exhausted_give_the_providers_message(replay: ReplayServer, waits: list[float]) -> None:
    replay.enqueue(*[Reply.error(503, {"error": {"message": "upstream busy"}}) for _ in range(3)])
    events, msg = await run(model_for(replay, OPENAI), max_retries=2)
    assert (msg.stop_reason, msg.error_message) == ("error", "HTTP 503: upstream busy")
    assert len(replay.requests) == 3 and len(waits) == 2
    assert [e.type for e in events] == ["start", "error"]


async def test_400_is_not_retried(replay: ReplayServer, waits: list[float]) -> None:
    replay.enqueue(
        Reply.error(
            400, {"error": {"message": "Invalid 'messages[1].role'", "type": "invalid_request_error"}}
        )
    )
    _, msg = await run(model_for(replay, OPENAI))
    assert msg.error_message == "HTTP 400: invalid_request_error: Invalid 'messages[1].role'"
    assert len(replay.requests) == 1 and waits == []


async def test_500_after_first_token_is_not_retried(replay: ReplayServer, waits: list[float]) -> None:
    body = sse(_text_chunk("Hel"), _text_chunk("lo"))
    replay.enqueue(
        Reply(body=body, cut_after=len(sse(_text_chunk("Hel"))) + 5),
        Reply(body=sse(_text_chunk("x", "stop"))),
    )
    events, msg = await run(model_for(replay, OPENAI))
    assert msg.stop_reason == "error" and msg.text() == "Hel"
    assert msg.error_message is not None and msg.error_message.startswith("connection error while streaming")
    assert len(replay.requests) == 1 and waits == []
    assert events[-1].type == "error"


async def test_in_stream_server_error_after_first_token(replay: ReplayServer, waits: list[float]) -> None:
    body = sse(_text_chunk("Hel"), {"error": {"message": "Internal server error", "code": 500}})
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, OPENAI))
    assert (msg.stop_reason, msg.error_message, msg.text()) == (
        "error",
        "stream error: Internal server error",
        "Hel",
    )
    assert waits == []


async def test_drop_before_content_is_retried(replay: ReplayServer, waits: list[float]) -> None:
    replay.enqueue(Reply(body=sse(_text_chunk("x")), cut_after=3), Reply(body=sse(_text_chunk("ok", "stop"))))
    _, msg = await run(model_for(replay, OPENAI))
    assert (msg.text(), msg.stop_reason, len(replay.requests), len(waits)) == ("ok", "stop", 2, 1)


async def test_api_key_never_in_errors_or_logs(
    replay: ReplayServer, waits: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    key = "sk-secret-abcdef-987654"
    replay.enqueue(
        Reply.error(500, {"error": {"message": f"key {key} is broken"}}),
        Reply.error(401, {"error": {"message": f"Incorrect API key provided: {key}"}}),
    )
    caplog.set_level(logging.DEBUG)
    _, msg = await run(model_for(replay, OPENAI), api_key=key)
    assert msg.error_message == "HTTP 401: Incorrect API key provided: ***"
    assert key not in caplog.text and "key *** is broken" in caplog.text


async def test_api_key_from_environment_and_get_api_key(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from providers import register_builtin_providers
    from runtime.config import parse_config

    replay.enqueue(*[Reply(body=sse(_text_chunk("ok", "stop"))) for _ in range(3)])
    monkeypatch.setenv("P_API_KEY", "env-key-1234")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-only-for-api.openai.com")
    config = parse_config({"ai": {"providers": {"p": {"api": OPENAI, "api_key_env": "P_API_KEY"}}}})
    register_builtin_providers(config.ai.providers)
    try:
        await run(model_for(replay, OPENAI), api_key=None)  # ai.providers.p.api_key_env
    finally:
        register_builtin_providers()
    await run(
        model_for(replay, OPENAI),
        api_key=None,
        extra={"get_api_key": lambda provider: f"hook-{provider}-key"},
    )
    await run(model_for(replay, OPENAI), api_key=None)  # unconfigured alias, not OpenAI's host
    assert [r.headers.get("authorization") for r in replay.requests] == [
        "Bearer env-key-1234",
        "Bearer hook-p-key",
        None,
    ]


# --------------------------------------------------------------------------- timeout and abort


async def test_timeout_is_an_error_event(replay: ReplayServer) -> None:
    replay.enqueue(Reply(body=sse(_text_chunk("a"), _text_chunk("b", "stop")), splits=[10], delay_s=2.0))
    _, msg = await run(model_for(replay, OPENAI), timeout=0.3, max_retries=0)
    assert msg.stop_reason == "error"
    assert msg.error_message is not None and "timeout" in msg.error_message


async def test_abort_mid_stream_closes_the_connection(replay: ReplayServer, fixtures_dir: Path) -> None:
    replay.enqueue(
        Reply.fixture(fixtures_dir / "openai/chat_stream_deepseek_reasoning.sse", max_chunk=100, delay_s=0.02)
    )
    ctl = AbortController()
    s = stream(model_for(replay, OPENAI), hello(), StreamOptions(signal=ctl.signal, api_key="k-123456"))
    seen = []
    async for e in s:
        seen.append(e.type)
        if e.type == "thinking_delta" and seen.count("thinking_delta") == 3:
            ctl.abort("user pressed stop")
    msg = await s.result()
    assert (msg.stop_reason, msg.error_message) == ("aborted", "aborted: user pressed stop")
    assert seen[-1] == "error" and seen.count("thinking_delta") == 3
    assert await asyncio.to_thread(replay.requests[0].finished.wait, 10)
    assert replay.requests[0].outcome == "disconnected"


async def test_malformed_event_json_is_an_error_event(replay: ReplayServer) -> None:
    replay.enqueue(Reply(body=b'data: {"id": "c", "choices": [\n\n'))
    events, msg = await run(model_for(replay, OPENAI))
    assert msg.stop_reason == "error" and events[-1].type == "error"
    assert msg.error_message is not None and msg.error_message.startswith(
        "malformed event from the provider: "
    )


async def test_calls_are_counted_in_metrics(
    replay: ReplayServer, fixtures_dir: Path, waits: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    import prometheus_client

    from runtime import metrics

    registry = prometheus_client.CollectorRegistry()
    previous = metrics.get_backend()
    metrics.set_backend(metrics.PrometheusBackend(registry))
    try:
        replay.enqueue(
            Reply.error(429, {"error": {"message": "slow down"}}),
            Reply.fixture(fixtures_dir / "openai/chat_stream_text_with_usage.sse"),
            Reply.error(400, {"error": {"message": "bad"}}),
        )
        await run(model_for(replay, OPENAI))
        await run(model_for(replay, OPENAI))
        # metrics are recorded by the producer task right after the terminal event: let it finish
        await asyncio.gather(*(t for t in asyncio.all_tasks() if t is not asyncio.current_task()))

        def value(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, labels)

        assert [
            value("sessionray_llm_requests_total", api=OPENAI, outcome="ok"),
            value("sessionray_llm_requests_total", api=OPENAI, outcome="error"),
            value("sessionray_llm_retries_total", api=OPENAI),
            value("sessionray_llm_tokens_total", api=OPENAI, kind="input", model="p/m1"),
            value("sessionray_llm_tokens_total", api=OPENAI, kind="output", model="p/m1"),
            value("sessionray_llm_errors_total", api=OPENAI, reason="http_4xx"),
        ] == [1.0, 1.0, 1.0, 14.0, 30.0, 1.0]
    finally:
        metrics.set_backend(previous)

"""Bad input over real loopback HTTP: odd SSE framing, wrong JSON shapes, cut streams, HTML bodies,
hostile ``Retry-After`` values, stalls, early aborts, unknown block indexes (bad input gets a
clear error and loses nothing: docs/decisions.md#llm-errors-as-events). Keys and configuration:
test_provider_config_attacks."""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import logging

import httpx
import pytest

import providers.transport as transport
from providers.transport import retry_delay_s
from runtime.llm.abort import AbortController
from runtime.llm.options import StreamOptions
from runtime.llm.stream import stream
from tests.providers.helpers import ANTHROPIC, GEMINI, OPENAI, hello, model_for, openai_text, run, sse
from tests.providers.replay_server import ReplayServer, Reply


async def test_sse_framing_variants_one_byte_per_read(replay: ReplayServer) -> None:
    """``data:`` without a space, CRLF line ends, comments, ``id:``/``retry:`` fields, and every
    read boundary (incl. between ``\\r`` and ``\\n`` and inside a 3-byte character)."""
    body = (
        b": keep-alive comment\r\n"
        b"retry: 3000\r\n"
        b"id: 7\r\n"
        b'data:{"id":"c1","choices":[{"index":0,"delta":{"content":"\xe9\x9b\xaa"}}]}\r\n'
        b"\r\n"
        b": another comment\n"
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":" ok"},"finish_reason":"stop"}]}\r\n\r\n'
        b"data:[DONE]\r\n\r\n"
    )
    replay.enqueue(Reply(body=body, splits=list(range(1, len(body)))))
    events, msg = await run(model_for(replay, OPENAI))
    assert (msg.text(), msg.stop_reason, msg.response_id, msg.error_message) == ("雪 ok", "stop", "c1", None)
    assert [e.type for e in events] == ["start", "text_start", "text_delta", "text_delta", "text_end", "done"]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (b"data: 5\n\n", "AttributeError: 'int' object has no attribute 'get'"),
        (b'data: {"choices": [null]}\n\n', "AttributeError: 'NoneType' object has no attribute 'get'"),
        (b'data: {"choices": [{"delta": "x"}]}\n\n', "AttributeError: 'str' object has no attribute 'get'"),
        (b'data: {"choices": [{"delta": {"content": "x"\n\n', None),
    ],
)
async def test_bad_event_after_text_keeps_the_text(
    replay: ReplayServer, bad: bytes, error: str | None
) -> None:
    replay.enqueue(Reply(body=sse(openai_text("Hel")) + bad + sse(openai_text("lo", "stop"), done=True)))
    events, msg = await run(model_for(replay, OPENAI))
    assert (msg.stop_reason, msg.text(), events[-1].type) == ("error", "Hel", "error")
    assert msg.error_message is not None
    assert msg.error_message.startswith("malformed event from the provider: ")
    if error is not None:
        assert msg.error_message == f"malformed event from the provider: {error}"
    assert len(replay.requests) == 1  # content had started: never retried


async def test_gemini_null_candidate_is_malformed_not_a_crash(replay: ReplayServer) -> None:
    replay.enqueue(
        Reply(body=sse({"candidates": [{"content": {"parts": [{"text": "Hi"}]}}]}, {"candidates": [None]}))
    )
    _, msg = await run(model_for(replay, GEMINI))
    assert (msg.stop_reason, msg.text(), msg.error_message) == (
        "error",
        "Hi",
        "malformed event from the provider: AttributeError: 'NoneType' object has no attribute 'get'",
    )


async def test_cut_streams_are_errors_that_keep_content(replay: ReplayServer) -> None:
    replay.enqueue(
        Reply(body=sse(openai_text("Hel"))),  # no finish_reason, no [DONE]: cut short
        Reply(body=sse(openai_text("Hel"), done=True)),  # [DONE] without finish_reason: a stop
        Reply(body=sse({"candidates": [{"content": {"parts": [{"text": "Hel"}]}}]})),  # no finishReason
        Reply(
            body=sse(
                {"type": "message_start", "message": {"id": "m1", "usage": {"input_tokens": 2}}},
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
                events=True,
            )
        ),
    )
    got = []
    for api in (OPENAI, OPENAI, GEMINI, ANTHROPIC):
        _, msg = await run(model_for(replay, api))
        got.append((msg.stop_reason, msg.text(), msg.error_message))
    assert got == [
        ("error", "Hel", "stream ended before finish_reason or [DONE]"),
        ("stop", "Hel", None),
        ("error", "Hel", "stream ended before finishReason"),
        ("error", "Hel", "stream ended before message_stop"),
    ]


@pytest.mark.parametrize("api", [OPENAI, ANTHROPIC, GEMINI])
async def test_html_body_with_status_200(replay: ReplayServer, api: str) -> None:
    page = b"<html><body><h1>Sign in to the proxy</h1></body></html>"
    replay.enqueue(Reply(body=page, content_type="text/html; charset=utf-8"))
    _, msg = await run(model_for(replay, api))
    assert (msg.stop_reason, msg.error_message) == (
        "error",
        "expected an event stream, got text/html; charset=utf-8: " + page.decode(),
    )


async def test_vllm_in_stream_error_object(replay: ReplayServer) -> None:
    err = {"object": "error", "message": "This model's maximum context length is 4096 tokens", "code": 400}
    replay.enqueue(Reply(body=sse(err)))
    _, msg = await run(model_for(replay, OPENAI))
    assert (msg.stop_reason, msg.error_message) == (
        "error",
        "stream error: This model's maximum context length is 4096 tokens",
    )


async def test_anthropic_delta_for_an_unknown_block_index(replay: ReplayServer) -> None:
    body = sse(
        {"type": "message_start", "message": {"id": "m1", "usage": {"input_tokens": 3}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
        {"type": "content_block_delta", "index": 4, "delta": {"type": "text_delta", "text": "stray"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
        events=True,
    )
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, ANTHROPIC))
    assert (msg.stop_reason, msg.text(), msg.error_message) == (
        "error",
        "Hi",
        "content_block_delta for block 4, which is not open (open block: 0)",
    )


async def test_gemini_usage_only_chunk_and_prompt_block(replay: ReplayServer) -> None:
    replay.enqueue(
        Reply(body=sse({"usageMetadata": {"promptTokenCount": 3}})),
        Reply(
            body=sse(
                {
                    "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
                    "usageMetadata": {"promptTokenCount": 5},
                }
            )
        ),
    )
    _, first = await run(model_for(replay, GEMINI))
    _, second = await run(model_for(replay, GEMINI))
    assert [(m.stop_reason, m.error_message, m.usage.input) for m in (first, second)] == [
        ("error", "stream ended without any chunk", 3),
        ("error", "prompt blocked: PROHIBITED_CONTENT", 5),
    ]


def test_retry_after_values_are_bounded_and_never_crash() -> None:
    def delay(**headers: str) -> float:
        return retry_delay_s(0, httpx.Headers({k.replace("_", "-"): v for k, v in headers.items()}))

    future = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30)
    http_date = email.utils.format_datetime(future, usegmt=True)
    assert 20.0 < delay(retry_after=http_date) <= 30.0
    past = email.utils.format_datetime(future - datetime.timedelta(hours=1), usegmt=True)
    assert delay(retry_after=past) == 0.0
    assert delay(retry_after="86400000") == transport.MAX_RETRY_DELAY_S
    assert delay(retry_after="inf") == transport.MAX_RETRY_DELAY_S
    assert delay(retry_after_ms="inf") == transport.MAX_RETRY_DELAY_S
    assert delay(retry_after="-5") == 0.0
    for garbage in ("soon", "nan", "Wed, 99 Foo 2015", ""):
        assert 0.5 <= delay(retry_after=garbage) <= 0.625, garbage  # ignored: normal backoff
    assert 0.5 <= delay(retry_after_ms="nan") <= 0.625


async def test_unreadable_retry_after_is_retried_with_backoff(
    replay: ReplayServer, waits: list[float]
) -> None:
    replay.enqueue(
        Reply.error(429, {"error": {"message": "slow down"}}, headers={"retry-after": "soon"}),
        Reply.error(503, {"error": {"message": "busy"}}, headers={"retry-after": "999999"}),
        Reply(body=sse(openai_text("ok", "stop"))),
    )
    _, msg = await run(model_for(replay, OPENAI), max_retries=2)
    assert (msg.text(), msg.stop_reason, len(replay.requests)) == ("ok", "stop", 3)
    assert 0.5 <= waits[0] <= 0.625 and waits[1] == transport.MAX_RETRY_DELAY_S


async def test_401_is_not_retried_and_the_key_is_nowhere(
    replay: ReplayServer, waits: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    key = "sk-ant-api03-secret-0123456789"
    replay.enqueue(
        Reply.error(
            401,
            {
                "type": "error",
                "error": {"type": "authentication_error", "message": f"invalid x-api-key {key}"},
            },
        )
    )
    caplog.set_level(logging.DEBUG)
    events, msg = await run(model_for(replay, ANTHROPIC), api_key=key)
    assert msg.error_message == "HTTP 401: authentication_error: invalid x-api-key ***"
    assert (len(replay.requests), waits, [e.type for e in events]) == (1, [], ["start", "error"])
    assert replay.requests[0].headers["x-api-key"] == key
    assert key not in caplog.text


async def test_server_stalling_before_headers_times_out(replay: ReplayServer) -> None:
    replay.enqueue(Reply(body=sse(openai_text("late", "stop")), head_delay_s=30))
    _, msg = await run(model_for(replay, OPENAI), timeout=0.3, max_retries=0)
    assert msg.stop_reason == "error"
    assert msg.error_message in ("timeout: ReadTimeout", "timeout: no complete response within 0.3 s")
    assert await asyncio.to_thread(replay.requests[0].finished.wait, 10)
    assert replay.requests[0].outcome == "disconnected"


async def test_abort_before_the_first_byte(replay: ReplayServer) -> None:
    replay.enqueue(Reply(body=sse(openai_text("late", "stop")), head_delay_s=30))
    ctl = AbortController()
    s = stream(model_for(replay, OPENAI), hello(), StreamOptions(signal=ctl.signal, api_key="k-123456"))
    for _ in range(500):  # wait until the server holds the request (no timing assertion)
        if replay.requests:
            break
        await asyncio.sleep(0.01)
    ctl.abort("cancelled by user")
    msg = await s.result()
    assert (msg.stop_reason, msg.error_message, msg.content) == ("aborted", "aborted: cancelled by user", [])
    assert await asyncio.to_thread(replay.requests[0].finished.wait, 10)
    assert replay.requests[0].outcome == "disconnected"


async def test_abort_in_the_middle_keeps_the_text_so_far(replay: ReplayServer) -> None:
    chunks = [sse(openai_text(w)) for w in ("one ", "two ", "three ")]
    replay.enqueue(
        Reply(
            body=b"".join(chunks) + sse(openai_text("", "stop")),
            splits=[len(chunks[0]), len(chunks[0]) + len(chunks[1])],
            delay_s=30,
        )
    )
    ctl = AbortController()
    s = stream(model_for(replay, OPENAI), hello(), StreamOptions(signal=ctl.signal, api_key="k-123456"))
    async for e in s:
        if e.type == "text_delta":
            ctl.abort("stop")
    msg = await s.result()
    assert (msg.stop_reason, msg.text(), msg.error_message) == ("aborted", "one ", "aborted: stop")
    assert await asyncio.to_thread(replay.requests[0].finished.wait, 10)
    assert replay.requests[0].outcome == "disconnected"


def test_a_line_longer_than_many_reads_is_joined_once() -> None:
    from providers.transport import SSEDecoder

    payload = '{"inlineData": "' + "Q" * 2_000_000 + '雪"}'
    raw = f"data: {payload}\r\n\r\n".encode()
    d = SSEDecoder()
    got = []
    for i in range(0, len(raw) - 4, 1024):
        got += d.feed(raw[i : min(i + 1024, len(raw) - 4)])
        assert d._buf == b""  # reads are kept apart, not re-copied on every read (linear time)
    assert got == [] and d.feed(raw[len(raw) - 4 :]) == [(None, payload)]


async def test_gemini_model_id_with_models_prefix(replay: ReplayServer) -> None:
    chunk = {"candidates": [{"content": {"parts": [{"text": "ok"}]}, "finishReason": "STOP"}]}
    replay.enqueue(Reply(body=sse(chunk)))
    _, msg = await run(model_for(replay, GEMINI, model_id="models/gemini-2.5-flash"))
    assert (msg.text(), replay.requests[0].path) == (
        "ok",
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent",
    )


async def test_event_stream_mislabelled_as_json(replay: ReplayServer) -> None:
    replay.enqueue(
        Reply(
            body=sse(openai_text("Hi"), openai_text("!", "stop"), done=True), content_type="application/json"
        )
    )
    _, msg = await run(model_for(replay, OPENAI))
    assert (msg.text(), msg.stop_reason, msg.error_message) == ("Hi!", "stop", None)


@pytest.mark.parametrize("api", [ANTHROPIC, GEMINI])
async def test_leading_bom_and_empty_keepalive_data_lines(replay: ReplayServer, api: str) -> None:
    if api == ANTHROPIC:
        body = sse(
            {"type": "message_start", "message": {"id": "m1", "usage": {"input_tokens": 1}}},
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
            {"type": "message_stop"},
            events=True,
        )
    else:
        body = sse({"candidates": [{"content": {"parts": [{"text": "ok"}]}, "finishReason": "STOP"}]})
    cut = body.index(b"\n\n") + 2
    body = b"\xef\xbb\xbf" + body[:cut] + b"data: \n\n" + body[cut:]
    replay.enqueue(Reply(body=body))
    _, msg = await run(model_for(replay, api))
    assert (msg.text(), msg.stop_reason, msg.error_message) == ("ok", "stop", None)


async def test_an_event_stream_of_comments_only(replay: ReplayServer) -> None:
    replay.enqueue(Reply(body=b": keep-alive\n\n: keep-alive\n\n"))
    _, msg = await run(model_for(replay, OPENAI))
    assert (msg.stop_reason, msg.error_message) == ("error", "stream ended without any chunk")


async def test_finish_reason_error_is_an_error(replay: ReplayServer) -> None:
    replay.enqueue(Reply(body=sse(openai_text("par"), openai_text("", "error"), done=True)))
    _, msg = await run(model_for(replay, OPENAI))
    assert (msg.stop_reason, msg.text(), msg.error_message) == ("error", "par", "finish_reason: error")


async def test_redirects_are_reported_not_followed(replay: ReplayServer) -> None:
    replay.enqueue(
        Reply(
            status=301,
            body=b"<html>moved</html>",
            content_type="text/html",
            headers={"location": "https://x.example/v1/chat/completions"},
        )
    )
    _, msg = await run(model_for(replay, OPENAI))
    assert (msg.stop_reason, msg.error_message, len(replay.requests)) == (
        "error",
        "HTTP 301: redirected to https://x.example/v1/chat/completions; redirects are not followed, "
        "set base_url to the final address",
        1,
    )


def test_error_reason_labels_of_the_new_failures() -> None:
    from providers.transport import error_reason

    assert [
        error_reason(m, "error")
        for m in (
            "HTTP 301: redirected to x",
            "expected an event stream, got text/html: <html>",
            "malformed event from the provider: AttributeError: x",
            "stream ended before finish_reason or [DONE]",
        )
    ] == ["http_4xx", "malformed", "malformed", "provider"]

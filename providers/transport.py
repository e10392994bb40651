"""The one HTTP transport of every provider: POST a JSON body, decode the SSE reply, retry, cancel.

It moves bytes and knows nothing of models or messages
(docs/decisions.md#provider-split-by-concern): a wire adapter hands it a request and an
:class:`SseParser` that turns ``(event, data)`` pairs into
:class:`~runtime.llm.builder.MessageBuilder` calls.

Rules (docs/decisions.md#llm-transport):

* **Whole lines before decoding.** :class:`SSEDecoder` buffers raw bytes up to the last ``\\n``
  and only then decodes UTF-8, so a multi-byte character split across two reads comes out
  intact. ``\\r\\n`` line ends are accepted; a lone ``\\r`` is not a line end (no provider sends it).
* **Timeouts.** ``StreamOptions.timeout`` (seconds, default 600) bounds the whole call; connecting
  is bounded by :data:`CONNECT_TIMEOUT_S`. A timeout is an ``error`` event.
* **Cancellation.** When ``StreamOptions.signal`` fires, the request task is cancelled, which
  closes the connection (httpx leaves the ``stream`` context), and the stream ends with
  ``stop_reason="aborted"``.
* **Retries.** HTTP 408/409/429/5xx, connection failures and in-stream retryable errors
  (Anthropic ``overloaded_error``) are retried with exponential backoff (or the server's
  ``Retry-After`` in seconds or as an HTTP date, or ``retry-after-ms``; an unreadable value falls
  back to the backoff, every wait is capped at :data:`MAX_RETRY_DELAY_S`), at most
  ``StreamOptions.max_retries`` times, and **only
  before the first content event** (no delta and no opened block yet); afterwards a failure is
  an ``error`` event, never a replay of half an answer.
* **Provider limits.** When the process has a provider gate governing the model's alias
  (:func:`runtime.llm.limits.provider_gate`), each attempt runs inside a lease: asked before the
  POST with an estimate of ⌈body bytes / 4⌉ tokens, given back with the reported usage, or with a
  429 and its wait (then the retry waits in the gate, not here). No lease within ``max_wait_s``
  ends the stream with ``provider busy: …`` (docs/decisions.md#spend-provider-limits).
* **Errors carry the provider's own message**: ``HTTP 429: Rate limit reached for ...``.
* **Bad bodies.** An event of the wrong JSON shape ends the stream with ``malformed event from
  the provider: …`` and keeps the content received before it; a 200 body without any SSE event
  (an HTML page from a proxy) ends with ``expected an event stream, got <content type>: <start>``.
* **JSON bodies.** A 200 answer with ``Content-Type: application/json`` (a server that ignored
  ``stream: true``) goes to the parser's optional ``on_body`` as one document; a body labelled
  JSON that starts like an event stream (``data:``) is decoded as one.
* **Metrics**: every finished call counts ``sessionray_llm_requests_total{api,outcome}``,
  ``sessionray_llm_errors_total{api,reason}`` (tokens: :mod:`runtime.llm.usage`).
* **API keys** never appear in logs or error texts: :func:`redact` removes them from every
  message this module produces.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from providers.common import ProviderConfigs, crash_handler, resolve_api_key
from providers.failures import (
    BACKOFF_BASE_S,
    MAX_RETRY_DELAY_S,
    RETRYABLE_STATUS,
    error_message_from_body,
    error_reason,
    retry_delay_s,
)
from providers.sse import SSEDecoder
from runtime.llm.attribution import current_attribution
from runtime.llm.builder import MessageBuilder
from runtime.llm.events import AssistantMessageEventStream, run_stream
from runtime.llm.limits import ProviderBusyError, ProviderGate, provider_gate
from runtime.llm.options import SimpleStreamOptions, StreamOptions
from runtime.llm.types import Model
from runtime.metrics import LLM_ERRORS, LLM_REQUESTS, LLM_RETRIES

__all__ = [
    "BACKOFF_BASE_S",
    "CONNECT_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "MAX_RETRY_DELAY_S",
    "RETRYABLE_STATUS",
    "HttpRequest",
    "ProviderStreamError",
    "SSEDecoder",
    "SseParser",
    "error_message_from_body",
    "error_reason",
    "get_http_client",
    "record_call_metrics",
    "redact",
    "retry_delay_s",
    "run_sse_request",
    "stream_sse_call",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0
"""Whole-call timeout when ``StreamOptions.timeout`` is ``None`` (seconds)."""
CONNECT_TIMEOUT_S = 10.0
"""Upper bound on establishing the TCP/TLS connection (seconds)."""
_sleep = asyncio.sleep  # tests replace this to observe retry delays without waiting


class ProviderStreamError(Exception):
    """Raised by an :class:`SseParser` for an error reported inside the stream.

    Args:
        message: The provider's own error text (e.g. ``overloaded_error: Overloaded``).
        retryable: Whether the transport may retry (only honoured before the first content event).
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class SseParser(Protocol):
    """What a wire adapter gives the transport: one instance per attempt."""

    def on_event(self, event: str | None, data: str) -> None:
        """Handle one SSE event (``event`` is the ``event:`` field or ``None``; ``data`` the joined
        ``data:`` lines). May raise :class:`ProviderStreamError`."""

    def on_end(self) -> None:
        """The body ended; push the terminal event through the builder."""

    # Optional: ``on_body(data: str) -> None`` handles a whole non-streaming JSON response (sent
    # with ``Content-Type: application/json``) and pushes the terminal event.


@dataclass
class HttpRequest:
    """One POST: absolute ``url``, ``headers`` (incl. auth), JSON ``body``, and the secrets to redact."""

    url: str
    headers: dict[str, str]
    body: dict[str, Any]
    secrets: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- helpers


def redact(text: str, secrets: list[str]) -> str:
    """Replace every secret (API keys; strings shorter than 4 chars are ignored) by ``***``."""
    for s in secrets:
        if s and len(s) >= 4:
            text = text.replace(s, "***")
    return text


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
    weakref.WeakKeyDictionary()
)


def get_http_client() -> httpx.AsyncClient:
    """Return the shared ``httpx.AsyncClient`` of the running event loop (connection pooling).

    A client is bound to the loop that created its connections, so there is one per loop.
    """
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None or client.is_closed:
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(DEFAULT_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
        )
        _clients[loop] = client
    return client


# --------------------------------------------------------------------------- the request loop


def _may_retry(builder: MessageBuilder) -> bool:
    """Retries are allowed only before the first content event: no delta and no block opened."""
    return not builder.content_started and not builder.message.content


class _Retry(Exception):
    def __init__(self, message: str, headers: httpx.Headers | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers
        self.status = status


async def _replay(raw: bytes) -> AsyncIterator[bytes]:
    yield raw


async def _attempt(
    client: httpx.AsyncClient,
    request: HttpRequest,
    content: bytes,
    timeout: httpx.Timeout,
    parser: SseParser,
    builder: MessageBuilder,
) -> None:
    """One HTTP exchange; raises _Retry for a retryable failure before content, else ends the stream."""
    secrets = request.secrets

    def fail(message: str) -> None:
        builder.fail(redact(message, secrets))

    try:
        async with client.stream(
            "POST", request.url, headers=request.headers, content=content, timeout=timeout
        ) as resp:
            if 300 <= resp.status_code < 400:
                # never followed: a redirected POST would carry the key to wherever it points
                where = resp.headers.get("location") or "(no location)"
                fail(
                    f"HTTP {resp.status_code}: redirected to {where}; redirects are not followed, "
                    "set base_url to the final address"
                )
                return
            if resp.status_code >= 400:
                msg = error_message_from_body(resp.status_code, await resp.aread())
                if resp.status_code in RETRYABLE_STATUS:
                    raise _Retry(msg, resp.headers, resp.status_code)
                fail(msg)
                return
            await _read_body(resp, parser, builder, fail)
    except ValueError as exc:  # malformed JSON in an event (the parsers' only ValueError)
        fail(f"malformed event from the provider: {exc}")
    except (AttributeError, KeyError, IndexError, TypeError) as exc:
        # valid JSON of the wrong shape (``data: 5``, ``"choices": [null]``): keep what was
        # received so far instead of letting run_stream replace the message (nothing is lost)
        fail(f"malformed event from the provider: {type(exc).__name__}: {exc}")
    except ProviderStreamError as exc:
        if exc.retryable and _may_retry(builder):
            raise _Retry(exc.message) from None
        fail(exc.message)
    except httpx.TimeoutException as exc:
        if _may_retry(builder):
            raise _Retry(f"timeout: {type(exc).__name__}") from None
        fail(f"timeout while streaming: {type(exc).__name__}")
    except httpx.TransportError as exc:
        if _may_retry(builder):
            raise _Retry(f"connection error: {type(exc).__name__}: {exc}") from None
        fail(f"connection error while streaming: {type(exc).__name__}: {exc}")


async def _read_body(
    resp: httpx.Response, parser: SseParser, builder: MessageBuilder, fail: Callable[[str], None]
) -> None:
    """Feed a 2xx answer to ``parser``: an event stream, or one JSON document (``on_body``)."""
    chunks = resp.aiter_bytes()
    if resp.headers.get("content-type", "").startswith("application/json"):
        # a server that ignored ``stream: true`` (or a non-streaming endpoint): one JSON body
        raw = await resp.aread()
        if not raw.lstrip().startswith((b"data:", b"event:", b":")):
            body = raw.decode("utf-8", "replace")
            on_body = getattr(parser, "on_body", None)
            if on_body is None:
                fail(f"expected an event stream, got a JSON body: {body[:200]}")
            else:
                on_body(body)
            return
        chunks = _replay(raw)  # an event stream mislabelled as JSON: decode it as one
    decoder = SSEDecoder()
    ended = builder.stream
    head = b""  # the body's first bytes, quoted when it holds no event at all
    events = 0
    async for chunk in chunks:
        if len(head) < 200:
            head += chunk[: 200 - len(head)]
        for ev, data in decoder.feed(chunk):
            events += 1
            parser.on_event(ev, data)
            if ended.ended:
                return
    for ev, data in decoder.flush():
        events += 1
        parser.on_event(ev, data)
        if ended.ended:
            return
    kind = resp.headers.get("content-type") or "no content type"
    if not events and head.strip() and not kind.startswith("text/event-stream"):
        # e.g. a proxy's HTML login page with status 200: say what came instead of events
        fail(f"expected an event stream, got {kind}: {head.decode('utf-8', 'replace').strip()}")
        return
    parser.on_end()


async def _gated_attempt(
    gate: ProviderGate | None,
    attempt: int,
    run: Callable[[], Awaitable[None]],
    builder: MessageBuilder,
    est_tokens: int,
) -> None:
    """Run one attempt inside a lease of ``gate`` (none: just run it); the lease goes back with
    the reported usage, or with the 429 and its wait, so the gate slows every caller
    (docs/decisions.md#spend-provider-limits). A 429 without ``Retry-After`` reports the backoff
    delay as its wait: the gated retry waits in the gate, never hammers.

    Raises:
        _Retry: as :func:`_attempt`.
        ProviderBusyError: no lease within the alias's ``max_wait_s``.
    """
    if gate is None:
        await run()
        return
    lease = await gate.acquire(builder.message.provider, current_attribution(), est_tokens)
    status: int | None = None
    wait_s: float | None = None
    try:
        await run()
        status = 200 if builder.message.stop_reason not in ("error", "aborted") else None
    except _Retry as r:
        status = r.status
        if status == 429:
            wait_s = retry_delay_s(attempt, r.headers)
        raise
    finally:
        used = builder.message.usage.total_tokens
        await asyncio.shield(gate.release(lease, used or None, status, wait_s))


async def _attempts(
    api: str,
    request: HttpRequest,
    content: bytes,
    options: StreamOptions,
    builder: MessageBuilder,
    run_attempt: Callable[[], Awaitable[None]],
) -> None:
    """The retry loop: ``run_attempt`` (one POST with a fresh parser), up to ``options.max_retries``
    more times after a :class:`_Retry`, each in a lease of the process's provider gate when it
    governs the model's alias (a gated 429 waits in the gate, not here); ends ``builder.stream``
    when the retries ran out or no lease came."""
    gate = provider_gate(builder.message.provider)
    est_tokens = math.ceil(len(content) / 4)  # the ~4 bytes a token rule of estimate_tokens
    attempt = 0
    while True:
        try:
            await _gated_attempt(gate, attempt, run_attempt, builder, est_tokens)
            return
        except ProviderBusyError as exc:
            builder.fail(str(exc))
            return
        except _Retry as r:
            if attempt >= options.max_retries:
                builder.fail(redact(r.message, request.secrets))
                return
            gated_429 = gate is not None and r.status == 429  # the gate holds the wait
            delay = 0.0 if gated_429 else retry_delay_s(attempt, r.headers)
            attempt += 1
            LLM_RETRIES.inc(api=api)
            log.info(
                "%s: retry %d in %.2f s after: %s", api, attempt, delay, redact(r.message, request.secrets)
            )
            if not gated_429:
                await _sleep(delay)


async def run_sse_request(
    api: str,
    request: HttpRequest,
    options: StreamOptions,
    builder: MessageBuilder,
    make_parser: Callable[[], SseParser],
    client: httpx.AsyncClient | None = None,
) -> None:
    """POST ``request`` and stream its SSE reply through a fresh parser per attempt.

    Always ends ``builder.stream`` with exactly one terminal event (``done`` from the parser, or
    ``error`` with ``stop_reason`` error/aborted from here); never raises for provider failures.

    Args:
        api: Api id, used as the metrics label (``sessionray_llm_retries_total``).
        request: URL, headers, JSON body; ``request.secrets`` are redacted from error texts.
        options: ``signal``, ``timeout`` (s, whole call), ``max_retries``.
        builder: Receives the parsed content; ``content_started`` gates retries.
        make_parser: Returns a new :class:`SseParser` for each attempt.
        client: An ``httpx.AsyncClient`` (default: the shared client of the running loop).
    """
    client = client or get_http_client()
    content = json.dumps(request.body, ensure_ascii=False, separators=(",", ":")).encode()
    total = options.timeout if options.timeout is not None else DEFAULT_TIMEOUT_S
    timeout = httpx.Timeout(total, connect=min(CONNECT_TIMEOUT_S, total))
    signal = options.signal
    run_attempt = lambda: _attempt(client, request, content, timeout, make_parser(), builder)  # noqa: E731
    task = asyncio.ensure_future(_attempts(api, request, content, options, builder, run_attempt))
    waiters: set[asyncio.Future[Any]] = {task}
    abort_wait: asyncio.Future[None] | None = None
    if signal is not None:
        abort_wait = asyncio.ensure_future(signal.wait())
        waiters.add(abort_wait)
    try:
        done, _ = await asyncio.wait(waiters, timeout=total, return_when=asyncio.FIRST_COMPLETED)
        if task not in done:
            task.cancel()  # leaving httpx's stream context closes the connection
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            if not builder.stream.ended:
                if signal is not None and signal.aborted:
                    builder.fail(f"aborted: {signal.reason or 'aborted'}", aborted=True)
                else:
                    builder.fail(f"timeout: no complete response within {total:g} s")
        else:
            task.result()  # re-raise a parser bug so run_stream reports it
    finally:
        if abort_wait is not None:
            abort_wait.cancel()
        if not task.done():
            task.cancel()
    if builder.stream.ended:
        record_call_metrics(api, builder)


def record_call_metrics(api: str, builder: MessageBuilder) -> None:
    """Count one finished call: requests by outcome, errors by :func:`error_reason` (tokens and
    cost are counted for every api at the single entry point: :mod:`runtime.llm.usage`)."""
    msg = builder.message
    failed = msg.stop_reason in ("error", "aborted")
    LLM_REQUESTS.inc(api=api, outcome=msg.stop_reason if failed else "ok")
    if failed:
        LLM_ERRORS.inc(api=api, reason=error_reason(msg.error_message, msg.stop_reason))


def stream_sse_call(
    api: str,
    model: Model,
    options: StreamOptions | None,
    make_request: Callable[[StreamOptions, str], HttpRequest],
    make_parser: Callable[[MessageBuilder], SseParser],
    provider_configs: ProviderConfigs | None = None,
) -> AssistantMessageEventStream:
    """Run one streaming SSE provider call; the shared body of every provider's ``stream_*``.

    Returns the event stream at once; failures (HTTP errors, timeouts, aborts, malformed chunks)
    arrive as its terminal ``error`` event (never raised), crashes via :func:`crash_handler`.

    Args:
        api: Api id (metrics label, see :func:`run_sse_request`).
        model: The model called; the builder's and crash handler's model.
        options: Call options (default ``StreamOptions()``); a :class:`SimpleStreamOptions`
            contributes its ``reasoning`` level, any other options mean ``"off"``.
            ``options.extra["http_client"]`` overrides the shared ``httpx.AsyncClient``.
        make_request: ``(options, reasoning) -> HttpRequest`` (URL, headers, JSON body); its
            options carry in ``api_key`` the key resolved for this call (``None``: keyless).
        make_parser: Returns a fresh :class:`SseParser` feeding the given builder, per attempt.
        provider_configs: The configured providers by alias, where the key is looked up
            (:func:`~providers.common.resolve_api_key`; its :class:`ApiKeyError` ends the stream
            with an ``error`` event naming the missing variable, before anything is sent).
    """
    opts = options or StreamOptions()
    reasoning = opts.reasoning if isinstance(opts, SimpleStreamOptions) else "off"

    async def produce(stream: AssistantMessageEventStream) -> None:
        builder = MessageBuilder(stream, model)
        key = resolve_api_key(model, opts, provider_configs)
        request = make_request(dataclasses.replace(opts, api_key=key), reasoning)
        await run_sse_request(
            api, request, opts, builder, lambda: make_parser(builder), opts.extra.get("http_client")
        )

    return run_stream(produce, crash_handler(model))

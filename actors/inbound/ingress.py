"""The ingress: one starlette ASGI app for webhooks, health, metrics, the admin API and the console.

Routes::

    POST /webhooks/{platform}/{bot_id}   verify → parse → size + storability checks → policy
                                         → store (inbox + transcript row) → route → 200
    WS   /onebot/v11/ws[/event|/api]     OneBot v11 reverse WebSocket (actors/inbound/onebot_ws.py)
    GET  /healthz                        {"status": "ok"} (+ "onebot_ws" socket health,
                                         + "telegram_polling" poller states)
    GET  /metrics                        prometheus-client text format (this process's registry)
    /admin/...                           actors/http/admin.py (bearer token)
    /console...                          actors/http/console.py (when a console bot is configured)

A webhook answers:

* **200** ``{"status": "accepted" | "duplicate" | "queued" | "ignored" | "untriggered" | "denied" |
  "rate_limited"}`` — a triggered message is first stored in the durable inbox with its
  transcript row (one transaction, :mod:`actors.inbound.inbox`); ``duplicate`` when the inbox
  already had it (nothing routed) or the session's host did; ``queued`` when it is stored but
  could not be routed now (runtime not started, router shard down, Ray error, the session's
  mailbox full, no answer in time, or an earlier message of the chat still queued): a router
  shard's recovery loop routes it within seconds (docs/decisions.md#inbox-durable);
  ``ignored`` for events the codec accepts and drops (heartbeats, notices);
  ``untriggered`` for a group message the bot is not asked to answer (stored in transcripts for
  ``chat_history``, no turn); ``denied`` / ``rate_limited`` for a message the bot's inbound policy
  refuses (``runtime.platforms.policy``: allow/deny lists, rate limits; stored the same way,
  never routed; with ``on_limit: notice`` a cooldown notice goes out through the delivery pool,
  once per cooldown window, keyed by the refused message so a redelivery never sends it twice);
* **503** ``{"status": "unavailable"}`` with ``Retry-After`` (whole seconds, ≥ 1) only when the
  message could not be stored (SQLite lock timeout, database down): nothing was stored or routed,
  and the redelivery is stored once;
* **401** bad signature / secret (or one that cannot be verified), **400** malformed event — in
  both cases nothing is stored and nothing is routed. Malformed covers every decode error of the
  codec (bad or too deeply nested JSON, bad UTF-8, wrong types; the body never carries exception
  text) and a decoded message that could not be stored (a lone surrogate in a text or id, a time
  outside 64-bit milliseconds, ids that make no session key: ``actors.inbound.guard``) — checked
  *before* anything is stored, so a bad message is never routed. A codec that fails
  with ``TypeError``/``AttributeError``/``KeyError``/``IndexError``/``OverflowError`` (a codec bug,
  maybe on a legitimate payload) is also a 400 — a 5xx would make the platform redeliver it
  forever and hold back the chat's later updates (Telegram) — but counted as ``error`` and logged
  at ERROR with its traceback, so the gap is seen;
* **413** a body over ``server.max_body_bytes`` (every route, ``actors.inbound.guard.BodySizeLimit``)
  or a decoded text over ``server.max_text_chars`` characters (not stored, not routed; the message
  of ``actors.http.input_checks.text_too_long``, as on the admin and console APIs);
* **500** ``{"error": "internal error"}`` for an unexpected exception (logged with traceback);
* **404** when no bot ``{platform}/{bot_id}`` is configured, or it is a ``mode: polling`` bot
  (:mod:`actors.inbound.telegram_poll` runs its updates through :meth:`Ingress.handle_event`; they never
  come by webhook, and without a secret that route would take forged updates), or a OneBot bot
  whose ``transport`` is a WebSocket (its events come over the socket its access token
  authenticated; docs/decisions.md#security-socket-bots-no-webhook).

Every event is counted in ``sessionray_inbound_messages_total{platform, outcome}`` (outcome:
``accepted`` | ``duplicate`` | ``queued`` | ``ignored`` | ``untriggered`` | ``denied`` |
``rate_limited`` | ``bad_signature`` | ``malformed`` (400 and 413) | ``unavailable`` | ``error``
(500, and the 400 of a codec bug)); every request
in ``sessionray_http_requests_total{route, status}`` and
``sessionray_http_request_duration_seconds{route}`` with the *route template* as label (never a
raw path: bounded labels). Router-level gauges (live sessions, session hosts) are refreshed from
``runtime.status()`` when ``/metrics`` is scraped.

This app runs in the driver under uvicorn (``sessionray serve``) or inside a Ray Serve replica
(``actors/serve/app.py``); it never imports a platform by name (codecs come from the registry).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import prometheus_client
from sqlalchemy.exc import OperationalError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from actors.http.admin import admin_routes
from actors.http.console import console_routes
from actors.http.input_checks import max_text_chars, text_too_long
from actors.inbound.guard import BodySizeLimit, storage_problem, trusted_internal_call
from actors.inbound.inbox import InboxGate
from actors.inbound.notice import send_notice
from actors.inbound.onebot_ws import OneBotSockets
from actors.inbound.telegram_poll_status import polling_bots, polling_health
from runtime import metrics, tracing
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.memory.transcripts import TranscriptStore
from runtime.platforms.base import InboundMessage, MalformedEvent, PlatformCodec, SignatureError, get_codec
from runtime.platforms.common import is_json_content_type
from runtime.platforms.policy import InboundPolicy, Verdict

__all__ = ["DECODE_IN_THREAD_BYTES", "Ingress", "build_app"]

log = logging.getLogger("sessionray.ingress")

DECODE_IN_THREAD_BYTES = 64 * 1024
"""A webhook body larger than this (bytes) is decoded in a worker thread (``asyncio.to_thread``)."""


class _RouteMetrics:
    """ASGI middleware: request count and latency by route template (bounded labels)."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    def _template(self, scope: Scope) -> str:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return str(getattr(route, "path", "") or "other")
        return "other"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self._template(scope)
        started = time.perf_counter()
        status = {"code": 500}

        async def send_wrapper(message: Any) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            metrics.HTTP_REQUESTS.inc(route=route, status=str(status["code"]))
            metrics.HTTP_LATENCY.observe(time.perf_counter() - started, route=route)


class Ingress:
    """The webhook logic over a session runtime and the configured bots.

    Args:
        runtime: ``actors.placement.runtime.SessionRuntime`` (or anything with ``submit``/``status``/the admin
            methods as coroutines).
        config: ``runtime.config.Config`` (``bots``, ``database.url``, ``server.admin_token_env``).
        transcripts: Where inbound rows go (default: a store on ``config.database.url``, on
            :attr:`db`).

    Attributes:
        db: The process's :class:`Database` on ``config.database.url`` when this ingress made one
            (None when ``transcripts`` was given): ``DEFAULT_SQL_THREADS`` (8) SQL threads and no
            pool overflow, so at most 8 connections on PostgreSQL (9 on SQLite: one kept for
            inline writes, docs/decisions.md#memory-sql-off-loop); the admin's stored-session
            view, the durable inbox (:attr:`gate`) and its batched marks share it.

    Raises:
        ValueError: a bot's secret environment variable is missing (from its codec).
    """

    def __init__(self, runtime: Any, config: Any, transcripts: TranscriptStore | None = None) -> None:
        tracing.configure(getattr(config, "tracing", None), "ingress")
        self.config = config
        # A polling bot has no webhook: with no secret set, its route would take forged updates.
        self.codecs: dict[tuple[str, str], PlatformCodec] = {
            (str(bot.platform), str(bot.self_id)): get_codec(bot)
            for bot in config.bots
            if getattr(bot, "mode", "webhook") != "polling"
        }
        # A WebSocket bot's events come over its socket (actors.inbound.onebot_ws uses its codec): its
        # webhook route would take unsigned events (docs/decisions.md#security-socket-bots-no-webhook).
        self.socket_bots: dict[tuple[str, str], str] = {
            (str(bot.platform), str(bot.self_id)): str(bot.transport)
            for bot in config.bots
            if getattr(bot, "transport", "http") != "http"
        }
        self.db: Database | None = None
        if transcripts is None:
            # Short write retries: a 503 must reach the platform before its webhook timeout
            # (it redelivers; the transcript row dedups). No overflow: every SQL call runs on one
            # of the pool's threads, so "at most 8 connections" (deploy/README.md) holds on
            # PostgreSQL (SQLite keeps one more for inline writes: decisions memory-sql-off-loop).
            self.db = Database(config.database.url, busy_timeout_ms=5_000, write_retry_s=5.0, max_overflow=0)
            self.db.create_tables()
            transcripts = TranscriptStore(self.db)
        self.transcripts = transcripts
        window = getattr(getattr(config, "runtime", None), "replay_window_s", 600.0)
        self.gate = InboxGate(runtime, transcripts, replay_window_s=window)
        """Store → submit of triggered messages (the durable inbox: ``actors.inbound.inbox``)."""
        self.max_text_chars = max_text_chars(config)
        policies = ((str(b.platform), str(b.self_id), InboundPolicy.from_config(b)) for b in config.bots)
        self.policies = {(p, bot): policy for p, bot, policy in policies if policy is not None}
        self._notices: set[asyncio.Task[None]] = set()  # cooldown notices on their way (send_notice)
        self.onebot_sockets: Any = None
        """The process's ``actors.inbound.onebot_ws.OneBotSockets`` (``build_app`` sets it)."""

    @property
    def runtime(self) -> Any:
        """The session runtime (held by :attr:`gate`; a poller sets it once it connected)."""
        return self.gate.runtime

    @runtime.setter
    def runtime(self, runtime: Any) -> None:
        self.gate.runtime = runtime

    async def webhook(self, request: Request) -> Response:
        """``POST /webhooks/{platform}/{bot_id}`` (see module docstring for the answers).

        An exception none of the steps expects is answered **500** ``{"error": "internal
        error"}`` (no exception text), logged with its traceback and counted as ``error``.
        """
        platform, bot_id = request.path_params["platform"], request.path_params["bot_id"]
        codec = self.codecs.get((platform, bot_id))
        transport = self.socket_bots.get((platform, bot_id))
        if transport is not None:
            error = f"bot {platform}/{bot_id} takes its events over its WebSocket ({transport}): no webhook"
            return JSONResponse({"error": error}, status_code=404)
        if codec is None:
            return JSONResponse({"error": f"no bot {platform}/{bot_id} is configured"}, status_code=404)
        try:
            return await self._webhook(request, platform, codec)
        except Exception:
            log.exception("webhook %s/%s failed", platform, bot_id)
            metrics.INBOUND.inc(platform=platform, outcome="error")
            return JSONResponse({"error": "internal error"}, status_code=500)

    async def _webhook(self, request: Request, platform: str, codec: PlatformCodec) -> Response:
        try:
            body = await request.body()
        except ClientDisconnect:  # the platform hung up mid-body: nothing to answer, nothing done
            return Response(status_code=400)
        return await self.handle_event(platform, codec, request.headers, body)

    async def handle_event(
        self,
        platform: str,
        codec: PlatformCodec,
        headers: Mapping[str, str],
        body: bytes,
        *,
        verified: bool = False,
    ) -> Response:
        """One inbound event, whatever carried it (an HTTP webhook, a WebSocket frame, a long-poll
        update): verify → decode → size and storage checks → the bot's inbound policy → store
        (inbox + transcript row) → submit. The answer is the webhook's HTTP response (200
        ``accepted``/``duplicate``/``queued``/``untriggered``/``ignored``, 200
        ``denied``/``rate_limited`` — stored, not routed —, 4xx for a bad event — nothing
        stored —, 503 ``unavailable`` with ``Retry-After`` when nothing could be stored); a
        transport without HTTP answers reads ``status_code`` and the JSON body. Exceptions none of
        the steps expects propagate (the webhook answers them 500).

        Args:
            verified: The sender was authenticated another way (the OneBot WebSocket handshake's
                token, ``actors.inbound.onebot_ws``): ``codec.verify`` is skipped.
        """
        with tracing.span("webhook", platform=platform) as step:  # the message's trace (ops-traces)
            refused = self._verify(platform, codec, headers, body, verified=verified)
            if refused is not None:
                return refused
            msg = await self._decode_checked(platform, codec, headers, body)
            if isinstance(msg, Response):
                return msg
            if (tp := step.traceparent()) is not None:  # carried through Ray and the inbox row
                msg = msg.model_copy(update={"traceparent": tp})
                step.set(message_id=msg.message_id, session_key=msg.session_key)
            policy = self.policies.get((msg.platform, msg.bot_id))
            verdict = policy.check(msg) if policy is not None else None
            answer = await self._store_and_submit(platform, msg, verdict)
            step.set(status=answer.status_code)
            return answer

    def _verify(
        self, platform: str, codec: PlatformCodec, headers: Mapping[str, str], body: bytes, *, verified: bool
    ) -> Response | None:
        """Step verify: None when the event may be read, else the answer — 415 for a browser-facing
        codec's event that is not JSON (a cross-site page can POST text/plain or a form without a
        CORS preflight; JSON it cannot), 401 for a bad or unverifiable signature. ``verified``
        skips ``codec.verify`` (the transport authenticated the sender)."""
        if getattr(codec, "browser_facing", False) and not is_json_content_type(headers.get("content-type")):
            metrics.INBOUND.inc(platform=platform, outcome="malformed")
            return JSONResponse({"error": "send the event as application/json"}, status_code=415)
        try:
            if not verified:
                codec.verify(headers, body)
        except SignatureError as exc:
            metrics.INBOUND.inc(platform=platform, outcome="bad_signature")
            return JSONResponse({"error": f"bad signature: {exc}"}, status_code=401)
        except (ValueError, TypeError) as exc:  # e.g. a non-ASCII signature header: not verifiable
            log.info("webhook %s: signature not verifiable: %r", platform, exc)
            metrics.INBOUND.inc(platform=platform, outcome="bad_signature")
            return JSONResponse({"error": "bad signature: not verifiable"}, status_code=401)
        return None

    async def _decode_checked(
        self, platform: str, codec: PlatformCodec, headers: Mapping[str, str], body: bytes
    ) -> InboundMessage | Response:
        """Step decode: the event as an :class:`InboundMessage` that passed the size and storability
        checks, else the answer — 200 ``ignored`` (no message in it), 400 malformed, 413 text
        over ``server.max_text_chars``. Nothing is stored for any of these."""
        try:
            msg = await self._decode(codec, headers, body)
        except MalformedEvent as exc:
            return _malformed(platform, f"malformed event: {exc}")
        except (RecursionError, ValueError):  # nesting too deep, bad JSON, bad UTF-8 (UnicodeError)
            return _malformed(platform, "malformed event: the body could not be decoded")
        except (TypeError, AttributeError, KeyError, IndexError, OverflowError):
            # A codec bug, maybe on a legitimate payload: still 400 (a 5xx would make the platform
            # redeliver it forever and hold back the chat's later updates), but counted as
            # `error` and logged with the traceback so the bug is seen
            # (docs/decisions.md#security-input-limits).
            log.exception("webhook %s: the codec failed on the event (codec bug)", platform)
            return _malformed(platform, "malformed event: the body could not be decoded", outcome="error")
        if msg is None:
            metrics.INBOUND.inc(platform=platform, outcome="ignored")
            return JSONResponse({"status": "ignored"})
        if len(msg.text) > self.max_text_chars:
            metrics.INBOUND.inc(platform=platform, outcome="malformed")
            too_long = text_too_long("message text", len(msg.text), self.max_text_chars)
            return JSONResponse({"error": too_long}, status_code=413)
        problem = storage_problem(msg)
        if problem is not None:
            return _malformed(platform, f"malformed event: {problem}")
        return msg

    async def _store_and_submit(
        self, platform: str, msg: InboundMessage, verdict: Verdict | None
    ) -> Response:
        """Steps store and submit, by the policy's ``verdict`` (None: the bot has no policy): a
        refused or un-triggered message is stored as seen and answered with its outcome; a
        triggered one is stored (inbox + transcript row, one transaction) before the answer, then
        routed (:meth:`InboxGate.take`: ``accepted``/``duplicate``/``queued``). 503
        ``unavailable`` when nothing could be stored (the platform redelivers)."""
        try:
            if verdict is not None and verdict.outcome != "passed":
                await self._persist(msg)  # seen, not answered (docs/decisions.md#platform-inbound-policy)
                metrics.INBOUND.inc(platform=platform, outcome=verdict.outcome)
                send_notice(self.runtime, self.config, msg, verdict, self._notices)
                return JSONResponse({"status": verdict.outcome})
            if not msg.triggered:
                await self._persist(msg)
                metrics.INBOUND.inc(platform=platform, outcome="untriggered")
                return JSONResponse({"status": "untriggered"})
            # Store (inbox + transcript row, one transaction) before answering, then route; once
            # stored, any routing failure is "queued" (docs/decisions.md#inbox-durable).
            status = await self.gate.take(msg, _transcript_fields(msg))
        except OperationalError as exc:
            # SQLite lock timeout or database down: nothing was stored, the platform must
            # redeliver (the inbox row and the transcript row are then stored once).
            log.warning("webhook %s/%s unavailable: %r", platform, msg.bot_id, exc)
            metrics.INBOUND.inc(platform=platform, outcome="unavailable")
            return _busy("unavailable", 1.0)
        metrics.INBOUND.inc(platform=platform, outcome=status)
        return JSONResponse({"status": status})

    async def _decode(self, codec: PlatformCodec, headers: Any, body: bytes) -> InboundMessage | None:
        """``codec.parse``; in a worker thread for a body over :data:`DECODE_IN_THREAD_BYTES`, so a
        large body (e.g. a 1 MB OneBot CQ-code string) does not stall the event loop
        (docs/decisions.md#platform-linear-parsing)."""
        if len(body) > DECODE_IN_THREAD_BYTES:
            return await asyncio.to_thread(codec.parse, headers, body)
        return codec.parse(headers, body)

    async def _persist(self, msg: InboundMessage) -> None:
        """Inbound transcript row of a message that gets no turn (un-triggered, refused by the
        policy), written when the event is accepted (docs/decisions.md#memory-transcripts)."""
        await self.transcripts.record_inbound(**_transcript_fields(msg))

    async def healthz(self, request: Request) -> Response:
        """``GET /healthz``: 200 while this process serves; with OneBot WebSocket bots also
        ``"onebot_ws": {self_id: {...}}``, their sockets as this process sees them
        (``runtime.platforms.onebot11_ws.ConnectionHealth.view``); with ``mode: polling`` bots
        ``"telegram_polling": {self_id: poller status}`` (``state: "conflict"`` on a 409:
        :func:`actors.inbound.telegram_poll_status.polling_health`)."""
        body: dict[str, Any] = {"status": "ok"}
        sockets = self.onebot_sockets
        if sockets is not None and sockets.health:
            body["onebot_ws"] = sockets.health_view()
        if polling_bots(self.config):
            body["telegram_polling"] = await polling_health(
                self.config, getattr(self.runtime, "prefix", "sessionray")
            )
        return JSONResponse(body)

    async def metrics_endpoint(self, request: Request) -> Response:
        """``GET /metrics``: refresh the router-level gauges, then prometheus-client's text format."""
        try:
            status = await asyncio.wait_for(self.runtime.status(), timeout=2.0)
            _refresh_gauges(status)
        except Exception as exc:  # the scrape must not fail because the runtime is busy or down
            log.debug("runtime status for /metrics unavailable: %r", exc)
        return Response(prometheus_client.generate_latest(), media_type=prometheus_client.CONTENT_TYPE_LATEST)


def _transcript_fields(msg: InboundMessage) -> dict[str, Any]:
    """The ``TranscriptStore.record_inbound`` fields of ``msg``."""
    return {
        "message_id": msg.message_id,
        "platform": msg.platform,
        "bot_id": msg.bot_id,
        "scene_id": msg.scene_id,
        "scene_type": msg.scene_type,
        "sender_id": msg.sender.id,
        "sender_name": msg.sender.name,
        "sender_role": ",".join(msg.sender.roles),
        "segments": msg.segments,
        "text": msg.text,
        "time_ms": msg.time_ms,
    }


def _malformed(platform: str, error: str, outcome: str = "malformed") -> Response:
    """400 ``{"error": ...}``, counted as ``outcome`` (``malformed``; ``error`` for a codec bug):
    nothing was stored or routed."""
    metrics.INBOUND.inc(platform=platform, outcome=outcome)
    return JSONResponse({"error": error}, status_code=400)


def _busy(status: str, retry_after_s: float | None) -> Response:
    """503 with ``Retry-After`` in whole seconds (≥ 1)."""
    retry_after = max(1, math.ceil(float(retry_after_s or 1)))
    return JSONResponse(
        {"status": status, "retry_after_s": retry_after},
        status_code=503,
        headers={"Retry-After": str(retry_after)},
    )


def _field(status: Any, *names: str) -> float | None:
    for name in names:
        value = status.get(name) if isinstance(status, dict) else getattr(status, name, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, list | tuple | dict):
            return float(len(value))
    return None


def _refresh_gauges(status: Any) -> None:
    live = _field(status, "live_sessions", "live")
    if live is not None:
        metrics.LIVE_SESSIONS.set(live)
    hosts = _field(status, "hosts")
    if hosts is not None:
        metrics.HOSTS.set(hosts)


def build_app(runtime: Any, config: Any, *, transcripts: TranscriptStore | None = None) -> Starlette:
    """The ASGI app: webhooks, ``/healthz``, ``/metrics``, ``/admin/...`` and the console routes.

    Args:
        runtime: The session runtime handle (already started).
        config: ``runtime.config.Config``.
        transcripts: Optional transcript store (default: on ``config.database.url``).
    """
    ingress = Ingress(runtime, config, transcripts)
    sockets = OneBotSockets(ingress, config)  # OneBot v11 over WebSocket (bots[].transport)
    ingress.onebot_sockets = sockets
    token_env = getattr(getattr(config, "server", None), "admin_token_env", None)
    # The admin's view of stored sessions reads through the ingress's own Database (one pool).
    stored = None if ingress.db is None else ContextRepository(ingress.db)
    routes: list[BaseRoute] = [
        Route("/webhooks/{platform}/{bot_id}", ingress.webhook, methods=["POST"]),
        Route("/healthz", ingress.healthz, methods=["GET"]),
        Route("/metrics", ingress.metrics_endpoint, methods=["GET"]),
        *admin_routes(runtime, token_env, repository=stored),
        *console_routes(runtime, config, transcripts=ingress.transcripts),
        *sockets.routes(),
    ]
    # The lifespan runs the forward-WS dialers: serve the app with lifespan "on".
    app = Starlette(routes=routes, lifespan=sockets.lifespan)
    app.state.ingress = ingress
    app.add_middleware(
        BodySizeLimit, max_body_bytes=config.server.max_body_bytes, exempt=trusted_internal_call
    )
    app.add_middleware(_RouteMetrics, routes=routes)  # outermost: a 413 is counted by route too
    return app

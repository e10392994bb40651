"""OneBot v11 over WebSocket in the ingress process: reverse routes, forward dialers, the pump.

Per bot ``transport`` (``bots[].transport``):

* ``ws-reverse`` — the implementation dials ``/onebot/v11/ws`` (role ``Universal``; also
  ``/onebot/v11/ws/event`` and ``/onebot/v11/ws/api``). The handshake must carry ``X-Self-ID`` of
  a configured ``ws-reverse`` bot and, when the bot has ``access_token_env``, its token as
  ``Authorization: Bearer <token>`` (or ``?access_token=``); ``X-Client-Role``, when sent, must
  match the path. Anything else is refused before the upgrade (HTTP 403), nothing read.
* ``ws-forward`` — a background task dials ``ws_url`` (token as ``Authorization: Bearer``) and
  redials with exponential backoff and jitter; on a cluster only the ingress process holding the
  bot's lease in its ``OneBotLink`` actor dials (:mod:`actors.delivery.onebot_link`).

Inbound: each event frame goes through :meth:`actors.inbound.ingress.Ingress.handle_event` — the
webhook's own path (decode, size and storability checks, store → route, dedup), without the
HTTP signature (the handshake authenticated the socket). A frame over ``server.max_body_bytes``
is dropped and counted ``malformed``. Events of one socket are handled in order. There is no
HTTP answer to carry a 503: an event that could not be stored (``unavailable``; a stored one
that could not be routed is ``queued`` in the durable inbox instead) is
submitted again in the background with backoff, at most :data:`RESUBMIT_ATTEMPTS` times and
:data:`MAX_RESUBMITTING` events at once, counted in ``sessionray_onebot_ws_resubmits_total``.

Start-up (docs/decisions.md#ops-early-accept): ``sessionray serve`` accepts reverse sockets
before Ray is up. Until the runtime is up (:meth:`actors.serve.gate.RuntimeGate.wait_ready`)
nothing here touches Ray: a reverse socket's events are stored and answered ``queued`` as a
webhook's are (the start-up recovery routes them), and its pump takes the bot's lease only once
the runtime is up; a forward dialer dials only then (the lease decides which process dials).

Outbound: a socket with an API role (``Universal``/``API``, and every forward socket) holds the
bot's lease in its link actor and pumps: it long-polls ``next_calls``, writes each frame, and
hands every answer (matched by ``echo``) back with ``resolve``. Meta events (``heartbeat``,
``lifecycle``) update this process's :class:`~runtime.platforms.onebot11_ws.ConnectionHealth`
(``/healthz`` → ``onebot_ws``) and ``sessionray_onebot_ws_connected{bot}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import ray
import websockets
from starlette.applications import Starlette
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket

from actors.delivery.onebot_link import LINK_PREFIX, get_link
from runtime import metrics
from runtime.platforms.base import read_env
from runtime.platforms.onebot11_ws import (
    ROLES,
    WS_PATHS,
    ConnectionHealth,
    bearer_token,
    is_api_response,
    token_matches,
)

__all__ = ["MAX_RESUBMITTING", "RESUBMIT_ATTEMPTS", "OneBotSockets"]

log = logging.getLogger("sessionray.onebot_ws")

PLATFORM = "onebot11"
JSON_HEADERS = {"content-type": "application/json"}
POLL_S = 2.0
"""Longest wait of one ``next_calls`` long poll, in seconds (also how long a closing socket waits
for its pump to stop)."""
LEASE_TTL_S = 15.0
"""A holder's lease lasts this long after its last poll (a dead holder is replaced after it)."""
RESUBMIT_ATTEMPTS = 8
"""Submits of one busy/unavailable socket event after the first, before it is given up."""
MAX_RESUBMITTING = 1_000
"""Most socket events waiting for a resubmit at once in this process; more are given up."""
INBOX_SIZE = 256
"""Events of one socket waiting to be handled; a full inbox stops reading the socket."""


class _Socket:
    """send/receive of text frames over a starlette WebSocket or a ``websockets`` connection."""

    def __init__(
        self, send: Callable[[str], Awaitable[None]], recv: Callable[[], Awaitable[str | None]]
    ) -> None:
        self.send = send
        self.recv = recv


@dataclass
class _Held:
    """The link actor in which a socket's pump took the bot's lease (None until it did)."""

    link: Any = None


def _starlette_socket(ws: WebSocket) -> _Socket:
    async def recv() -> str | None:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return None
        text = message.get("text")
        return text if text is not None else (message.get("bytes") or b"").decode("utf-8", "replace")

    return _Socket(ws.send_text, recv)


def _client_socket(conn: Any) -> _Socket:
    async def recv() -> str | None:
        try:
            data = await conn.recv()
        except websockets.ConnectionClosed:
            return None
        return data if isinstance(data, str) else data.decode("utf-8", "replace")

    return _Socket(conn.send, recv)


class OneBotSockets:
    """The OneBot WebSocket bots of one ingress process (module docstring).

    Args:
        ingress: The :class:`actors.inbound.ingress.Ingress` whose ``handle_event`` takes the events.
        config: ``runtime.config.Config`` (``bots[].transport``, ``ws_url``, ``access_token_env``,
            ``server.max_body_bytes``).
        link_prefix: Name prefix of the link actors (tests use their own).
        backoff_base_s / backoff_max_s: Redial and resubmit backoff: ``base·2^n`` capped at
            ``max``, with jitter in [½, 1]×.

    Raises:
        ValueError: a bot's ``access_token_env`` names an unset variable.
    """

    def __init__(
        self,
        ingress: Any,
        config: Any,
        *,
        link_prefix: str = LINK_PREFIX,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        self.ingress = ingress
        self.link_prefix = link_prefix
        self.backoff_base_s, self.backoff_max_s = backoff_base_s, backoff_max_s
        self.max_frame_bytes = int(config.server.max_body_bytes)
        ws_bots = [b for b in config.bots if str(b.platform) == PLATFORM and b.transport != "http"]
        self.reverse = {str(b.self_id) for b in ws_bots if b.transport == "ws-reverse"}
        self.forward = {str(b.self_id): str(b.ws_url) for b in ws_bots if b.transport == "ws-forward"}
        self.tokens = {
            str(b.self_id): read_env(b.access_token_env, what="OneBot access token") for b in ws_bots
        }
        self.health = {str(b.self_id): ConnectionHealth(b.transport) for b in ws_bots}
        self._links: dict[str, Any] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._resubmitting = 0
        self._process = f"{socket.gethostname()}:{os.getpid()}"
        for bot_id in self.health:
            metrics.ONEBOT_WS_CONNECTED.set(0, bot=bot_id)

    # ------------------------------------------------------------------ wiring

    def routes(self) -> list[BaseRoute]:
        """The reverse-WS routes (none when no bot is ``ws-reverse``)."""
        if not self.reverse:
            return []
        return [WebSocketRoute(path, self.reverse_endpoint) for path in WS_PATHS]

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Starlette lifespan: the forward dialers run while the app serves."""
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def start(self) -> None:
        """Start one dialer per ``ws-forward`` bot (idempotent)."""
        if any(t.get_name().startswith("onebot-dial-") for t in self._tasks):
            return
        for bot_id, url in self.forward.items():
            self._spawn(self._dial_loop(bot_id, url), f"onebot-dial-{bot_id}")

    async def stop(self) -> None:
        """Cancel the dialers and pending resubmits (their sockets close, leases are released)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def health_view(self) -> dict[str, Any]:
        """``{self_id: ConnectionHealth.view()}`` for ``/healthz`` (this process's sockets)."""
        return {bot_id: h.view() for bot_id, h in self.health.items()}

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _link(self, bot_id: str) -> Any:
        link = self._links.get(bot_id)
        if link is None:
            link = self._links[bot_id] = get_link(bot_id, self.link_prefix)
        return link

    async def _runtime_up(self) -> None:
        """Until the session runtime (and so Ray) is up: at once for a started runtime, else
        :meth:`actors.serve.gate.RuntimeGate.wait_ready` (a socket of ``sessionray serve``
        accepted or dialled while it starts must not reach Ray, docs/decisions.md#ops-early-accept)."""
        wait = getattr(getattr(self.ingress, "runtime", None), "wait_ready", None)
        if wait is not None:
            await wait()

    def _backoff(self, attempt: int, at_least: float = 0.0) -> float:
        full = min(self.backoff_max_s, self.backoff_base_s * (2 ** max(0, attempt - 1)))
        return max(at_least, full * (0.5 + random.random() / 2))

    # ------------------------------------------------------------------ reverse

    async def reverse_endpoint(self, ws: WebSocket) -> None:
        """``/onebot/v11/ws[/event|/api]``: check the handshake, then serve the socket."""
        path_role = WS_PATHS.get(ws.url.path, "Universal")
        client_role = ws.headers.get("x-client-role")
        bot_id = (ws.headers.get("x-self-id") or "").strip()
        problem = None
        if bot_id not in self.reverse:
            problem = "X-Self-ID is not a configured ws-reverse bot"
        elif not token_matches(self.tokens.get(bot_id), bearer_token(ws.headers, ws.query_params)):
            problem = "bad or missing access token"
        elif client_role is not None and (
            client_role not in ROLES or (path_role != "Universal" and client_role != path_role)
        ):
            problem = f"X-Client-Role {client_role[:20]!r} does not fit {ws.url.path}"
        if problem is not None:
            log.warning("OneBot reverse WebSocket refused: %s", problem)
            metrics.INBOUND.inc(platform=PLATFORM, outcome="bad_signature")
            await ws.close(code=1008)  # before accept: the server answers the upgrade with 403
            return
        role = client_role if path_role == "Universal" and client_role else path_role
        await ws.accept()
        await self.serve_socket(bot_id, role, _starlette_socket(ws), take_over=True)

    # ------------------------------------------------------------------ forward

    async def _dial_loop(self, bot_id: str, url: str) -> None:
        """Dial ``url`` for ever (until cancelled) while this process holds the bot's lease."""
        token = self.tokens.get(bot_id)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        holder = f"{self._process}:dial-{uuid.uuid4().hex[:8]}"
        attempt = 0
        await self._runtime_up()  # the lease lives in a Ray actor
        while True:
            try:
                held = await self._link(bot_id).acquire.remote(holder, LEASE_TTL_S, False)
            except ray.exceptions.RayError as exc:
                log.warning("bot %s: link actor unreachable: %r", bot_id, exc)
                self._links.pop(bot_id, None)
                held = False
            if not held:  # another ingress process dials this bot
                await asyncio.sleep(LEASE_TTL_S / 2 * (0.5 + random.random() / 2))
                continue
            try:
                async with websockets.connect(
                    url, additional_headers=headers, max_size=self.max_frame_bytes, open_timeout=10
                ) as conn:
                    attempt = 0
                    log.info("bot %s: forward WebSocket %s connected", bot_id, url)
                    await self.serve_socket(bot_id, "Universal", _client_socket(conn), holder=holder)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # refused, unreachable, dropped, or a bug: log and redial
                if isinstance(exc, OSError | TimeoutError | websockets.WebSocketException):
                    log.warning("bot %s: forward WebSocket %s: %r", bot_id, url, exc)
                else:
                    log.exception("bot %s: forward WebSocket %s failed", bot_id, url)
                with contextlib.suppress(ray.exceptions.RayError):
                    await self._link(bot_id).release.remote(holder)
            attempt += 1
            await asyncio.sleep(self._backoff(attempt))

    # ------------------------------------------------------------------ one socket

    async def serve_socket(
        self, bot_id: str, role: str, sock: _Socket, *, take_over: bool = False, holder: str | None = None
    ) -> None:
        """Read events and answers from an open socket until it closes; with an API role, pump
        the bot's queued calls into it. Releases the bot's lease when it ends."""
        conn_id = uuid.uuid4().hex[:12]
        health = self.health[bot_id]
        health.opened(conn_id, role)
        metrics.ONEBOT_WS_CONNECTED.set(1, bot=bot_id)
        holder = holder or f"{self._process}:{conn_id}"
        closed = asyncio.Event()
        held = _Held()
        inbox: asyncio.Queue[bytes | None] = asyncio.Queue(INBOX_SIZE)
        worker = asyncio.ensure_future(self._inbox_worker(bot_id, inbox))
        pump = None
        if role in ("Universal", "API"):
            pump = asyncio.ensure_future(self._pump(bot_id, holder, sock, closed, held, take_over))
        try:
            while (text := await sock.recv()) is not None:
                await self._frame(bot_id, text, held, inbox)
        finally:
            closed.set()
            health.closed(conn_id)
            metrics.ONEBOT_WS_CONNECTED.set(1 if health.connected else 0, bot=bot_id)
            await inbox.put(None)
            await asyncio.shield(self._finish(held, holder, pump, worker))

    async def _finish(
        self, held: _Held, holder: str, pump: asyncio.Future[None] | None, worker: asyncio.Future[None]
    ) -> None:
        """After a socket closed: let the pump hand back what it could not write, then release
        the lease it took (failing calls written and not answered), then drain the inbox."""
        if pump is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pump, POLL_S + 10)
        if held.link is not None:
            with contextlib.suppress(ray.exceptions.RayError):
                await held.link.release.remote(holder)
        with contextlib.suppress(Exception):
            await worker

    async def _until_up(self, closed: asyncio.Event) -> bool:
        """Until the runtime is up (True) or the socket closed first (False)."""
        up = asyncio.ensure_future(self._runtime_up())
        gone = asyncio.ensure_future(closed.wait())
        try:
            await asyncio.wait((up, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            up.cancel()
            gone.cancel()
        return up.done() and not up.cancelled() and not closed.is_set()

    async def _pump(
        self, bot_id: str, holder: str, sock: _Socket, closed: asyncio.Event, held: _Held, take_over: bool
    ) -> None:
        """Once the runtime is up: take the bot's lease (``take_over``: from any holder), then
        write the link's queued calls into ``sock`` until it closes."""
        if not await self._until_up(closed):
            return  # closed before the runtime was up: no lease taken, nothing to release
        link = held.link = self._link(bot_id)
        try:
            await link.acquire.remote(holder, LEASE_TTL_S, take_over)
        except ray.exceptions.RayError as exc:  # acquired below once the link answers
            log.warning("bot %s: link actor unreachable: %r", bot_id, exc)
        while not closed.is_set():
            try:
                frames = await link.next_calls.remote(holder, POLL_S, LEASE_TTL_S)
            except ray.exceptions.RayError as exc:
                log.warning("link poll failed: %r", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(closed.wait(), 1.0)
                continue
            if frames is None:  # another socket holds the lease (or the link restarted)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(closed.wait(), POLL_S)
                with contextlib.suppress(ray.exceptions.RayError):
                    await link.acquire.remote(holder, LEASE_TTL_S, False)
                continue
            for i, frame in enumerate(frames):
                try:
                    if closed.is_set():
                        raise ConnectionError("socket closed")
                    await sock.send(json.dumps(frame, ensure_ascii=False))
                except Exception:  # never written: back to the queue for the next socket
                    await link.requeue.remote([f["echo"] for f in frames[i:]])
                    return

    async def _frame(self, bot_id: str, text: str, held: _Held, inbox: asyncio.Queue[bytes | None]) -> None:
        """One text frame: an API answer goes to the link the pump holds, an event to the inbox."""
        body = text.encode("utf-8", "replace")
        if len(body) > self.max_frame_bytes:
            log.warning("bot %s: %d-byte frame over server.max_body_bytes dropped", bot_id, len(body))
            metrics.INBOUND.inc(platform=PLATFORM, outcome="malformed")
            return
        try:
            frame = json.loads(body) if len(body) < 65536 else await asyncio.to_thread(json.loads, body)
        except (ValueError, RecursionError):
            frame = None  # handle_event answers it as malformed (and counts it)
        if is_api_response(frame):
            # no link: an Event-role socket, or no call was written yet (the runtime is starting)
            if held.link is not None:
                with contextlib.suppress(ray.exceptions.RayError):
                    await held.link.resolve.remote(str(frame["echo"]), frame)
            return
        self.health[bot_id].event(frame)
        await inbox.put(body)

    async def _inbox_worker(self, bot_id: str, inbox: asyncio.Queue[bytes | None]) -> None:
        while (body := await inbox.get()) is not None:
            retry_after = await self._ingest(bot_id, body)
            if retry_after is not None:
                self._resubmit_later(bot_id, body, retry_after)

    async def _ingest(self, bot_id: str, body: bytes) -> float | None:
        """Through the webhook path; returns the ``Retry-After`` seconds of a 503, else None."""
        codec = self.ingress.codecs[(PLATFORM, bot_id)]
        try:
            answer = await self.ingress.handle_event(PLATFORM, codec, JSON_HEADERS, body, verified=True)
        except Exception:
            log.exception("OneBot WebSocket event of bot %s failed", bot_id)
            metrics.INBOUND.inc(platform=PLATFORM, outcome="error")
            return None
        if answer.status_code == 503:
            return float(answer.headers.get("retry-after") or 1)
        if answer.status_code != 200:
            log.info(
                "bot %s: socket event refused: %s %s", bot_id, answer.status_code, bytes(answer.body)[:200]
            )
        return None

    def _resubmit_later(self, bot_id: str, body: bytes, retry_after: float) -> None:
        if self._resubmitting >= MAX_RESUBMITTING:
            log.error("bot %s: too many socket events waiting for a resubmit; one given up", bot_id)
            metrics.ONEBOT_WS_RESUBMITS.inc(outcome="overflow")
            return
        self._resubmitting += 1
        self._spawn(self._resubmit(bot_id, body, retry_after), f"onebot-resubmit-{bot_id}")

    async def _resubmit(self, bot_id: str, body: bytes, retry_after: float) -> None:
        try:
            for attempt in range(1, RESUBMIT_ATTEMPTS + 1):
                metrics.ONEBOT_WS_RESUBMITS.inc(outcome="retry")
                await asyncio.sleep(self._backoff(attempt, at_least=retry_after))
                again = await self._ingest(bot_id, body)
                if again is None:
                    metrics.ONEBOT_WS_RESUBMITS.inc(outcome="done")
                    return
                retry_after = again
            log.error(
                "bot %s: a socket event stayed busy after %d resubmits; given up", bot_id, RESUBMIT_ATTEMPTS
            )
            metrics.ONEBOT_WS_RESUBMITS.inc(outcome="gave_up")
        finally:
            self._resubmitting -= 1

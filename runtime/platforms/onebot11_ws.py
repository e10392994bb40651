"""OneBot v11 over WebSocket, the socket-free part: frames, the handshake check, connection health.

OneBot v11 ``communication/ws.md`` and ``ws-reverse.md``: one WebSocket carries events (JSON
objects with ``post_type``) from the implementation and API calls ``{"action", "params",
"echo"}`` to it, each answered by ``{"status", "retcode", "data", "echo"}`` with the same
``echo``. In *reverse* mode the implementation dials the bot (role ``Universal`` on one URL, or
``Event`` and ``API`` on two), sending ``X-Self-ID``, ``X-Client-Role`` and ``Authorization:
Bearer <access_token>``; in *forward* mode the bot dials the implementation's server.

An API call is the HTTP :class:`~runtime.platforms.base.ApiCall` the codec renders anyway
(``path`` ``/send_group_msg`` → ``action`` ``send_group_msg``, ``json_body`` → ``params``), and
its answer is read by the codec's own ``parse_send_result`` (a WS answer has the HTTP body's
shape), so both transports send and read the same way.

Nothing here opens a socket or imports Ray: ``actors.inbound.onebot_ws`` holds the sockets and
``actors.delivery.onebot_link`` is the rendezvous between delivery actors and the socket.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from runtime.platforms.base import ApiCall, PlatformCodec, SendResult, header

__all__ = [
    "ROLES",
    "WS_PATHS",
    "ConnectionHealth",
    "SocketAnswer",
    "api_frame",
    "bearer_token",
    "is_api_response",
    "send_result_of",
    "token_matches",
]

WS_PATHS: dict[str, str] = {
    "/onebot/v11/ws": "Universal",
    "/onebot/v11/ws/event": "Event",
    "/onebot/v11/ws/api": "API",
}
"""Reverse-WS path → the role the path serves (the same paths NoneBot2's OneBot adapter serves)."""
ROLES = frozenset(WS_PATHS.values())


class SocketAnswer(BaseModel):
    """What became of one API call sent over a socket (the ``OneBotLink`` actor's answer).

    ``state``: ``answered`` (``response`` is the implementation's answer frame); ``not_sent``
    (no socket took it within its timeout: never written, safe to retry, like an HTTP connect
    error); ``no_answer`` (written to a socket, then no answer within the timeout or the socket
    closed: it may have been executed, so it is not retried — at most once,
    docs/decisions.md#delivery-ledger).
    """

    state: Literal["answered", "not_sent", "no_answer"]
    response: dict[str, Any] | None = None
    error: str | None = None


def api_frame(call: ApiCall, echo: str | None = None) -> dict[str, Any]:
    """The WS frame of an HTTP-shaped OneBot call: ``{"action": <path without "/">, "params":
    <json body or {}>}`` plus ``"echo"`` when given.

    Raises:
        ValueError: the call has a multipart body (OneBot calls never do).
    """
    if call.form is not None or call.files:
        raise ValueError("a OneBot API call over WebSocket carries JSON params only")
    frame: dict[str, Any] = {"action": call.path.lstrip("/"), "params": dict(call.json_body or {})}
    if echo is not None:
        frame["echo"] = echo
    return frame


def is_api_response(frame: Any) -> bool:
    """True for an answer to an API call (an object with ``echo`` and ``retcode`` or ``status``,
    and no ``post_type``); events and anything else are False."""
    return (
        isinstance(frame, dict)
        and "post_type" not in frame
        and "echo" in frame
        and ("retcode" in frame or "status" in frame)
    )


def send_result_of(answer: SocketAnswer, codec: PlatformCodec) -> SendResult:
    """Map a socket call's fate to a :class:`SendResult` as the HTTP sender would
    (``runtime.delivery.core``): ``answered`` → ``codec.parse_send_result`` of the answer as an
    HTTP 200 body (``retcode`` 0/1 ok; others fail with their wording); ``not_sent`` → a
    retryable ``connect:`` failure; ``no_answer`` → a non-retryable ``transport:`` failure."""
    if answer.state == "answered":
        body = json.dumps(answer.response or {}, ensure_ascii=False).encode("utf-8")
        return codec.parse_send_result(200, {}, body)
    if answer.state == "not_sent":
        return SendResult(ok=False, error=f"connect: {answer.error or 'no socket'}", retryable=True)
    return SendResult(ok=False, error=f"transport: {answer.error or 'no answer'}", retryable=False)


def bearer_token(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The access token a client presented: ``Authorization: Bearer <t>`` (or ``Token <t>``, as
    go-cqhttp sends), else the ``access_token`` query parameter; None when neither is there."""
    auth = header(headers, "Authorization")
    if auth:
        scheme, _, value = auth.strip().partition(" ")
        if scheme.lower() in ("bearer", "token") and value.strip():
            return value.strip()
    return query.get("access_token") or None


def token_matches(expected: str | None, presented: str | None) -> bool:
    """Constant-time comparison (bytes, so non-ASCII never raises); with no ``expected`` token
    configured every client matches (docs/decisions.md#security-webhook-auth)."""
    if not expected:
        return True
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode("utf-8"))


@dataclass
class ConnectionHealth:
    """One bot's sockets as this process sees them (``/healthz`` detail).

    Times are Unix epoch milliseconds (0: never).
    """

    transport: str
    sockets: dict[str, str] = field(default_factory=dict)
    """Open sockets: connection id → role (``Universal`` | ``Event`` | ``API``)."""
    connected_ms: int = 0
    """When the newest socket opened."""
    last_event_ms: int = 0
    last_heartbeat_ms: int = 0
    heartbeat_interval_ms: int | None = None
    """The interval the implementation announces in its heartbeats."""
    lifecycle: str | None = None
    """The last ``lifecycle`` meta event's ``sub_type`` (``connect`` | ``enable`` | ``disable``)."""
    online: bool | None = None
    """``status.online`` of the last heartbeat."""
    reconnects: int = 0
    """Sockets opened after the first one (forward: redials)."""

    @property
    def connected(self) -> bool:
        """At least one socket is open."""
        return bool(self.sockets)

    def opened(self, conn_id: str, role: str) -> None:
        """Record a socket that opened."""
        if self.connected_ms:
            self.reconnects += 1
        self.sockets[conn_id] = role
        self.connected_ms = _now_ms()

    def closed(self, conn_id: str) -> None:
        """Record a socket that closed."""
        self.sockets.pop(conn_id, None)

    def event(self, event: Any) -> None:
        """Note one event frame; ``meta_event`` heartbeats and lifecycles update the health."""
        now = _now_ms()
        self.last_event_ms = now
        if not isinstance(event, dict) or event.get("post_type") != "meta_event":
            return
        kind = event.get("meta_event_type")
        if kind == "heartbeat":
            self.last_heartbeat_ms = now
            interval = event.get("interval")
            if isinstance(interval, int) and not isinstance(interval, bool) and interval > 0:
                self.heartbeat_interval_ms = interval
            status = event.get("status")
            if isinstance(status, dict) and isinstance(status.get("online"), bool):
                self.online = status["online"]
        elif kind == "lifecycle" and isinstance(event.get("sub_type"), str):
            self.lifecycle = event["sub_type"][:32]

    def view(self) -> dict[str, Any]:
        """JSON detail for ``/healthz``: ``connected``, ``roles``, times (ms), ``stale`` (no
        heartbeat for over twice the announced interval)."""
        stale = None
        if self.heartbeat_interval_ms and self.last_heartbeat_ms:
            stale = _now_ms() - self.last_heartbeat_ms > 2 * self.heartbeat_interval_ms
        return {
            "transport": self.transport,
            "connected": self.connected,
            "roles": sorted(set(self.sockets.values())),
            "connected_ms": self.connected_ms,
            "last_event_ms": self.last_event_ms,
            "last_heartbeat_ms": self.last_heartbeat_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "heartbeat_stale": stale,
            "lifecycle": self.lifecycle,
            "online": self.online,
            "reconnects": self.reconnects,
        }


def _now_ms() -> int:
    return int(time.time() * 1000)

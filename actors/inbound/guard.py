"""Ingress guards: the request-body size limit and the "can this inbound message be stored?" check.

Both run before anything is stored or routed (docs/decisions.md#security-input-limits):

* :class:`BodySizeLimit` — ASGI middleware over the whole app (every route): a request whose
  ``Content-Length`` exceeds ``server.max_body_bytes`` is answered **413** at once, without reading
  the body; a body without ``Content-Length`` (chunked) is read up to the limit before the app
  runs — one byte more and the answer is **413** — and then replayed to the app unchanged. The
  one exception is :func:`trusted_internal_call`: a DeliveryActor's call to the console's internal
  platform API with the right ``X-Console-Api-Token`` (replies there carry ``path`` media inlined
  as base64, already bounded by the console's media limits in ``runtime.reply.media``).
* :func:`storage_problem` — the webhook's last check before ``persist ‖ route``: every text and id
  of the message must be encodable as UTF-8 (no lone UTF-16 surrogate), the segments must be
  serializable as JSON, ``time_ms`` must fit a SQL ``BIGINT`` (signed 64 bit) and the ids must
  form a valid session key. Without it a bad message could be routed (its turn running) while
  its transcript write fails, and the platform would redeliver it forever.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runtime.keys import SessionKeyError
from runtime.platforms.base import InboundMessage
from runtime.platforms.common import INT64_MAX, INT64_MIN, lone_surrogate_at, valid_unicode
from runtime.platforms.console import API_TOKEN_HEADER, DELIVER_PATH, EVENTS_PATH, api_token_matches

__all__ = ["BodySizeLimit", "storage_problem", "trusted_internal_call"]


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, payload: dict[str, Any]) -> None:
    # Connection: close — the unread rest of the body makes the connection unusable.
    await JSONResponse(payload, status_code=status, headers={"connection": "close"})(scope, receive, send)


class BodySizeLimit:
    """ASGI middleware: refuse request bodies larger than ``max_body_bytes`` with HTTP 413.

    Args:
        app: The wrapped ASGI app.
        max_body_bytes: The limit in bytes (``server.max_body_bytes``, default 1 MiB); > 0.
        exempt: A request for which it returns True passes unlimited (default: none;
            ``build_app`` passes :func:`trusted_internal_call`).

    Answers (JSON ``{"error": ...}``, ``Connection: close``): **413** for a declared
    ``Content-Length`` over the limit (body not read) or a streamed (chunked) body that grows over
    it; **400** for a ``Content-Length`` that is not a non-negative integer. Anything else passes
    through unchanged; a streamed body within the limit is buffered (at most ``max_body_bytes``)
    and replayed to the app, after which the app's ``receive`` is the server's own (disconnects).
    """

    def __init__(
        self, app: ASGIApp, max_body_bytes: int, exempt: Callable[[Scope], bool] | None = None
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError(f"max_body_bytes must be > 0, got {max_body_bytes}")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.exempt = exempt

    def _too_large(self) -> dict[str, Any]:
        limit = self.max_body_bytes
        return {"error": f"request body too large: the limit is {limit} bytes (server.max_body_bytes)"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.exempt is not None and self.exempt(scope)):
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            text = declared.strip()
            if not (text.isascii() and text.isdigit()):
                await _refuse(
                    scope, receive, send, 400, {"error": "Content-Length must be a non-negative integer"}
                )
                return
            if len(text) > 18 or int(text) > self.max_body_bytes:  # (18 digits: no huge int parse)
                await _refuse(scope, receive, send, 413, self._too_large())
                return
            await self.app(scope, receive, send)  # the server enforces the declared framing
            return
        # No Content-Length (chunked transfer, or no body): read it up to the limit first.
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":  # http.disconnect: let the app see it
                break
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                await _refuse(scope, receive, send, 413, self._too_large())
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)


_INTERNAL_PATHS = frozenset({DELIVER_PATH, EVENTS_PATH})


def trusted_internal_call(scope: Scope) -> bool:
    """True for a ``POST`` to the console's internal ``/console/api/deliver`` or ``/events`` that
    carries ``X-Console-Api-Token`` equal to ``$SESSIONRAY_CONSOLE_API_TOKEN``
    (:func:`runtime.platforms.console.api_token_matches`, the check the console routes use);
    False otherwise, also when no token is set."""
    if scope.get("path") not in _INTERNAL_PATHS or scope.get("method") != "POST":
        return False
    return api_token_matches(Headers(scope=scope).get(API_TOKEN_HEADER))


def storage_problem(msg: InboundMessage) -> str | None:
    """Why ``msg`` cannot be stored (transcript row, session messages), or ``None`` when it can.

    Checks, in order: each text/id field is valid Unicode (no lone surrogate such as ``"\\ud800"``:
    :func:`runtime.platforms.common.lone_surrogate_at`); the segments serialize as JSON text in
    valid Unicode; ``time_ms`` lies within
    [:data:`INT64_MIN`, :data:`INT64_MAX`] (it is stored in a ``BIGINT`` column, milliseconds);
    the ids form a valid session key (``runtime.keys.make_session_key``).

    Returns:
        A short reason naming the field, e.g. ``"text is not valid Unicode (lone surrogate at
        character 4)"``; never the message content itself.
    """
    fields: list[tuple[str, str | None]] = [
        ("message_id", msg.message_id),
        ("bot_id", msg.bot_id),
        ("scene_id", msg.scene_id),
        ("sender.id", msg.sender.id),
        ("sender.name", msg.sender.name),
        *((f"sender.roles[{i}]", role) for i, role in enumerate(msg.sender.roles)),
        ("text", msg.text),
        ("reply_to", msg.reply_to),
    ]
    for name, value in fields:
        at = None if value is None else lone_surrogate_at(value)
        if at is not None:
            return f"{name} is not valid Unicode (lone surrogate at character {at})"
    try:
        segments = json.dumps(msg.segments, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return "segments cannot be stored as JSON"
    if not valid_unicode(segments):
        return "segments are not valid Unicode (lone surrogate)"
    if not INT64_MIN <= msg.time_ms <= INT64_MAX:
        return "time is out of range (a 64-bit count of milliseconds)"
    try:
        _ = msg.session_key
    except SessionKeyError as exc:
        return f"bad chat or user id: {exc}"
    return None

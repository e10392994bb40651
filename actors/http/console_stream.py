"""A browser's live feed: ``GET /console/api/stream?user=&group=`` as Server-Sent Events — the
replies, echoed group messages and agent events of the browser's scenes, as the hub
(:mod:`~actors.http.console_hub`) queues them; a ``: keepalive`` comment every 15 s of silence.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from actors.http.console_context import ConsoleContext, bad
from actors.http.console_hub import Subscriber
from runtime.platforms.common import valid_unicode
from runtime.platforms.console import NAME_RULE

__all__ = ["KEEPALIVE_S", "sse_data", "stream_routes"]

KEEPALIVE_S = 15.0
"""Seconds of silence after which a stream sends a keep-alive comment."""


def sse_data(event: dict[str, Any]) -> bytes:
    """One SSE ``data:`` frame. Text that UTF-8 cannot carry (a lone surrogate) falls back to
    ``\\u`` escapes, so one odd event never ends a browser's stream."""
    data = json.dumps(event, ensure_ascii=False)
    if not valid_unicode(data):
        data = json.dumps(event)
    return f"data: {data}\n\n".encode()


def stream_routes(ctx: ConsoleContext) -> list[BaseRoute]:
    """``/console/api/stream`` over the console's context."""

    async def events(sub: Subscriber) -> AsyncIterator[bytes]:
        try:
            yield b": connected\n\n"
            while True:
                try:
                    event = await asyncio.wait_for(sub.queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                yield sse_data(event)
        finally:
            ctx.hub.unsubscribe(sub)

    async def stream(request: Request) -> Response:
        if not ctx.authorized(request):
            return ctx.denied()
        user = request.query_params.get("user", "")
        group = request.query_params.get("group") or None
        if not NAME_RULE.fullmatch(user) or (group is not None and not NAME_RULE.fullmatch(group)):
            return bad("user and group must be 1-32 letters, digits, '_', '.' or '-'")
        sub = ctx.hub.subscribe(user, group)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(sub), media_type="text/event-stream", headers=headers)

    return [Route("/console/api/stream", stream, methods=["GET"])]

"""What the web console sends a browser from the server's own stores: the conversation of a scene
read back from ``im_transcripts`` (``GET /console/api/history``, so a reload shows it again), and
the leak check every such text passes (docs/decisions.md#security-console-leak-check).

A history message (oldest first)::

    {"message_id": "console-1a2b3c4d-17", "direction": "inbound" | "outbound", "sender_id": "alice",
     "sender": "alice", "time": 1767000000000, "text": "hi",
     "segments": [{"type": "text", "data": {"text": "hi"}}, ...] | null}

``segments`` is the stored segment list when the row has media (the transcript keeps the segments
only then, :mod:`runtime.memory.transcripts`), else null and ``text`` is the message. A ``path``
medium (a file on the server, inlined as base64 only when the reply was delivered live) becomes
the text ``[<type>]``: history never reads the server's media directory.

Every string of a message and of a live agent event goes through
:func:`runtime.reply.leak.scan_text` with the policy of the configuration
(:meth:`~runtime.reply.leak.LeakPolicy.from_config`): a configured secret or a key format in a
stored message or a tool result reaches the browser as ``[redacted]``.

The route (:func:`history_routes`): ``GET /console/api/history?user=&bot=&scene=private|group&group=&limit=``
→ ``{"messages": [...]}``, the caller's own scene only — the private chat of ``user`` with ``bot``, or
the group the browser's stream follows (docs/decisions.md#security-console-own-scene); 503 when the
store is missing or cannot be read (the page says so and keeps working).
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from actors.http.console_context import NAMES, ConsoleContext, bad
from runtime.memory.transcripts import TranscriptEntry, TranscriptStore
from runtime.platforms.console import NAME_RULE
from runtime.reply.leak import LeakPolicy, scrub

__all__ = ["HISTORY_LIMIT", "HISTORY_MAX", "history_routes", "read_history", "scrub"]

log = logging.getLogger("sessionray.console")

HISTORY_LIMIT = 50
"""Messages of a scene the console shows after a reload when the page asks for no other number."""
HISTORY_MAX = 200
"""The most messages one ``/console/api/history`` call returns (``limit`` above it is a 400)."""


def _browser_segment(seg: Any) -> Any:
    """A stored segment as the browser may get it: ``path`` media become ``[<type>]`` text."""
    if not isinstance(seg, dict):
        return seg
    data = seg.get("data")
    media = data.get("media") if isinstance(data, dict) else None
    if isinstance(media, dict) and media.get("kind") == "path":
        return {"type": "text", "data": {"text": f"[{seg.get('type', 'file')}]"}}
    return seg


def history_message(entry: TranscriptEntry) -> dict[str, Any]:
    """One transcript row as a history message (shape in the module docstring), not yet scrubbed."""
    segments = None if entry.media is None else [_browser_segment(s) for s in entry.media]
    return {
        "message_id": entry.message_id,
        "direction": entry.direction,
        "sender_id": entry.sender_id,
        "sender": entry.sender_name or entry.sender_id,
        "time": entry.time,
        "text": entry.body,
        "segments": segments,
    }


async def read_history(
    transcripts: TranscriptStore,
    *,
    bot_id: str,
    scene_type: str,
    scene_id: str,
    limit: int,
    policy: LeakPolicy,
) -> list[dict[str, Any]]:
    """The last ``limit`` messages of the console scene ``(bot_id, scene_type, scene_id)``, oldest
    first, each passed through :func:`scrub` with ``policy``.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the store could not be read.
    """
    rows = await transcripts.scene("console", bot_id, scene_id, limit=limit, scene_type=scene_type)
    return [scrub(history_message(r), policy) for r in rows]


def _scene_query(request: Request, user: str) -> tuple[str, str, int] | Response:
    """``(scene_type, scene_id, limit)`` of a history query, or the 400 naming the bad field."""
    scene, group = request.query_params.get("scene", "private"), request.query_params.get("group", "")
    if scene not in ("private", "group"):
        return bad("`scene` must be private or group")
    if scene == "group" and not NAME_RULE.fullmatch(group):
        return bad(f"`group` {NAMES}")
    raw = request.query_params.get("limit", str(HISTORY_LIMIT))
    if not (raw.isdecimal() and 1 <= int(raw) <= HISTORY_MAX):
        return bad(f"`limit` must be a whole number from 1 to {HISTORY_MAX}")
    return scene, user if scene == "private" else group, int(raw)


def history_routes(ctx: ConsoleContext) -> list[BaseRoute]:
    """``/console/api/history`` over the console's context (module docstring)."""

    async def history(request: Request) -> Response:
        found = ctx.who(request)
        if isinstance(found, Response):
            return found
        user, bot = found
        if ctx.masters.unproven(request, user, bot):
            return ctx.masters.refusal(user, bot, "read its history")
        query = _scene_query(request, user)
        if isinstance(query, Response):
            return query
        scene_type, scene_id, limit = query
        if ctx.transcripts is None:
            return JSONResponse({"error": "no transcript store: history unavailable"}, status_code=503)
        try:
            messages = await read_history(
                ctx.transcripts, bot_id=bot, scene_type=scene_type, scene_id=scene_id, limit=limit,
                policy=ctx.leak_policy,
            )  # fmt: skip
        except Exception:  # the database is down or busy: the page says so and keeps working
            log.exception("console history of %s/%s unavailable", bot, user)
            return JSONResponse({"error": "history unavailable, try again"}, status_code=503)
        return JSONResponse({"messages": messages})

    return [Route("/console/api/history", history, methods=["GET"])]

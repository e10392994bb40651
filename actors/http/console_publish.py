"""What the hub fans out, posted in: ``POST /console/api/echo`` (a browser's group message, shown to
the other members watching the group), and the two internal endpoints (``X-Console-Api-Token``,
never a browser): ``POST /console/api/deliver`` (the console "platform API" DeliveryActors post
replies to; answers the reply's ``message_id``) and ``POST /console/api/events`` (a session's agent
events, leak-checked before they reach a browser: docs/decisions.md#security-console-leak-check).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from actors.http.console_context import ConsoleContext, bad
from actors.http.console_history import scrub
from actors.http.input_checks import InputError, check_text
from runtime.keys import SessionKeyError, parse_session_key
from runtime.platforms.console import NAME_RULE

__all__ = ["publish_routes"]


def publish_routes(ctx: ConsoleContext) -> list[BaseRoute]:
    """``/console/api/echo``, ``/console/api/deliver`` and ``/console/api/events`` over the context."""

    async def echo(request: Request) -> Response:
        if not ctx.authorized(request):
            return ctx.denied()
        body = await ctx.json_body(request)
        if isinstance(body, Response):
            return body
        user, group, text = body.get("user"), body.get("group_id"), body.get("text")
        if not (isinstance(user, str) and NAME_RULE.fullmatch(user) and isinstance(group, str)
                and NAME_RULE.fullmatch(group) and isinstance(text, str)):  # fmt: skip
            return bad("echo needs user, group_id (names) and text")
        try:
            check_text("text", text, max_chars=ctx.text_limit)
        except InputError as exc:
            return exc.response()
        event = {"type": "message", "scene_type": "group", "scene_id": group, "user": user, "text": text,
                 "message_id": str(body.get("message_id", ""))}  # fmt: skip
        return JSONResponse({"ok": True, "receivers": ctx.hub.publish("group", group, event)})

    async def deliver(request: Request) -> Response:
        if not ctx.internal(request):
            return ctx.internal_denied()
        body = await ctx.json_body(request)
        if isinstance(body, Response):
            return body
        scene_type, scene_id, segments = body.get("scene_type"), body.get("scene_id"), body.get("segments")
        if scene_type not in ("private", "group", "channel") or not isinstance(scene_id, str):
            return bad("deliver needs scene_type (private|group|channel) and scene_id")
        if not isinstance(segments, list):
            return bad("deliver needs a segments array")
        message_id = ctx.hub.next_message_id()
        event = {"type": "reply", "scene_type": scene_type, "scene_id": scene_id, "message_id": message_id,
                 "bot_id": body.get("bot_id"), "reply_to": body.get("reply_to"),
                 "segments": segments}  # fmt: skip
        ctx.hub.publish(scene_type, scene_id, event)
        return JSONResponse({"ok": True, "message_id": message_id})

    async def agent_events(request: Request) -> Response:
        if not ctx.internal(request):
            return ctx.internal_denied()
        body = await ctx.json_body(request)
        if isinstance(body, Response):
            return body
        if not isinstance(body.get("event"), dict):
            return bad("events needs {session_key, event: {...}}")
        try:
            key = parse_session_key(str(body.get("session_key", "")))
        except SessionKeyError as exc:
            return bad(str(exc))
        event = {"type": "agent", "session_key": str(key), "event": scrub(body["event"], ctx.leak_policy)}
        return JSONResponse({"ok": True, "receivers": ctx.hub.publish(key.scope, key.scene_id, event)})

    return [
        Route("/console/api/echo", echo, methods=["POST"]),
        Route("/console/api/deliver", deliver, methods=["POST"]),
        Route("/console/api/events", agent_events, methods=["POST"]),
    ]

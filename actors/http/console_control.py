"""The masters' controls: ``GET /console/api/sessions?user=`` (the live console sessions of the
bots the caller proved to be a master of) and ``POST /console/api/steer`` /
``POST /console/api/follow_up`` (``{"user", "session_key", "text"}`` → a ControlRequest sent with
the console user's name as ``sender_id``). Console sessions only (``console:*`` keys,
docs/decisions.md#security-console-scope); a name without its master token answers 403
(docs/decisions.md#security-console-master-proof).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from actors.http.admin_guard import error_status
from actors.http.console_context import NAMES, ConsoleContext, bad
from actors.http.input_checks import InputError, check_text, valid_session_key
from runtime.keys import SessionKeyError, parse_session_key
from runtime.platforms.console import NAME_RULE
from runtime.session.control import ControlError, ControlKind, ControlRequest

__all__ = ["control_routes"]


def _not_console(kind: str, platform: str) -> Response:
    return JSONResponse(
        {"error": f"the console may {kind} console sessions only (console:*), not {platform} "
                  f"ones: use the admin API (POST /admin/sessions/{{session_key}}/{kind} with "
                  "Authorization: Bearer <admin token>)"},
        status_code=403,
    )  # fmt: skip


def control_routes(ctx: ConsoleContext) -> list[BaseRoute]:
    """``/console/api/sessions`` and ``/console/api/{steer|follow_up}`` over the context (the
    ``{kind}`` route matches any name: mount it after the other ``/console/api`` routes)."""

    async def sessions(request: Request) -> Response:
        if not ctx.authorized(request):
            return ctx.denied()
        user = request.query_params.get("user", "")
        if not NAME_RULE.fullmatch(user):
            return bad(f"`user` {NAMES}")
        masters = ctx.masters
        mastered = {bot for bot in masters.names if masters.is_master(request, user, bot)}
        if not mastered:
            named = [bot for bot, names in masters.names.items() if user in names]
            if named:
                return masters.refusal(user, named[0], "see live sessions")
            return JSONResponse(
                {"error": f"{user!r} is not a master of a console bot; only masters see live sessions"},
                status_code=403,
            )
        infos: list[Any] = [
            i.model_dump(mode="json") if hasattr(i, "model_dump") else i for i in await ctx.runtime.sessions()
        ]
        mine = [
            i
            for i in infos
            if valid_session_key(key := i.get("session_key"), "console")
            and parse_session_key(key).bot_id in mastered
        ]
        return JSONResponse({"sessions": mine})

    async def control(request: Request) -> Response:
        if not ctx.authorized(request):
            return ctx.denied()
        kind = request.path_params["kind"]
        if kind not in (ControlKind.STEER, ControlKind.FOLLOW_UP):
            return JSONResponse({"error": "not found"}, status_code=404)
        body = await ctx.json_body(request)
        if isinstance(body, Response):
            return body
        user, key, text = body.get("user"), body.get("session_key"), body.get("text")
        if not (isinstance(user, str) and isinstance(key, str) and isinstance(text, str) and text.strip()):
            return bad(f"{kind} needs user, session_key and a non-empty text")
        if not NAME_RULE.fullmatch(user):
            return bad("`user` must be 1-32 letters, digits, '_', '.' or '-'")
        try:
            parsed = parse_session_key(key)
        except SessionKeyError as exc:
            return bad(f"`session_key`: {exc}")
        if parsed.platform != "console":
            return _not_console(kind, parsed.platform)
        if not ctx.masters.is_master(request, user, parsed.bot_id):
            return ctx.masters.refusal(user, parsed.bot_id, kind.replace("_", "-"))
        try:
            check_text("text", text, max_chars=ctx.text_limit)
        except InputError as exc:
            return exc.response()
        try:
            asked = ControlRequest(kind=kind, session_key=key, text=text, sender_id=user)
            reply = await ctx.runtime.control(asked)
        except ControlError as exc:  # not a master 403, no live session 404 (the admin API's table)
            status = error_status(exc)
            if status is None:
                raise
            return JSONResponse({"error": str(exc) or type(exc).__name__}, status_code=status)
        return JSONResponse({"ok": True, "outcome": reply.result})

    return [
        Route("/console/api/sessions", sessions, methods=["GET"]),
        Route("/console/api/{kind:str}", control, methods=["POST"]),  # steer | follow_up
    ]

"""Who the browser is: ``GET /console/api/info`` (the console bots, whether a browser token is
required, whether any bot has a master token set) and ``GET /console/api/me`` (``?user=&bot=`` →
``{"user", "bot", "master", "master_name"}``: a master by name and proof, or by name alone, so the
page can ask for the token; docs/decisions.md#security-console-master-proof).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from actors.http.console_context import ConsoleContext

__all__ = ["login_routes"]


def login_routes(ctx: ConsoleContext) -> list[BaseRoute]:
    """``/console/api/info`` and ``/console/api/me`` over the console's context."""

    async def info(request: Request) -> Response:
        master_token = ctx.masters.any_token_set()
        return JSONResponse(
            {"bots": ctx.bot_ids, "token_required": bool(ctx.token), "master_token": master_token}
        )

    async def me(request: Request) -> Response:
        found = ctx.who(request)
        if isinstance(found, Response):
            return found
        user, bot = found
        master = ctx.masters.is_master(request, user, bot)
        named = user in ctx.masters.names[bot]
        return JSONResponse({"user": user, "bot": bot, "master": master, "master_name": named})

    return [
        Route("/console/api/info", info, methods=["GET"]),
        Route("/console/api/me", me, methods=["GET"]),
    ]

"""The admin API's reads of the runtime: ``GET /admin/status`` (``runtime.status()``),
``GET /admin/sessions`` (``{"sessions": [SessionInfo, ...]}``) and
``GET /admin/sessions/{session_key}`` (the live ``SessionInfo``, else the latest stored epoch of a
passivated session, else 404). Mounted by :func:`actors.http.admin.admin_routes` behind its guard.
"""

from __future__ import annotations

from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from actors.http.admin_guard import Guard, checked_key, error, jsonable

__all__ = ["SESSION_PATH", "StoredView", "session_routes"]

SESSION_PATH = "/admin/sessions/{session_key:path}"
"""The path of one session (the control routes add ``/{kind}``)."""


class StoredView(Protocol):
    """The SQL view of sessions that are not live (``actors.http.admin``'s stored sessions)."""

    async def info(self, session_key: str) -> dict[str, Any] | None:
        """The latest stored epoch of ``session_key``, or None."""
        ...

    async def archive(self, session_key: str) -> str | None:
        """Archive the stored active epoch; the new ``session_id``, or None when there is none."""
        ...


def session_routes(guarded: Guard, runtime: Any, stored: StoredView) -> list[BaseRoute]:
    """The three reads, each wrapped by ``guarded`` (the admin token check and error mapping).

    Args:
        guarded: :func:`~actors.http.admin_guard.bearer_guard`'s wrapper.
        runtime: The session runtime handle (``status``, ``sessions``, ``session``).
        stored: Where a session that is not live is looked up.
    """

    async def status(request: Request) -> Response:
        return JSONResponse(jsonable(await runtime.status()))

    async def sessions(request: Request) -> Response:
        return JSONResponse({"sessions": jsonable(await runtime.sessions())})

    async def session(request: Request) -> Response:
        key = checked_key(request.path_params["session_key"])
        info = await runtime.session(key)
        if info is None:
            found = await stored.info(key)
            if found is None:
                return error(404, f"no live or stored session {key!r}")
            return JSONResponse(found)
        return JSONResponse(jsonable(info))

    return [
        Route("/admin/status", guarded(status), methods=["GET"]),
        Route("/admin/sessions", guarded(sessions), methods=["GET"]),
        Route(SESSION_PATH, guarded(session), methods=["GET"]),
    ]

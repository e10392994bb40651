"""The console page and its assets: ``GET /console`` (the single-page chat, plain HTML + JS, no
build step), ``GET /console/static/{name}`` (``console.js``, ``console.css``, ``favicon.svg``; any
other name 404) and ``GET /favicon.ico`` (the console's icon as ``image/svg+xml``). The files live
in ``actors/http/static/``; no token is needed to load them.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

__all__ = ["page_routes"]

_STATIC = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def _static(name: str) -> str:
    return resources.files("actors.http.static").joinpath(name).read_text(encoding="utf-8")


async def _page(request: Request) -> Response:
    return HTMLResponse(_static("console.html"))


async def _asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in _STATIC:
        return JSONResponse({"error": "not found"}, status_code=404)
    return Response(_static(name), media_type=_STATIC[name])


async def _favicon(request: Request) -> Response:
    return Response(_static("favicon.svg"), media_type=_STATIC["favicon.svg"])


def page_routes() -> list[BaseRoute]:
    """The page, its assets and the site icon (module docstring)."""
    return [
        Route("/console", _page, methods=["GET"]),
        Route("/console/static/{name}", _asset, methods=["GET"]),
        Route("/favicon.ico", _favicon, methods=["GET"]),
    ]

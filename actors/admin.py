"""The admin API: list and steer live sessions over HTTP, behind a bearer token (issue #8, item 5).

Routes (all under ``/admin``, JSON in and out)::

    GET  /admin/status                                  runtime.status()
    GET  /admin/sessions                                {"sessions": [SessionInfo, ...]}
    GET  /admin/sessions/{session_key}                  SessionInfo         404 unknown session
    POST /admin/sessions/{session_key}/steer            {"text", "sender_id"} → runtime.steer
    POST /admin/sessions/{session_key}/follow_up        {"text", "sender_id"} → runtime.follow_up
    POST /admin/sessions/{session_key}/abort            runtime.abort
    POST /admin/sessions/{session_key}/archive          runtime.archive

Authentication: ``Authorization: Bearer <token>`` where the token is the value of the environment
variable named by ``server.admin_token_env`` (default ``SESSIONRAY_ADMIN_TOKEN``), compared in
constant time. No or wrong token → 401 with ``WWW-Authenticate: Bearer``. When the variable is not
set on the server, the admin API is disabled: every call answers 401 and says so.

Errors: 400 malformed body (not JSON, missing/empty ``text`` or ``sender_id``, not strings);
403 ``NotMasterError`` (seed 002 decision 7: only a bot's masters may steer / follow up);
404 ``UnknownSessionError``; anything else 500 with the error's type and message (logged).
Errors are matched by class name so they may live in ``actors.runtime`` or ``runtime.memory``.
Session keys are never metric labels.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

__all__ = ["admin_routes", "jsonable"]

log = logging.getLogger("sessionray.admin")


def jsonable(value: Any) -> Any:
    """Turn a runtime answer (pydantic model, dataclass, list/dict of them, scalar) into JSON data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _status_for(exc: Exception) -> int | None:
    """Map the runtime's documented errors (by class name, so any module may define them) to HTTP."""
    for cls in type(exc).__mro__:
        if cls.__name__ == "NotMasterError":
            return 403
        if cls.__name__ in ("UnknownSessionError", "SessionKeyError"):
            return 404
        if cls.__name__ == "PermissionError":
            return 403
    return None


def admin_routes(runtime: Any, token_env: str | None) -> list[BaseRoute]:
    """Build the admin routes over ``runtime`` (an ``actors.runtime.SessionRuntime`` or anything with
    the same coroutine methods).

    Args:
        runtime: The session runtime handle.
        token_env: Name of the environment variable holding the bearer token (read per request, so
            a rotated token takes effect without a restart); None disables the admin API.
    """

    def check_token(request: Request) -> Response | None:
        expected = os.environ.get(token_env) if token_env else None
        challenge = {"WWW-Authenticate": 'Bearer realm="sessionray-admin"'}
        if not expected:
            return _error(
                401,
                f"admin API disabled: set {token_env or 'server.admin_token_env'} on the server",
                challenge,
            )
        got = request.headers.get("authorization", "")
        scheme, _, token = got.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return _error(401, "missing bearer token (Authorization: Bearer <token>)", challenge)
        if not hmac.compare_digest(token.strip().encode(), expected.encode()):
            return _error(401, "wrong bearer token", challenge)
        return None

    Handler = Callable[[Request], Awaitable[Response]]

    def guarded(handler: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            denied = check_token(request)
            if denied is not None:
                return denied
            try:
                return await handler(request)
            except Exception as exc:
                status = _status_for(exc)
                if status is None:
                    log.exception("admin %s %s failed", request.method, request.url.path)
                    return _error(500, f"{type(exc).__name__}: {exc}")
                return _error(status, str(exc) or type(exc).__name__)

        return endpoint

    async def status(request: Request) -> Response:
        return JSONResponse(jsonable(await runtime.status()))

    async def sessions(request: Request) -> Response:
        return JSONResponse({"sessions": jsonable(await runtime.sessions())})

    async def session(request: Request) -> Response:
        info = await runtime.session(request.path_params["session_key"])
        if info is None:
            return _error(404, f"no live or stored session {request.path_params['session_key']!r}")
        return JSONResponse(jsonable(info))

    def control(kind: str) -> Handler:
        async def endpoint(request: Request) -> Response:
            key = request.path_params["session_key"]
            try:
                body = json.loads(await request.body() or b"null")
            except ValueError:
                return _error(400, 'body must be JSON: {"text": ..., "sender_id": ...}')
            if not isinstance(body, dict):
                return _error(400, 'body must be a JSON object: {"text": ..., "sender_id": ...}')
            text, sender = body.get("text"), body.get("sender_id")
            if not isinstance(text, str) or not text.strip():
                return _error(400, "`text` must be a non-empty string")
            if not isinstance(sender, str | int) or isinstance(sender, bool) or not str(sender).strip():
                return _error(400, "`sender_id` must be a non-empty string")
            result = await getattr(runtime, kind)(key, text, str(sender))
            return JSONResponse(
                {"status": "ok", "kind": kind, "session_key": key, "result": jsonable(result)}
            )

        return endpoint

    def simple(kind: str) -> Handler:
        async def endpoint(request: Request) -> Response:
            key = request.path_params["session_key"]
            result = await getattr(runtime, kind)(key)
            return JSONResponse(
                {"status": "ok", "kind": kind, "session_key": key, "result": jsonable(result)}
            )

        return endpoint

    base = "/admin/sessions/{session_key:path}"
    return [
        Route("/admin/status", guarded(status), methods=["GET"]),
        Route("/admin/sessions", guarded(sessions), methods=["GET"]),
        Route(base + "/steer", guarded(control("steer")), methods=["POST"]),
        Route(base + "/follow_up", guarded(control("follow_up")), methods=["POST"]),
        Route(base + "/abort", guarded(simple("abort")), methods=["POST"]),
        Route(base + "/archive", guarded(simple("archive")), methods=["POST"]),
        Route(base, guarded(session), methods=["GET"]),
    ]

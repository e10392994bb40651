"""What every ``/admin`` route shares (docs/decisions.md#security-admin-api): the bearer-token
guard with its error mapping (:func:`bearer_guard`), the one table of refusal statuses
(:data:`ERROR_STATUS`, docs/decisions.md#typed-control-request; the web console answers with it
too), the session-key check of the ``/admin/sessions/{key}`` routes and the JSON form of runtime
answers. The route groups (:mod:`~actors.http.admin_sessions`, :mod:`~actors.http.admin_control`,
:mod:`~actors.http.models`, :mod:`~actors.http.deliveries`, :mod:`~actors.http.usage`) get the
guard from :func:`actors.http.admin.admin_routes`.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runtime.keys import SessionKeyError, parse_session_key
from runtime.memory.repository import UnknownSessionError as StoredSessionUnknown
from runtime.session.control import BadControlRequest, MalformedKeyError, NotMasterError, UnknownSessionError

__all__ = [
    "ERROR_STATUS",
    "Guard",
    "Handler",
    "bearer_guard",
    "checked_key",
    "error",
    "error_status",
    "jsonable",
]

log = logging.getLogger("sessionray.admin")

Handler = Callable[[Request], Awaitable[Response]]
"""A starlette endpoint."""
Guard = Callable[[Handler], Handler]
"""Wraps an endpoint in the token check and the error mapping."""


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


def error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """``{"error": message}`` with ``status``."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


ERROR_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (NotMasterError, 403),
    (UnknownSessionError, 404),
    (BadControlRequest, 400),
    (SessionKeyError, 400),
    (StoredSessionUnknown, 404),
    (PermissionError, 403),
)
"""The HTTP status of each refusal the runtime raises, first match wins (the one table: the admin
API and the web console answer these with ``{"error": message}``)."""


def error_status(exc: BaseException) -> int | None:
    """The HTTP status :data:`ERROR_STATUS` gives ``exc`` (by ``isinstance``), or None (a 500)."""
    return next((status for cls, status in ERROR_STATUS if isinstance(exc, cls)), None)


def checked_key(key: str) -> str:
    """``key`` when it is a well-formed session key.

    Raises:
        MalformedKeyError: it is not (the message names the part and the rule; answered 400).
    """
    try:
        parse_session_key(key)
    except SessionKeyError as exc:
        raise MalformedKeyError(str(exc)) from None
    return key


def _token_refusal(request: Request, token_env: str | None) -> Response | None:
    """The 401 of a request without the right bearer token, or None. The variable is read per
    request (a rotated token takes effect without a restart); unset, the admin API is disabled."""
    expected = os.environ.get(token_env) if token_env else None
    challenge = {"WWW-Authenticate": 'Bearer realm="sessionray-admin"'}
    if not expected:
        return error(
            401, f"admin API disabled: set {token_env or 'server.admin_token_env'} on the server", challenge
        )
    got = request.headers.get("authorization", "")
    scheme, _, token = got.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return error(401, "missing bearer token (Authorization: Bearer <token>)", challenge)
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        return error(401, "wrong bearer token", challenge)
    return None


def bearer_guard(token_env: str | None) -> Guard:
    """The wrapper of every admin endpoint: 401 without the token named by ``token_env``; a
    refusal in :data:`ERROR_STATUS` answered with its status; anything else 500 with the error's
    type and message (logged)."""

    def guarded(handler: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            denied = _token_refusal(request, token_env)
            if denied is not None:
                return denied
            try:
                return await handler(request)
            except Exception as exc:
                status = error_status(exc)
                if status is None:
                    log.exception("admin %s %s failed", request.method, request.url.path)
                    return error(500, f"{type(exc).__name__}: {exc}")
                return error(status, str(exc) or type(exc).__name__)

        return endpoint

    return guarded

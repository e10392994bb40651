"""The admin API: list and steer live sessions over HTTP, behind a bearer token
(docs/decisions.md#security-admin-api).

Routes (all under ``/admin``, JSON in and out)::

    GET  /admin/status                                  runtime.status()
    GET  /admin/sessions                                {"sessions": [SessionInfo, ...]}
    GET  /admin/models                                  {"models": [...]} (actors.http.models)
    GET  /admin/sessions/{session_key}                  SessionInfo (live), else the stored epoch
    POST /admin/sessions/{session_key}/steer            {"text", "sender_id"} → ControlRequest steer
    POST /admin/sessions/{session_key}/follow_up        {"text", "sender_id"} → ControlRequest follow_up
    POST /admin/sessions/{session_key}/abort            ControlRequest abort
    POST /admin/sessions/{session_key}/archive          ControlRequest archive, else archive in SQL
    GET  /admin/deliveries?state=failed|uncertain       replies that did not go out cleanly
    POST /admin/deliveries/{reply_id}/retry             queue one again (actors.http.deliveries)

A session that is not live (passivated) is read from SQL: ``GET`` answers its
latest epoch ``{"session_key", "live": false, "session_id", "status", "model", "created_at",
"updated_at", "messages", "epochs"}`` (times in Unix ms), and ``archive`` archives its active
epoch in SQL through the key's router shard (``runtime.archive_stored``: no message can activate
the session on the old epoch meanwhile; result: the new ``session_id``). A key with no
live session and no stored epoch stays 404. The SQL store is ``runtime.config.database.url``
(or the ``repository`` given to :func:`admin_routes`).

Authentication: ``Authorization: Bearer <token>`` where the token is the value of the environment
variable named by ``server.admin_token_env`` (default ``SESSIONRAY_ADMIN_TOKEN``), compared in
constant time. No or wrong token → 401 with ``WWW-Authenticate: Bearer``. When the variable is not
set on the server, the admin API is disabled: every call answers 401 and says so.

Errors: 400 malformed body (not JSON, nested too deeply to parse, missing/empty ``text`` or
``sender_id``, a ``text`` that is not a string or a ``sender_id`` that is neither a string nor an
integer (QQ numbers are often sent as JSON numbers), or not valid Unicode, e.g. a lone
surrogate); 413 ``text`` longer than
``server.max_text_chars`` (default 16000; docs/decisions.md#security-input-limits);
and the refusals of a :class:`~runtime.session.control.ControlRequest`, mapped in one table,
:data:`ERROR_STATUS` (docs/decisions.md#typed-control-request): 403 ``NotMasterError`` (only a
bot's masters may steer / follow up: docs/decisions.md#steer-masters-only), 404
``UnknownSessionError``, 400 ``BadControlRequest`` and its ``MalformedKeyError`` (a session key
that is not ``platform:bot_id:scope:scene_id``, on every ``/admin/sessions/{key}`` route, checked
before the runtime is asked); anything else 500 with
the error's type and message (logged). Every control route builds one ``ControlRequest`` and
calls ``runtime.control``; the answer is ``{"status": "ok", "kind", "session_key", "result"}``.
Session keys are never metric labels.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from actors.http.deliveries import deliveries_routes
from actors.http.input_checks import (
    InputError,
    check_text,
    check_unicode,
    loads_json,
    max_text_chars,
)
from runtime.keys import SessionKeyError, parse_session_key
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.memory.repository import UnknownSessionError as StoredSessionUnknown
from runtime.session.control import (
    BadControlRequest,
    ControlKind,
    ControlReply,
    ControlRequest,
    MalformedKeyError,
    NotMasterError,
    UnknownSessionError,
)

__all__ = ["ERROR_STATUS", "admin_routes", "error_status", "jsonable"]

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


def _checked_key(key: str) -> str:
    """``key`` when it is a well-formed session key.

    Raises:
        MalformedKeyError: it is not (the message names the part and the rule; answered 400).
    """
    try:
        parse_session_key(key)
    except SessionKeyError as exc:
        raise MalformedKeyError(str(exc)) from None
    return key


def _open_repository(url: str) -> ContextRepository:
    """A repository on its own small :class:`Database` (blocking: engine, ``create_tables``)."""
    db = Database(url, threads=1, max_overflow=0)  # rare admin reads: one connection
    db.create_tables()
    return ContextRepository(db)


class _StoredSessions:
    """The SQL view of sessions that are not live: the given :class:`ContextRepository`
    (``actors.inbound.ingress.build_app`` passes one on the ingress's :class:`Database`, so the ingress
    process holds one connection pool), else one made on first use from
    ``runtime.config.database.url`` (None when the runtime has no config)."""

    def __init__(self, runtime: Any, repository: ContextRepository | None) -> None:
        self._runtime = runtime
        self._repo = repository
        self._making = asyncio.Lock()

    async def repo(self) -> ContextRepository | None:
        """The repository; the first call without one builds it (engine + ``create_tables``) in a
        worker thread, never on the event loop (docs/decisions.md#memory-sql-off-loop)."""
        if self._repo is not None:
            return self._repo
        url = getattr(getattr(getattr(self._runtime, "config", None), "database", None), "url", None)
        if not url:
            return None
        async with self._making:  # one Database even when two first requests race
            if self._repo is None:
                self._repo = await asyncio.to_thread(_open_repository, str(url))
        return self._repo

    async def info(self, session_key: str) -> dict[str, Any] | None:
        """The latest stored epoch of ``session_key`` (shape in the module docstring), or None."""
        repo = await self.repo()
        if repo is None:
            return None
        epochs = await repo.list_sessions(session_key)
        if not epochs:
            return None
        latest = epochs[-1]
        return {
            "session_key": session_key,
            "live": False,
            "session_id": latest.session_id,
            "status": latest.status,
            "model": latest.model,
            "created_at": latest.created_at,
            "updated_at": latest.updated_at,
            "messages": await repo.count_messages(latest.session_id),
            "epochs": len(epochs),
        }

    async def archive(self, session_key: str) -> str | None:
        """Archive the epoch of a session that is not live; the new ``session_id``, or None when
        it has no active stored epoch.

        Through the runtime's ``archive_stored`` (``SessionRuntime``: the key's router shard
        archives while it holds the key, so no message activates the session on the old epoch
        in between).
        """
        try:
            return str(await self._runtime.archive_stored(session_key))
        except Exception as exc:
            if error_status(exc) == 404:
                return None
            raise


def admin_routes(
    runtime: Any, token_env: str | None, *, repository: ContextRepository | None = None
) -> list[BaseRoute]:
    """Build the admin routes over ``runtime`` (an ``actors.placement.runtime.SessionRuntime`` or anything
    with the same coroutine methods).

    Args:
        runtime: The session runtime handle (its ``config`` gives ``database.url`` and
            ``server.max_text_chars``, when it has one).
        token_env: Name of the environment variable holding the bearer token (read per request, so
            a rotated token takes effect without a restart); None disables the admin API.
        repository: SQL store of passivated sessions (``build_app``: on the ingress's Database;
            default: one on ``runtime.config.database.url`` with one connection, made in a worker
            thread on first use).
    """
    stored = _StoredSessions(runtime, repository)

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
                status = error_status(exc)
                if status is None:
                    log.exception("admin %s %s failed", request.method, request.url.path)
                    return _error(500, f"{type(exc).__name__}: {exc}")
                return _error(status, str(exc) or type(exc).__name__)

        return endpoint

    async def database() -> Database | None:
        repo = await stored.repo()
        return repo.db if repo is not None else None

    async def status(request: Request) -> Response:
        return JSONResponse(jsonable(await runtime.status()))

    async def sessions(request: Request) -> Response:
        return JSONResponse({"sessions": jsonable(await runtime.sessions())})

    async def models(request: Request) -> Response:
        from actors.http.models import models_payload

        repo = await stored.repo()
        config = getattr(runtime, "config", None)
        return JSONResponse(await models_payload(config, repo.db if repo is not None else None))

    async def session(request: Request) -> Response:
        key = _checked_key(request.path_params["session_key"])
        info = await runtime.session(key)
        if info is None:
            found = await stored.info(key)
            if found is None:
                return _error(404, f"no live or stored session {key!r}")
            return JSONResponse(found)
        return JSONResponse(jsonable(info))

    def answer(reply: ControlReply) -> Response:
        """``{"status": "ok", "kind", "session_key", "result"}``."""
        return JSONResponse({"status": "ok", **reply.model_dump(mode="json")})

    def control(kind: ControlKind) -> Handler:
        async def endpoint(request: Request) -> Response:
            key = _checked_key(request.path_params["session_key"])
            try:
                body = loads_json(await request.body() or b"null")
            except InputError as exc:
                return exc.response()
            except ValueError:
                return _error(400, 'body must be JSON: {"text": ..., "sender_id": ...}')
            if not isinstance(body, dict):
                return _error(400, 'body must be a JSON object: {"text": ..., "sender_id": ...}')
            text, sender = body.get("text"), body.get("sender_id")
            try:
                text = check_text("text", text, max_chars=max_text_chars(getattr(runtime, "config", None)))
            except InputError as exc:
                return exc.response()
            if not isinstance(sender, str | int) or isinstance(sender, bool) or not str(sender).strip():
                return _error(400, "`sender_id` must be a non-empty string")
            try:
                check_unicode("sender_id", str(sender))
            except InputError as exc:
                return exc.response()
            asked = ControlRequest(kind=kind, session_key=key, text=text, sender_id=str(sender))
            return answer(await runtime.control(asked))

        return endpoint

    def simple(kind: ControlKind) -> Handler:
        async def endpoint(request: Request) -> Response:
            key = _checked_key(request.path_params["session_key"])
            try:
                reply = await runtime.control(ControlRequest(kind=kind, session_key=key))
            except UnknownSessionError:
                # archive of a passivated session: its stored epoch, through its router shard
                if kind is not ControlKind.ARCHIVE:
                    raise
                new_id = await stored.archive(key)
                if new_id is None:
                    raise
                reply = ControlReply(kind=kind, session_key=key, result=new_id)
            return answer(reply)

        return endpoint

    base = "/admin/sessions/{session_key:path}"
    return [
        Route("/admin/status", guarded(status), methods=["GET"]),
        Route("/admin/sessions", guarded(sessions), methods=["GET"]),
        Route("/admin/models", guarded(models), methods=["GET"]),
        *deliveries_routes(guarded, database, runtime),
        *(
            Route(
                f"{base}/{kind}",
                guarded(control(kind) if kind.master_only else simple(kind)),
                methods=["POST"],
            )
            for kind in ControlKind
        ),
        Route(base, guarded(session), methods=["GET"]),
    ]

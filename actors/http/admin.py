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
    GET  /admin/usage?by=user|chat|bot|model&since=24h  the usage ledger grouped (actors.http.usage)

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
from typing import Any

from starlette.routing import BaseRoute

from actors.http.admin_control import control_routes
from actors.http.admin_guard import ERROR_STATUS, bearer_guard, error_status, jsonable
from actors.http.admin_sessions import session_routes
from actors.http.deliveries import deliveries_routes
from actors.http.models import models_routes
from actors.http.usage import usage_routes
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository

__all__ = ["ERROR_STATUS", "admin_routes", "error_status", "jsonable"]


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
    with the same coroutine methods): the route groups of the session reads
    (:mod:`~actors.http.admin_sessions`), the models (:mod:`~actors.http.models`), the deliveries
    (:mod:`~actors.http.deliveries`), the usage reports (:mod:`~actors.http.usage`) and the session
    controls (:mod:`~actors.http.admin_control`),
    each endpoint behind :func:`~actors.http.admin_guard.bearer_guard`.

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
    guarded = bearer_guard(token_env)

    async def database() -> Database | None:
        repo = await stored.repo()
        return repo.db if repo is not None else None

    return [
        *session_routes(guarded, runtime, stored),
        *models_routes(guarded, database, runtime),
        *deliveries_routes(guarded, database, runtime),
        *usage_routes(guarded, database),
        *control_routes(guarded, runtime, stored),
    ]

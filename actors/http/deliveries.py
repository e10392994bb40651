"""``/admin/deliveries``: the replies that did not go out cleanly, and the operator's retry
(docs/decisions.md#delivery-outage, docs/decisions.md#delivery-uncertain). Mounted by
:func:`actors.http.admin.admin_routes` behind the same bearer token as every ``/admin`` route.

Routes::

    GET  /admin/deliveries?state=failed|uncertain|queued|pending|sent&limit=50&offset=0
         → {"deliveries": [{"reply_id", "session_key", "platform", "bot_id", "state", "error",
            "steps": {"total", "done", "uncertain": [step, ...]}, "created_at", "updated_at",
            "age_s"}, ...], "counts": {"queued", "pending", "failed", "uncertain"},
            "next_offset": int | null}
         newest first; without ``state``: failed and uncertain ones.
    POST /admin/deliveries/{reply_id}/retry
         → {"status": "ok", "reply_id", "was": "failed" | "uncertain", "state": "queued"}
         a failed reply is queued again with a fresh age (it goes on from the step that failed);
         an uncertain one sends only its uncertain steps again. 404 unknown reply id, 409 a reply
         that is not failed or uncertain.

A reply id holds ``/`` and ``#`` (``{session_id}/{message_id}``): clients percent-encode it in
the path. After a retry the chat's delivery actor is notified (found by name, as the ingress does);
if it cannot be reached, its sweep (``delivery.sweep_s``) finds the queued row.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from actors.http.admin_guard import Guard, error
from actors.http.input_checks import query_int
from runtime.delivery import outbox
from runtime.delivery.tables import LEDGER_STATES
from runtime.memory.db import Database

__all__ = ["DEFAULT_STATES", "MAX_LIMIT", "deliveries_routes"]

log = logging.getLogger("sessionray.admin")

DEFAULT_STATES = ("failed", "uncertain")
"""What ``GET /admin/deliveries`` lists without ``state``."""
MAX_LIMIT = 500
"""Most replies one page holds."""


def _notify(runtime: Any, session_key: str) -> None:
    """Wake the chat's delivery actor (the runtime's pool, else found by name); on failure the
    actor's sweep finds the queued row."""
    try:
        pool = getattr(runtime, "delivery", None)
        if pool is None:
            from actors.delivery.pool import DeliveryPool

            config = getattr(runtime, "config", None)
            pool = DeliveryPool.lookup(config.runtime.delivery_actors)  # type: ignore[union-attr]
        pool.notify(session_key)
    except Exception as exc:
        log.warning(
            "retried delivery of %s: delivery actor not notified (%r); its sweep sends it", session_key, exc
        )


def deliveries_routes(
    guarded: Guard, database: Callable[[], Awaitable[Database | None]], runtime: Any
) -> list[BaseRoute]:
    """The two routes, each wrapped by ``guarded`` (the admin token check and error mapping).

    Args:
        guarded: :func:`~actors.http.admin_guard.bearer_guard`'s wrapper.
        database: Returns the SQL store (the ingress's Database), or None when there is none.
        runtime: The session runtime handle (``delivery`` pool or ``config`` for the notification).
    """

    async def listing(request: Request) -> Response:
        db = await database()
        if db is None:
            return error(503, "no database configured")
        state = request.query_params.get("state")
        if state is not None and state not in LEDGER_STATES:
            return error(400, f"`state` must be one of {', '.join(LEDGER_STATES)}")
        try:
            limit = query_int(request.query_params, "limit", 50, 1, MAX_LIMIT)
            offset = query_int(request.query_params, "offset", 0, 0, 10**9)
        except ValueError as exc:
            return error(400, str(exc))
        states = (state,) if state else DEFAULT_STATES
        rows = await db.run(lambda: outbox.list_replies(db, states, limit=limit + 1, offset=offset))
        counts = await db.run(lambda: outbox.counts(db))
        more = len(rows) > limit
        return JSONResponse(
            {
                "deliveries": [dataclasses.asdict(r) for r in rows[:limit]],
                "counts": counts,
                "next_offset": offset + limit if more else None,
            }
        )

    async def retry(request: Request) -> Response:
        db = await database()
        if db is None:
            return error(503, "no database configured")
        reply_id = request.path_params["reply_id"]
        try:
            was, session_key, _ = await db.run_write(lambda: outbox.retry(db, reply_id))
        except LookupError as exc:
            return error(404, str(exc))
        except outbox.NotRetryableError as exc:
            return error(409, str(exc))
        log.warning("operator retry of %s delivery %s (%s)", was, reply_id, session_key)
        _notify(runtime, session_key)
        return JSONResponse({"status": "ok", "reply_id": reply_id, "was": was, "state": "queued"})

    return [
        Route("/admin/deliveries", guarded(listing), methods=["GET"]),
        Route("/admin/deliveries/{reply_id:path}/retry", guarded(retry), methods=["POST"]),
    ]

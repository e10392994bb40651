"""``GET /admin/usage``: who spent what, from the usage ledger (docs/decisions.md#spend-reports).
Mounted by :func:`actors.http.admin.admin_routes` behind the same bearer token as every ``/admin``
route; ``sessionray usage`` (:mod:`actors.cli.usage`) prints it.

Route::

    GET /admin/usage?by=user|chat|bot|model&since=24h[&until=…][&chat=KEY][&user=ID][&bot=ID]
                    [&model=provider/id][&limit=100]
        → {"by", "since_ms", "until_ms": int | null,
           "filters": {"chat", "user", "bot", "model"} (null: any),
           "rows": [{"key", "calls", "input_tokens", "output_tokens", "cache_read_tokens",
                     "cache_write_tokens", "cost_usd"}, ...],
           "totals": {"calls", "input_tokens", "output_tokens", "cache_read_tokens",
                      "cache_write_tokens", "cost_usd"},
           "groups": int}

``by`` is required: ``user`` (the sender whose message started the turn), ``chat`` (the session
key), ``bot`` or ``model``. ``since`` (default ``24h``) and ``until`` (default: now and later) are a
span back from now (``30m``, ``24h``, ``7d``, ``2w``) or an ISO date / date-time (UTC without an
offset); the range is ``[since, until)``. Rows are most expensive first; at most ``limit`` (default
:data:`DEFAULT_LIMIT`, at most :data:`MAX_LIMIT`) of them. ``totals`` sum every matching call, the
rows cut by ``limit`` included; ``groups`` is how many rows there are without the limit. Tokens are
counts, ``cost_usd`` US dollars from ``models[].cost``.

Errors: 400 a missing or unknown ``by``, an unreadable ``since`` / ``until``, ``until`` not after
``since``, a ``chat`` that is not a session key, a ``limit`` out of range; 503 no database. The SQL
runs on the database's thread pool, never on the event loop (docs/decisions.md#memory-sql-off-loop).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from actors.http.admin_guard import Guard, checked_key, error
from actors.http.input_checks import query_int
from runtime.memory.db import Database
from runtime.spend.report import ReportBy, UsageFilters, parse_since, usage_report, usage_totals

__all__ = ["DEFAULT_LIMIT", "MAX_LIMIT", "REPORT_BY", "usage_routes"]

REPORT_BY: tuple[ReportBy, ...] = ("user", "chat", "bot", "model")
"""What ``by`` may be."""
DEFAULT_LIMIT = 100
"""Rows of one answer without ``limit``."""
MAX_LIMIT = 10_000
"""Most rows one answer holds."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Query:
    """A checked ``GET /admin/usage`` query."""

    by: ReportBy
    since_ms: int
    until_ms: int | None
    filters: UsageFilters
    limit: int


def _time(name: str, raw: str) -> int:
    try:
        return parse_since(raw)
    except ValueError as exc:
        raise ValueError(f"`{name}`: {exc}") from None


def parse_query(params: dict[str, str]) -> _Query:
    """The checked query of ``params`` (the request's query string).

    Raises:
        ValueError: a bad ``by``, ``since``, ``until``, ``chat`` (not a session key) or ``limit``
            (the message says which and why).
    """
    by = params.get("by")
    if by not in REPORT_BY:
        got = "missing" if by is None else f"{by!r}"
        raise ValueError(f"`by` must be one of {', '.join(REPORT_BY)} (got {got})")
    since_ms = _time("since", params.get("since", "24h"))
    until_raw = params.get("until")
    until_ms = None if until_raw is None else _time("until", until_raw)
    if until_ms is not None and until_ms <= since_ms:
        raise ValueError(f"`until` ({until_raw}) must be after `since` ({params.get('since', '24h')})")
    chat = params.get("chat") or None
    if chat is not None:
        try:
            checked_key(chat)
        except ValueError as exc:
            raise ValueError(f"`chat`: {exc}") from None
    filters = UsageFilters(
        chat=chat,
        user=params.get("user") or None,
        bot=params.get("bot") or None,
        model=params.get("model") or None,
    )
    limit = query_int(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    return _Query(cast(ReportBy, by), since_ms, until_ms, filters, limit)


async def _answer(db: Database, q: _Query) -> dict[str, Any]:
    """The JSON answer of ``q`` (shape in the module docstring)."""
    rows = await usage_report(db, q.by, q.since_ms, q.until_ms, limit=q.limit, **q.filters)
    totals, groups = await usage_totals(db, q.by, q.since_ms, q.until_ms, **q.filters)
    summed = totals.as_dict()
    del summed["key"]
    return {
        "by": q.by,
        "since_ms": q.since_ms,
        "until_ms": q.until_ms,
        "filters": q.filters,
        "rows": [r.as_dict() for r in rows],
        "totals": summed,
        "groups": groups,
    }


def usage_routes(guarded: Guard, database: Callable[[], Awaitable[Database | None]]) -> list[BaseRoute]:
    """The route, wrapped by ``guarded`` (the admin token check and error mapping).

    Args:
        guarded: :func:`~actors.http.admin_guard.bearer_guard`'s wrapper.
        database: Returns the SQL store holding ``llm_usage`` (the ingress's Database), or None.
    """

    async def usage(request: Request) -> Response:
        try:
            query = parse_query(dict(request.query_params))
        except ValueError as exc:
            return error(400, str(exc))
        db = await database()
        if db is None:
            return error(503, "no database configured")
        return JSONResponse(await _answer(db, query))

    return [Route("/admin/usage", guarded(usage), methods=["GET"])]

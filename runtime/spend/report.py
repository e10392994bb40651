"""Usage reports from the ledger: who spent what, grouped by user, chat, bot or model
(docs/decisions.md#spend-ledger, docs/decisions.md#spend-reports). The CLI (``sessionray usage``)
and the admin route (``GET /admin/usage``) print these rows.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, date, datetime
from typing import Any, Literal, TypedDict, Unpack

from sqlalchemy import func, select

from runtime.llm.types import now_ms
from runtime.memory.db import Database
from runtime.spend.ledger import USAGE_TABLE

__all__ = ["ReportBy", "UsageFilters", "UsageRow", "parse_since", "usage_report", "usage_totals"]

ReportBy = Literal["user", "chat", "bot", "model"]
"""What a report groups by (``user``: the sender id; ``chat``: the session key)."""

_COLUMN = {"user": "user_id", "chat": "session_key", "bot": "bot_id", "model": "model"}
"""The ledger column of each :data:`ReportBy` (and of each :class:`UsageFilters` key)."""
_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


class UsageFilters(TypedDict, total=False):
    """Which calls a report counts: only those of one ``chat`` (session key), ``user`` (sender
    id), ``bot`` or ``model``; a key left out or ``None``: any."""

    chat: str | None
    user: str | None
    bot: str | None
    model: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class UsageRow:
    """One group of a report: its ``key``, the number of LLM ``calls``, tokens by kind, USD."""

    key: str
    calls: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_usd: float

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON-able fields (``sessionray usage --json``)."""
        return dataclasses.asdict(self)


def parse_since(text: str, *, now: int | None = None) -> int:
    """The Unix ms that ``text`` names: a span back from ``now`` (ms; default the clock) —
    ``30m``, ``24h``, ``7d``, ``2w``, ``90s`` — or an ISO date / date-time (``2026-12-01``,
    ``2026-12-01T08:00``, ``2026-12-01T08:00+08:00``; without an offset it is UTC).

    Raises:
        ValueError: anything else, with the accepted forms in the message.
    """
    s = text.strip()
    m = re.fullmatch(r"(\d+)\s*([smhdw])", s)
    if m is not None:
        return (now_ms() if now is None else now) - int(m.group(1)) * _UNITS_MS[m.group(2)]
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", s):
            d = date.fromisoformat(s)
            t = datetime(d.year, d.month, d.day, tzinfo=UTC)
        else:
            t = datetime.fromisoformat(s)
            t = t if t.tzinfo is not None else t.replace(tzinfo=UTC)
    except ValueError:
        raise ValueError(
            f"cannot read the time {text!r}: use a span back from now (30m, 24h, 7d, 2w) or an ISO "
            "date / date-time (2026-12-01, 2026-12-01T08:00+08:00; UTC without an offset)"
        ) from None
    return int(t.timestamp() * 1000)


def _key(by: str) -> Any:
    """The ledger column a report groups ``by``.

    Raises:
        ValueError: ``by`` is not one of :data:`ReportBy`.
    """
    if by not in _COLUMN:
        raise ValueError(f"cannot group usage by {by!r}: use one of {', '.join(_COLUMN)}")
    return USAGE_TABLE.c[_COLUMN[by]]


def _within(q: Any, since_ms: int, until_ms: int | None, filters: UsageFilters) -> Any:
    """``q`` limited to the calls in ``[since_ms, until_ms)`` that match ``filters``.

    Raises:
        TypeError: a filter that is not one of :class:`UsageFilters`' keys.
    """
    unknown = sorted(set(filters) - set(_COLUMN))
    if unknown:
        raise TypeError(f"unknown usage filter(s) {', '.join(unknown)}: use {', '.join(_COLUMN)}")
    c = USAGE_TABLE.c
    q = q.where(c.ts >= since_ms)
    if until_ms is not None:
        q = q.where(c.ts < until_ms)
    for name, value in filters.items():
        if value is not None:
            q = q.where(c[_COLUMN[name]] == value)
    return q


def _sums() -> list[Any]:
    """The token sums (input, output, cache read, cache write) and the USD sum, in that order."""
    c = USAGE_TABLE.c
    names = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost_usd")
    return [func.sum(c[n]) for n in names]


def _row(key: str, r: Any) -> UsageRow:
    """A :class:`UsageRow` from ``(calls, input, output, cache read, cache write, usd)`` (SQL sums of
    no rows are NULL: 0)."""
    calls, inp, out, cache_read, cache_write = (int(v or 0) for v in r[:5])
    return UsageRow(key, calls, inp, out, cache_read, cache_write, float(r[5] or 0.0))


async def usage_report(
    db: Database,
    by: ReportBy,
    since_ms: int,
    until_ms: int | None = None,
    *,
    limit: int | None = None,
    **filters: Unpack[UsageFilters],
) -> list[UsageRow]:
    """The ledger's calls in ``[since_ms, until_ms)`` (Unix ms; ``None``: up to now and later)
    grouped by ``by``, most expensive first (then most tokens, then key), optionally only those
    matching ``filters`` (:class:`UsageFilters`), at most ``limit`` rows. SQL runs on ``db``'s
    thread pool.

    Raises:
        ValueError: an unknown ``by`` or ``limit`` < 1.
        TypeError: an unknown filter.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    key = _key(by)
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be ≥ 1, got {limit}")
    sums = _sums()
    tokens = sums[0] + sums[1] + sums[2] + sums[3]
    q = _within(select(key, func.count(), *sums), since_ms, until_ms, filters)
    q = q.group_by(key).order_by(sums[4].desc(), tokens.desc(), key)
    if limit is not None:
        q = q.limit(limit)

    def run() -> list[UsageRow]:
        with db.connection() as conn:
            rows = conn.execute(q).all()
        return [_row(str(r[0]), r[1:]) for r in rows]

    return await db.run(run)


async def usage_totals(
    db: Database,
    by: ReportBy,
    since_ms: int,
    until_ms: int | None = None,
    **filters: Unpack[UsageFilters],
) -> tuple[UsageRow, int]:
    """The sums over every call :func:`usage_report` would group with the same arguments (its
    ``limit`` aside), as one :class:`UsageRow` keyed ``"total"`` (all zero when there is none), and
    the number of groups ``by`` makes of them — more than a limited report's rows when the limit cut
    it. SQL runs on ``db``'s thread pool.

    Raises:
        ValueError: an unknown ``by``.
        TypeError: an unknown filter.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    groups = func.count(_key(by).distinct())
    q = _within(select(func.count(), *_sums(), groups), since_ms, until_ms, filters)

    def run() -> tuple[UsageRow, int]:
        with db.connection() as conn:
            r = conn.execute(q).one()
        return _row("total", r), int(r[6] or 0)

    return await db.run(run)

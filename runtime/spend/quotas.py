"""Quotas: what a turn's owner may still spend, summed from the shared usage ledger
(docs/decisions.md#spend-quotas).

* **Scopes** — ``user`` (one sender, with one bot: user ids are the bot platform's), ``chat`` (one
  session key), ``bot`` (one bot id), ``global`` (every call). Each ``spend.quotas`` entry limits
  one scope per window in tokens (input + output + cache read + cache write) and/or USD; an entry
  with ``id`` replaces that scope's default for that window for that one id.
* **Windows** — the current ``hour``, ``day`` or ``month`` in ``spend.timezone``
  (:func:`window_bounds`); a window resets at its start, so "today" begins at local midnight.
* **Checked before a turn**, never during one: :meth:`Quotas.check` sums the ledger's rows of the
  window from SQL — the counters every host shares, never a process's own — with one indexed range
  sum per limit; a limit is exceeded once its sum reached it (``used >= limit``; in USD within
  :data:`USD_EPSILON`). Masters are
  exempt. A turn that started below its quota finishes, so the overshoot is at most what the
  turns already running spend (the ledger row of each call is committed before its turn ends:
  :mod:`runtime.spend.ledger`, so consecutive turns see each other's spend exactly).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import func, select

from runtime.config.spend import QuotaConfig, QuotaScope, QuotaWindow, SpendConfig
from runtime.llm.attribution import CallAttribution
from runtime.llm.types import now_ms
from runtime.memory.db import Database
from runtime.spend.ledger import USAGE_TABLE

__all__ = [
    "SCOPES",
    "USD_EPSILON",
    "Limit",
    "QuotaStatus",
    "Quotas",
    "WindowUse",
    "sum_usage",
    "window_bounds",
]

SCOPES: tuple[QuotaScope, ...] = ("user", "chat", "bot", "global")
USD_EPSILON = 1e-9
"""USD below which a sum counts as having reached its limit: float sums of many small costs land
a hair under it (``0.1`` ten times is ``0.9999999999999999``)."""


def window_bounds(window: QuotaWindow, at_ms: int, tz: ZoneInfo) -> tuple[int, int]:
    """``(start_ms, end_ms)`` of the ``window`` holding ``at_ms`` (Unix ms) in zone ``tz``: the
    hour, the local day from midnight, or the month from the 1st (end exclusive)."""
    now = datetime.fromtimestamp(at_ms / 1000, tz)
    if window == "hour":
        # the local clock's minutes and seconds back from ``at_ms`` (not a local-time round trip,
        # which lands outside the hour in zones with a 30- or 45-minute offset or DST shift)
        start_ms = at_ms - (now.minute * 60_000 + now.second * 1000 + now.microsecond // 1000)
        return start_ms, start_ms + 3_600_000
    if window == "day":
        d = now.date()
        nxt = d + timedelta(days=1)
        return _ms(datetime(d.year, d.month, d.day, tzinfo=tz)), _ms(
            datetime(nxt.year, nxt.month, nxt.day, tzinfo=tz)
        )
    y, m = now.year, now.month
    ny, nm = (y + 1, 1) if m == 12 else (y, m + 1)
    return _ms(datetime(y, m, 1, tzinfo=tz)), _ms(datetime(ny, nm, 1, tzinfo=tz))


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


@dataclasses.dataclass(frozen=True, slots=True)
class Limit:
    """One limit that applies to an owner: ``scope``'s ``key`` (the user id, session key, bot id;
    ``""`` for ``global``), its ``window``, and ``tokens`` / ``usd`` (``None``: not limited)."""

    scope: QuotaScope
    key: str
    window: QuotaWindow
    tokens: int | None
    usd: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class WindowUse:
    """What ``scope``/``key`` used in one window (tokens; USD), with the window's bounds (ms)."""

    scope: QuotaScope
    key: str
    window: QuotaWindow
    start_ms: int
    reset_ms: int
    tokens: int
    usd: float


@dataclasses.dataclass(frozen=True, slots=True)
class QuotaStatus:
    """A :class:`Limit` against what its window used so far."""

    limit: Limit
    use: WindowUse

    @property
    def exceeded(self) -> bool:
        """The use reached the limit in tokens or in USD."""
        lim, use = self.limit, self.use
        return (lim.tokens is not None and use.tokens >= lim.tokens) or (
            lim.usd is not None and use.usd >= lim.usd - USD_EPSILON
        )

    @property
    def tokens_left(self) -> int | None:
        """Tokens still allowed (≥ 0), ``None`` without a token limit."""
        return None if self.limit.tokens is None else max(0, self.limit.tokens - self.use.tokens)

    @property
    def usd_left(self) -> float | None:
        """USD still allowed (≥ 0), ``None`` without a USD limit."""
        if self.limit.usd is None:
            return None
        left = self.limit.usd - self.use.usd
        return left if left > USD_EPSILON else 0.0


def _where(scope: QuotaScope, owner: CallAttribution) -> tuple[str, list[Any]]:
    """The key and the row filter of ``scope`` for ``owner``."""
    c = USAGE_TABLE.c
    if scope == "user":
        return owner.user_id, [c.bot_id == owner.bot_id, c.user_id == owner.user_id]
    if scope == "chat":
        return owner.session_key, [c.session_key == owner.session_key]
    if scope == "bot":
        return owner.bot_id, [c.bot_id == owner.bot_id]
    return "", []


_TOKENS = (
    USAGE_TABLE.c.input_tokens
    + USAGE_TABLE.c.output_tokens
    + USAGE_TABLE.c.cache_read_tokens
    + USAGE_TABLE.c.cache_write_tokens
)


def sum_usage(
    db: Database,
    owner: CallAttribution,
    wanted: Sequence[tuple[QuotaScope, QuotaWindow]],
    at_ms: int,
    tz: ZoneInfo,
) -> list[WindowUse]:
    """What ``owner``'s ``scope`` used in the ``window`` holding ``at_ms``, for each pair of
    ``wanted``: one indexed range sum each, in one read transaction. Blocking: call through
    ``db.run``.

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    out: list[WindowUse] = []
    with db.connection() as conn:
        for scope, window in wanted:
            key, where = _where(scope, owner)
            start, end = window_bounds(window, at_ms, tz)
            q = select(
                func.coalesce(func.sum(_TOKENS), 0), func.coalesce(func.sum(USAGE_TABLE.c.cost_usd), 0.0)
            )
            tokens, usd = conn.execute(
                q.where(*where, USAGE_TABLE.c.ts >= start, USAGE_TABLE.c.ts < end)
            ).one()
            out.append(WindowUse(scope, key, window, start, end, int(tokens), float(usd)))
    return out


class Quotas:
    """The quota rules of ``spend`` (:class:`runtime.config.spend.SpendConfig`)."""

    def __init__(self, config: SpendConfig) -> None:
        self.config = config
        self.tz = ZoneInfo(config.timezone)
        self._defaults: dict[tuple[str, str], QuotaConfig] = {}
        self._overrides: dict[tuple[str, str, str], QuotaConfig] = {}
        for q in config.quotas:
            if q.id is None:
                self._defaults[(q.scope, q.window)] = q
            else:
                self._overrides[(q.scope, q.window, q.id)] = q

    @property
    def enabled(self) -> bool:
        """Some quota is configured."""
        return bool(self.config.quotas)

    def limits(self, owner: CallAttribution, scopes: Sequence[QuotaScope] = SCOPES) -> list[Limit]:
        """The limits on ``owner`` in ``scopes`` (an ``id`` override replaces its scope's default
        of the same window; a lifted one is left out), in scope then window order."""
        out: list[Limit] = []
        windows: tuple[QuotaWindow, ...] = ("hour", "day", "month")
        for scope in scopes:
            key, _ = _where(scope, owner)
            for window in windows:
                q = self._overrides.get((scope, window, key)) or self._defaults.get((scope, window))
                if q is not None and (q.tokens is not None or q.usd is not None):
                    out.append(Limit(scope, key, window, q.tokens, q.usd))
        return out

    async def status(
        self,
        db: Database,
        owner: CallAttribution,
        scopes: Sequence[QuotaScope] = SCOPES,
        at_ms: int | None = None,
    ) -> list[QuotaStatus]:
        """Every limit on ``owner`` in ``scopes`` with its window's use so far (SQL on ``db``'s
        thread pool)."""
        limits = self.limits(owner, scopes)
        if not limits:
            return []
        at = now_ms() if at_ms is None else at_ms
        wanted = [(lim.scope, lim.window) for lim in limits]
        uses = await db.run(lambda: sum_usage(db, owner, wanted, at, self.tz))
        return [QuotaStatus(lim, use) for lim, use in zip(limits, uses, strict=True)]

    async def check(
        self, db: Database, owner: CallAttribution, at_ms: int | None = None
    ) -> QuotaStatus | None:
        """The first exceeded quota of ``owner`` (a turn must not start), or ``None`` (masters and
        owners without limits: no SQL at all).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed.
        """
        if owner.master or not self.enabled:
            return None
        for st in await self.status(db, owner, at_ms=at_ms):
            if st.exceeded:
                return st
        return None

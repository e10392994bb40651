"""What a session's turns spend: the owner every LLM call of a turn is attributed to, the usage
ledger of the session host's process, and the quota check before a turn starts
(docs/decisions.md#spend-ledger, docs/decisions.md#spend-quotas).

:class:`SessionSpend` is built by :class:`~runtime.session.core.SessionCore` from its repository's
database and ``SessionSetup.features.quotas``; building it installs the usage ledger on that
database (:func:`runtime.spend.ledger.install_ledger`), so the process records every call in the
same SQL the quota check reads. A refused turn is answered with ``spend.exceeded_text`` like a chat
command's answer (before, and never shown to, the agent; empty: silence) and counted in
``sessionray_quota_exceeded_total{scope}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from runtime import metrics
from runtime.config.spend import QuotaScope, QuotaWindow
from runtime.llm.attribution import CallAttribution
from runtime.llm.types import now_ms
from runtime.memory.db import Database
from runtime.reply.segments import Reply
from runtime.spend.ledger import UsageCarrier, carried_usage, install_ledger
from runtime.spend.quotas import Limit, Quotas, QuotaStatus, sum_usage

__all__ = ["SessionSpend", "amount_text", "turn_owner"]

SHOWN_WINDOWS: tuple[QuotaWindow, ...] = ("day", "month")
"""Windows ``/usage`` shows for a scope without any limit."""


def turn_owner(turn: Any, session_id: str) -> CallAttribution:
    """The owner of a turn's calls: its bot, chat, sender (the user whose message started it),
    session, turn (the inbound message id) and whether that sender is a master."""
    sender = turn.sender or {}
    roles = sender.get("roles") or ()
    roles = {roles} if isinstance(roles, str) else {str(r) for r in roles}
    return CallAttribution(
        bot_id=str(turn.bot_id),
        session_key=str(turn.session_key),
        user_id=str(sender.get("id") or ""),
        session_id=session_id,
        turn_id=str(turn.message_id),
        reason="turn",
        master="master" in roles,
    )


def amount_text(tokens: int | None, usd: float | None) -> str:
    """``"1,200 tokens and $0.0042"`` (either part left out when ``None``)."""
    parts = ([f"{tokens:,} tokens"] if tokens is not None else []) + (
        [f"${usd:.4f}"] if usd is not None else []
    )
    return " and ".join(parts)


class SessionSpend:
    """The spend side of one session (module docstring).

    Args:
        db: The session's database (``None``: nothing recorded, no quota).
        quotas: The quota rules (``None``: no quota).
    """

    def __init__(self, db: Database | None, quotas: Quotas | None) -> None:
        self.db = db
        self.quotas = quotas
        if db is not None:
            install_ledger(db)

    @classmethod
    def of(cls, repo: Any, features: Any) -> SessionSpend:
        """From a ``ContextRepository`` (its ``db``) and ``AgentFeatures`` (its ``quotas``)."""
        db = getattr(repo, "db", None)
        return cls(db if isinstance(db, Database) else None, getattr(features, "quotas", None))

    def carried(self, stage: Callable[[Callable[[Any], None]], None]) -> AbstractContextManager[Any]:
        """For one turn: its own calls' usage rows go to ``stage`` (the session writer's
        ``stage_write``: the turn's next write carries them) until the block ends
        (:class:`runtime.spend.ledger.UsageCarrier`; docs/decisions.md#spend-ledger). No
        database: nothing is recorded, nothing carried."""
        if self.db is None:
            return contextlib.nullcontext()
        return carried_usage(UsageCarrier(self.db, stage))

    async def refusal(self, owner: CallAttribution) -> Reply | None:
        """``None`` when a turn of ``owner`` may start; else the reply that refuses it (empty when
        ``spend.exceeded_text`` is null or empty). Masters always start.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database failed (the turn fails and is retried
                like any turn whose SQL failed).
        """
        if self.db is None or self.quotas is None:
            return None
        st = await self.quotas.check(self.db, owner)
        if st is None:
            return None
        metrics.QUOTA_EXCEEDED.inc(scope=st.limit.scope)
        template = self.quotas.config.exceeded_text
        if not template:
            return Reply(segments=[])
        reset = datetime.fromtimestamp(st.use.reset_ms / 1000, self.quotas.tz)
        fields = {
            "scope": st.limit.scope,
            "window": st.limit.window,
            "used": amount_text(
                st.use.tokens if st.limit.tokens else None, st.use.usd if st.limit.usd else None
            ),
            "limit": amount_text(st.limit.tokens, st.limit.usd),
            "reset": f"{reset:%Y-%m-%d %H:%M} {self.quotas.config.timezone}",
        }
        return Reply.of_text(template.format(**fields))  # its fields were checked at config load

    async def usage(self, owner: CallAttribution, scopes: Sequence[QuotaScope]) -> list[QuotaStatus]:
        """For ``/usage``: each limit on ``owner`` in ``scopes`` with its use so far; a scope
        without limits shows its use in :data:`SHOWN_WINDOWS` (limits ``None``), but for
        ``global``, shown only under a quota (its use alone would sum the whole ledger)."""
        if self.db is None:
            return []
        quotas = self.quotas
        limited = await quotas.status(self.db, owner, scopes) if quotas is not None else []
        bare = [s for s in scopes if s != "global" and not any(st.limit.scope == s for st in limited)]
        if not bare:
            return limited
        db, tz = self.db, quotas.tz if quotas is not None else _utc()
        wanted = [(s, w) for s in bare for w in SHOWN_WINDOWS]
        at = now_ms()
        uses = await db.run(lambda: sum_usage(db, owner, wanted, at, tz))
        free = [QuotaStatus(Limit(u.scope, u.key, u.window, None, None), u) for u in uses]
        order = {s: i for i, s in enumerate(scopes)}
        return sorted([*limited, *free], key=lambda st: order[st.limit.scope])


def _utc() -> Any:
    from zoneinfo import ZoneInfo

    return ZoneInfo("UTC")

"""``spend:`` of ``sessionray.yaml``: quotas on what the bot's LLM calls use, per user, chat, bot and
for the whole deployment (docs/decisions.md#spend-quotas).

Part of :mod:`runtime.config`. The rules that read it live in :mod:`runtime.spend.quotas`.
"""

from __future__ import annotations

from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from runtime.config.ai import _Closed

__all__ = ["DEFAULT_EXCEEDED_TEXT", "QuotaConfig", "QuotaScope", "QuotaWindow", "SpendConfig"]

QuotaScope = Literal["user", "chat", "bot", "global"]
"""Whose spend a quota sums: one user (of one bot), one chat (session key), one bot, everything."""
QuotaWindow = Literal["hour", "day", "month"]
"""The calendar window a quota sums over; it resets at its start in ``spend.timezone``."""

DEFAULT_EXCEEDED_TEXT = "You have used up the {scope} quota for this {window} ({used}). It resets at {reset}."
"""The built-in reply to a turn refused by a quota (``str.format`` fields: ``scope``, ``window``,
``used``, ``limit``, ``reset``)."""


class QuotaConfig(_Closed):
    """One ``spend.quotas`` entry: a limit in tokens and/or USD on one scope per window.

    Without ``id`` it is the default of its scope (every user / chat / bot gets it; ``global`` has
    no id). With ``id`` it overrides the default of that scope and window for that one user id,
    chat (session key ``platform:bot:scope:id``) or bot id; an override without ``tokens`` and
    ``usd`` lifts the limit for it.
    """

    scope: QuotaScope
    window: QuotaWindow = "day"
    id: str | None = None
    """The user id, chat session key or bot id this entry is for (``None``: the scope's default)."""
    tokens: int | None = Field(None, gt=0, strict=True)
    """Most tokens (input + output + cache read + cache write) in one window."""
    usd: float | None = Field(None, gt=0, allow_inf_nan=False)
    """Most USD (``models[].cost`` prices) in one window."""

    @field_validator("id", mode="before")
    @classmethod
    def _id_str(cls, v: object) -> object:
        return str(v) if isinstance(v, int) else v

    @model_validator(mode="after")
    def _one_limit(self) -> QuotaConfig:
        if self.scope == "global" and self.id is not None:
            raise ValueError("a `global` quota has no `id`")
        parts = (self.id or "").split(":", 3)
        if self.scope == "chat" and self.id is not None and (len(parts) != 4 or not all(parts)):
            # a bare group number would never match a chat's rows: refused, not ignored in silence
            raise ValueError(
                f"a `chat` quota's `id` is the chat's session key (platform:bot:scope:id, e.g. "
                f"onebot11:10001:group:12345), not {self.id!r}"
            )
        if self.id is None and self.tokens is None and self.usd is None:
            raise ValueError("a quota needs `tokens` and/or `usd` (only an `id` override may lift the limit)")
        return self


class SpendConfig(_Closed):
    """``spend``: quotas and the reply of a turn they refuse (docs/decisions.md#spend-quotas)."""

    timezone: str = "UTC"
    """IANA zone (``Asia/Shanghai``) whose hour, midnight and first of the month start the windows."""
    exceeded_text: str | None = DEFAULT_EXCEEDED_TEXT
    """Reply to a refused turn (``str.format`` fields ``scope``, ``window``, ``used``, ``limit``,
    ``reset``); ``null`` or empty: refuse in silence."""
    quotas: list[QuotaConfig] = Field(default_factory=list)
    """Checked before every turn of a non-master sender; none: no limit."""

    @field_validator("timezone")
    @classmethod
    def _zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r} (an IANA name such as UTC or Asia/Shanghai)") from None
        return v

    @field_validator("exceeded_text")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v:
            try:
                v.format(scope="user", window="day", used="1 tokens", limit="1 tokens", reset="now")
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"cannot fill the template ({type(exc).__name__}: {exc}); its fields are "
                    "{scope}, {window}, {used}, {limit}, {reset} (write {{ and }} for braces)"
                ) from None
        return v

    @model_validator(mode="after")
    def _no_twins(self) -> SpendConfig:
        seen: set[tuple[str, str, str | None]] = set()
        for q in self.quotas:
            key = (q.scope, q.window, q.id)
            if key in seen:
                who = f" id {q.id}" if q.id is not None else ""
                raise ValueError(f"[quotas] two `{q.scope}`{who} quotas for the same window `{q.window}`")
            seen.add(key)
        return self

"""``bots[].rate_limit`` of ``sessionray.yaml`` and the rate notation it uses (``"5/min"``).

Part of :mod:`runtime.config` (re-exported there). The limiter itself is
:mod:`runtime.platforms.policy`; this module only validates the configuration, so a typo such as
``"5/minn"`` fails at load time naming the key.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import field_validator

from runtime.config.ai import _Closed

__all__ = ["DEFAULT_LIMIT_NOTICE", "RateLimitConfig", "parse_rate"]

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
_UNITS |= {"d": 86400.0, "day": 86400.0}
_RATE = re.compile(r"\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+?)s?\s*")

DEFAULT_LIMIT_NOTICE = "You are sending messages too fast; please wait {retry_after_s} s."
"""The cooldown notice of ``on_limit: notice`` (``{retry_after_s}``: whole seconds until the next
message is answered)."""


def parse_rate(text: str) -> tuple[int, float]:
    """``"<n>/<period>"`` → ``(n, period in seconds)``: ``"5/min"`` → ``(5, 60.0)``,
    ``"30/10s"`` → ``(30, 10.0)``, ``"100/day"`` → ``(100, 86400.0)``.

    Units: ``s``/``sec``/``second``, ``min``/``minute``, ``h``/``hour``, ``d``/``day`` (a plural
    ``s`` is accepted), optionally preceded by a number of them.

    Raises:
        ValueError: another form, ``n`` of 0, or a period of 0.
    """
    m = _RATE.fullmatch(text.lower())
    if m is None or m.group(3) not in _UNITS:
        raise ValueError(f"rate must look like '5/min' or '30/10s' (units s, min, h, day), got {text!r}")
    count = int(m.group(1))
    period = float(m.group(2) or 1) * _UNITS[m.group(3)]
    if count < 1 or period <= 0:
        raise ValueError(f"rate needs at least 1 message per a positive period, got {text!r}")
    return count, period


class RateLimitConfig(_Closed):
    """``bots[].rate_limit``: token buckets per user and per group
    (docs/decisions.md#platform-inbound-policy).

    A bucket holds up to ``n`` messages and refills ``n`` per period, evenly (``"5/min"``: a burst
    of 5, then one message every 12 s). Only messages the bot would answer (triggered) take a
    token; masters are never limited.
    """

    per_user: str | None = None
    """Rate per sender across all of the bot's chats, e.g. ``"5/min"`` (None: no limit)."""
    per_group: str | None = None
    """Rate per group/channel, all members together, e.g. ``"30/min"`` (None: no limit)."""
    on_limit: Literal["drop", "notice"] = "drop"
    """``drop``: a limited message is stored but silently not answered; ``notice``: also reply once
    per cooldown window with :attr:`notice`."""
    notice: str = DEFAULT_LIMIT_NOTICE
    """The cooldown notice text (``str.format`` field ``{retry_after_s}``)."""

    @field_validator("per_user", "per_group")
    @classmethod
    def _rate(cls, v: str | None) -> str | None:
        if v is not None:
            parse_rate(v)
        return v

    @field_validator("notice")
    @classmethod
    def _notice(cls, v: str) -> str:
        try:
            v.format(retry_after_s=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"notice may use only the field {{retry_after_s}}: {exc!r}") from None
        return v

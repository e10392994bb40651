"""Per-bot inbound policy: allow/deny lists and per-user / per-group rate limits
(docs/decisions.md#platform-inbound-policy).

The ingress asks :meth:`InboundPolicy.check` for every decoded, storable message, after the
codec and before routing. A message that is not ``passed`` is still stored in the transcript
(seen, not answered), counted as ``sessionray_inbound_messages_total{outcome="denied" |
"rate_limited"}`` and never routed to a session. Rules, in order:

1. a master of the bot (``Sender.roles`` has ``master``) always passes;
2. ``deny_users`` / ``deny_groups`` deny; non-empty ``allow_users`` / ``allow_groups`` deny
   whoever is not listed (group lists apply to group and channel scenes only; ids compare as
   strings) — untriggered messages included;
3. an untriggered message passes (it takes no token: the bot would not answer it anyway);
4. the message takes a token from its sender's bucket (``per_user``) and, in a group or channel,
   from the scene's bucket (``per_group``) — both or neither; an empty one makes it
   ``rate_limited``. With ``on_limit: notice`` the first limited message of a cooldown window
   (until that bucket has a token again) carries the notice text; later ones in the window do not.

State is in memory, per ingress process (several Serve replicas each limit on their own).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from runtime.config.policy import RateLimitConfig, parse_rate
from runtime.platforms.base import InboundMessage
from runtime.platforms.common import MASTER_ROLE, setting

__all__ = ["InboundPolicy", "TokenBucket", "Verdict"]


@dataclass(frozen=True)
class Verdict:
    """What the policy says about one inbound message."""

    outcome: Literal["passed", "denied", "rate_limited"]
    notice: str | None = None
    """For ``rate_limited`` under ``on_limit: notice``: the cooldown notice to send, once per
    cooldown window; None otherwise."""


PASSED = Verdict("passed")
DENIED = Verdict("denied")


class TokenBucket:
    """Token buckets by key: ``capacity`` tokens, refilled continuously at ``capacity / period_s``
    per second.

    Ours rather than a library's: the rate-limit package the Python ecosystem keeps (``limits``)
    offers fixed and moving *windows*, not a bucket that refills evenly and allows a burst, and a
    few lines of arithmetic need no dependency. Keys whose bucket has refilled completely are
    forgotten every 1,024 spends (a full bucket is the state of an unseen key), so memory follows
    the active senders. Not thread-safe: :class:`InboundPolicy` serialises its calls.

    Args:
        capacity: Tokens a full bucket holds (≥ 1): the burst.
        period_s: Seconds to refill a bucket from empty (> 0).
    """

    def __init__(self, capacity: int, period_s: float) -> None:
        self.capacity = float(capacity)
        self.period_s = period_s
        self.per_s = capacity / period_s
        self._state: dict[str, tuple[float, float]] = {}  # key → (tokens, at monotonic s)
        self._spends = 0

    def tokens(self, key: str, now: float) -> float:
        """Tokens ``key`` has at ``now`` (monotonic seconds)."""
        tokens, at = self._state.get(key, (self.capacity, now))
        return min(self.capacity, tokens + (now - at) * self.per_s)

    def wait_s(self, key: str, now: float) -> float:
        """Seconds until ``key`` has one token (0 when it has one now)."""
        return max(0.0, (1.0 - self.tokens(key, now)) / self.per_s)

    def take(self, key: str, now: float) -> None:
        """Spend one token of ``key`` (the caller checked :meth:`wait_s` is 0)."""
        self._state[key] = (self.tokens(key, now) - 1.0, now)
        self._spends += 1
        if self._spends >= 1024:
            self._spends = 0
            self._state = {k: v for k, v in self._state.items() if self.tokens(k, now) < self.capacity}


def _ids(bot: Any, name: str) -> frozenset[str]:
    return frozenset(str(x) for x in setting(bot, name, None) or ())


class InboundPolicy:
    """One bot's inbound policy (see the module docstring).

    Args:
        allow_groups, deny_groups, allow_users, deny_users: Id lists (strings).
        rate_limit: ``bots[].rate_limit`` (None: no limit).
        clock: Monotonic seconds (tests pass a fake clock).
    """

    def __init__(
        self,
        *,
        allow_groups: frozenset[str] = frozenset(),
        deny_groups: frozenset[str] = frozenset(),
        allow_users: frozenset[str] = frozenset(),
        deny_users: frozenset[str] = frozenset(),
        rate_limit: RateLimitConfig | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.allow_groups, self.deny_groups = allow_groups, deny_groups
        self.allow_users, self.deny_users = allow_users, deny_users
        self.rate_limit = rate_limit
        self.clock = clock
        rl = rate_limit
        self.per_user = TokenBucket(*parse_rate(rl.per_user)) if rl and rl.per_user else None
        self.per_group = TokenBucket(*parse_rate(rl.per_group)) if rl and rl.per_group else None
        self._cooldown: dict[str, float] = {}  # bucket key → monotonic s the notice window ends
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, bot: Any) -> InboundPolicy | None:
        """The policy of a ``bots:`` entry, or None when it sets no list and no limit."""
        lists = {n: _ids(bot, n) for n in ("allow_groups", "deny_groups", "allow_users", "deny_users")}
        rate_limit = setting(bot, "rate_limit", None)
        if not any(lists.values()) and rate_limit is None:
            return None
        return cls(**lists, rate_limit=rate_limit)

    def check(self, msg: InboundMessage) -> Verdict:
        """Judge one message (rules in the module docstring); takes its tokens when it passes."""
        if MASTER_ROLE in msg.sender.roles:
            return PASSED
        user, group = msg.sender.id, msg.scene_id if msg.scene_type != "private" else None
        if user in self.deny_users or (self.allow_users and user not in self.allow_users):
            return DENIED
        if group is not None and (
            group in self.deny_groups or (self.allow_groups and group not in self.allow_groups)
        ):
            return DENIED
        if not msg.triggered:
            return PASSED
        limits = [
            (bucket, f"{kind}:{key}")
            for bucket, kind, key in ((self.per_user, "user", user), (self.per_group, "group", group))
            if bucket is not None and key is not None
        ]
        now = self.clock()
        with self._lock:
            waits = [(bucket.wait_s(key, now), key) for bucket, key in limits]
            wait, key = max(waits, default=(0.0, ""))
            if wait <= 0:
                for bucket, bucket_key in limits:
                    bucket.take(bucket_key, now)
                return PASSED
            return Verdict("rate_limited", self._notice(key, now, wait))

    def _notice(self, key: str, now: float, wait: float) -> str | None:
        """The cooldown notice when ``key`` has none pending in this window (then a window of
        ``wait`` seconds starts), else None."""
        rl = self.rate_limit
        if rl is None or rl.on_limit != "notice" or self._cooldown.get(key, -math.inf) > now:
            return None
        self._cooldown = {k: t for k, t in self._cooldown.items() if t > now}
        self._cooldown[key] = now + wait
        return rl.notice.format(retry_after_s=max(1, math.ceil(wait)))

"""Granting provider leases: concurrency, requests and tokens per minute, fair between chats,
masters first, slowed by 429s (docs/decisions.md#spend-provider-limits).

:class:`LeaseBook` is the whole policy of one provider alias as a plain state machine on an
injected clock (seconds, monotonic): callers :meth:`~LeaseBook.enqueue` waiters, ask
:meth:`~LeaseBook.grant_ready` which of them may go now, :meth:`~LeaseBook.expire` the ones that
waited past ``max_wait_s`` and :meth:`~LeaseBook.release` leases when the call ended;
:meth:`~LeaseBook.next_wake_s` says when asking again can change anything. It never sleeps and
never touches asyncio or Ray: :mod:`runtime.spend.granter` waits with it in one process, the actor
of ``actors/limits`` for the whole cluster.

Rules:

* **Rates are token buckets.** ``rpm`` and ``tpm`` are buckets refilled continuously at
  ``limit / 60`` per second, the way providers document theirs; a bucket holds ``limit`` minus
  :data:`HEADROOM_S` of refill, so the time between a grant here and the request's arrival at the
  provider (a Ray hop, an HTTP connect) never lets the provider see more than its limit.
* **A request's token cost** is its estimate (the caller's ``est_tokens``: input, see
  ``providers.transport``) plus the average extra the provider reported over estimates so far
  (output, estimation error); at release the bucket is corrected by what the provider reported.
  A request larger than the whole bucket waits until the bucket is full, then goes (it could never
  go otherwise). A reported usage is read as at least 0, and one call's correction leaves the
  bucket between minus one bucket and full, so a misreported count (a provider's ``10**15``)
  holds the alias back for at most two bucket refills and never lets extra requests through.
* **Fair between chats.** Waiters queue per session key; keys take turns (round robin), one
  request each, so a chat with forty waiting calls does not pass one with one. Masters' keys are
  served before everyone else's. The head of the order is served first: when it does not fit,
  nobody passes it (a large request is never starved by small ones).
* **A 429 slows everyone.** The effective rates (and the concurrency when no rate is set) drop to
  half, down to :data:`MIN_FACTOR`, and the buckets are emptied; they climb back linearly to the
  configured values over :data:`RECOVERY_S`. A ``Retry-After`` holds every grant back until it
  passed.
* **Leases end.** A lease not released within :data:`LEASE_TTL_S` (its holder died) is reclaimed.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from collections.abc import Callable

from runtime.config import ProviderLimits

__all__ = ["HEADROOM_S", "LEASE_TTL_S", "MIN_FACTOR", "RECOVERY_S", "Grant", "LeaseBook"]

HEADROOM_S = 1.0
"""Seconds of refill kept out of each bucket (grant-to-arrival delay it absorbs)."""
MIN_FACTOR = 1 / 16
"""Lowest share of the configured rates that repeated 429s bring a provider down to."""
RECOVERY_S = 60.0
"""Seconds after the last 429 until the rates are back to their configured values."""
LEASE_TTL_S = 900.0
"""A lease not released after this many seconds is reclaimed (a call's timeout is 600 s)."""
EXTRA_WEIGHT = 0.3
"""Weight of the newest observation in the running average of reported-minus-estimated tokens."""


@dataclasses.dataclass(slots=True)
class _Bucket:
    """A token bucket: ``level`` of ``capacity`` units, refilled at ``rate`` units per second."""

    capacity: float
    rate: float
    level: float
    at: float

    @classmethod
    def per_minute(cls, limit: int, now: float) -> _Bucket:
        rate = limit / 60.0
        capacity = max(limit - rate * HEADROOM_S, 1.0)
        return cls(capacity, rate, capacity, now)

    def refill(self, now: float, factor: float) -> None:
        if now > self.at:
            self.level = min(self.capacity, self.level + self.rate * factor * (now - self.at))
        self.at = max(self.at, now)

    def need_s(self, cost: float, factor: float) -> float:
        """Seconds until ``cost`` fits (0: now)."""
        missing = min(cost, self.capacity) - self.level
        return 0.0 if missing <= 1e-9 else missing / (self.rate * factor)


@dataclasses.dataclass(slots=True)
class _Waiter:
    ticket: int
    session_key: str
    master: bool
    est_tokens: int
    since: float


@dataclasses.dataclass(frozen=True, slots=True)
class Grant:
    """A waiter that may go: its ``ticket``, the ``lease_id`` to release, the ``tokens`` reserved
    and the seconds it ``waited``."""

    ticket: int
    lease_id: str
    tokens: int
    waited_s: float


@dataclasses.dataclass(slots=True)
class _Held:
    tokens: int
    est_tokens: int
    since: float


class LeaseBook:
    """The leases of one provider alias (see the module docstring).

    Args:
        limits: ``ai.providers.<alias>.limits``.
        clock: Monotonic seconds (tests inject their own).
    """

    def __init__(self, limits: ProviderLimits, clock: Callable[[], float]) -> None:
        self.clock = clock
        now = clock()
        self.limits = limits
        self._rpm = _Bucket.per_minute(limits.rpm, now) if limits.rpm else None
        self._tpm = _Bucket.per_minute(limits.tpm, now) if limits.tpm else None
        self._queues: dict[bool, collections.OrderedDict[str, collections.deque[_Waiter]]] = {
            True: collections.OrderedDict(),
            False: collections.OrderedDict(),
        }
        self._held: dict[str, _Held] = {}
        self._ids = itertools.count(1)
        self._slow_factor = 1.0
        self._slowed_at = -math.inf
        self.blocked_until = -math.inf
        self.extra_tokens = 0.0
        """Running average of reported minus estimated tokens per request (≥ 0)."""

    def reconfigure(self, limits: ProviderLimits) -> None:
        """Take new limits (a restarted serve with an edited config); waiters and leases stay, the
        buckets keep what they hold up to their new size."""
        if limits == self.limits:
            return
        now = self.clock()
        self.limits = limits
        for name, limit in (("_rpm", limits.rpm), ("_tpm", limits.tpm)):
            old: _Bucket | None = getattr(self, name)
            new = _Bucket.per_minute(limit, now) if limit else None
            if new is not None and old is not None:
                old.refill(now, self.factor(now))
                new.level = min(old.level, new.capacity)
            setattr(self, name, new)

    # ------------------------------------------------------------------ state
    def factor(self, now: float) -> float:
        """The share of the configured limits in force at ``now`` (1: no recent 429)."""
        if self._slow_factor >= 1.0:
            return 1.0
        climbed = (now - self._slowed_at) / RECOVERY_S
        if climbed >= 1.0:
            self._slow_factor = 1.0
            return 1.0
        return self._slow_factor + (1.0 - self._slow_factor) * max(climbed, 0.0)

    def concurrency(self, now: float) -> int | None:
        """Leases allowed at once now (``None``: unlimited); 429s lower it only when no rate is set."""
        conc = self.limits.concurrency
        if conc is None or self._rpm is not None or self._tpm is not None:
            return conc
        return max(1, math.floor(conc * self.factor(now)))

    def depth(self) -> int:
        """Waiters queued (all chats)."""
        return sum(len(q) for queues in self._queues.values() for q in queues.values())

    def in_flight(self) -> int:
        """Leases granted and not yet released."""
        return len(self._held)

    # ------------------------------------------------------------------ waiting
    def enqueue(self, session_key: str, master: bool, est_tokens: int) -> int:
        """Queue one request of ``session_key`` (``""``: no chat) costing about ``est_tokens``;
        returns its ticket."""
        ticket = next(self._ids)
        waiter = _Waiter(ticket, session_key, master, max(int(est_tokens), 0), self.clock())
        self._queues[master].setdefault(session_key, collections.deque()).append(waiter)
        return ticket

    def cancel(self, ticket: int) -> bool:
        """Drop a queued waiter (its caller gave up); ``False`` when it is not queued."""
        for queues in self._queues.values():
            for key, queue in queues.items():
                for waiter in queue:
                    if waiter.ticket == ticket:
                        queue.remove(waiter)
                        if not queue:
                            del queues[key]
                        return True
        return False

    def expire(self) -> list[int]:
        """Remove and return the tickets that waited longer than ``max_wait_s``."""
        limit = self.clock() - self.limits.max_wait_s
        gone: list[int] = []
        for queues in self._queues.values():
            for key in list(queues):
                queue = queues[key]
                while queue and queue[0].since <= limit:
                    gone.append(queue.popleft().ticket)
                if not queue:
                    del queues[key]
        return gone

    def _head(self) -> tuple[bool, str] | None:
        for master in (True, False):
            queues = self._queues[master]
            if queues:
                return master, next(iter(queues))
        return None

    def _cost(self, waiter: _Waiter) -> int:
        return waiter.est_tokens + math.ceil(self.extra_tokens)

    def _wait_s(self, cost: int, now: float) -> float | None:
        """Seconds until a request of ``cost`` tokens fits (0: now; ``None``: only a release helps)."""
        self._reclaim(now)
        conc = self.concurrency(now)
        if conc is not None and len(self._held) >= conc:
            return None
        factor = self.factor(now)
        wait = max(self.blocked_until - now, 0.0)
        for bucket, units in ((self._rpm, 1), (self._tpm, cost)):
            if bucket is not None:
                bucket.refill(now, factor)
                wait = max(wait, bucket.need_s(units, factor))
        return wait

    def grant_ready(self) -> list[Grant]:
        """Grant, in fair order, every waiter that fits now; stops at the first that does not."""
        now = self.clock()
        grants: list[Grant] = []
        while (head := self._head()) is not None:
            master, key = head
            queues = self._queues[master]
            waiter = queues[key][0]
            cost = self._cost(waiter)
            if self._wait_s(cost, now) != 0.0:
                break
            queues[key].popleft()
            queues.move_to_end(key)  # round robin: this chat goes to the back
            if not queues[key]:
                del queues[key]
            for bucket, units in ((self._rpm, 1), (self._tpm, cost)):
                if bucket is not None:
                    bucket.level -= units
            lease_id = f"L{waiter.ticket}"
            self._held[lease_id] = _Held(cost, waiter.est_tokens, now)
            grants.append(Grant(waiter.ticket, lease_id, cost, now - waiter.since))
        return grants

    def next_wake_s(self) -> float | None:
        """Seconds until :meth:`grant_ready` or :meth:`expire` can change something without a
        release (``None``: nothing waits, or only a release can help)."""
        now = self.clock()
        waits: list[float] = []
        head = self._head()
        if head is not None:
            need = self._wait_s(self._cost(self._queues[head[0]][head[1]][0]), now)
            if need is not None:
                waits.append(need)
            if self._held:
                waits.append(max(min(h.since for h in self._held.values()) + LEASE_TTL_S - now, 0.0))
        oldest = [q[0].since for queues in self._queues.values() for q in queues.values()]
        if oldest:
            waits.append(max(min(oldest) + self.limits.max_wait_s - now, 0.0))
        return min(waits) if waits else None

    # ------------------------------------------------------------------ ending
    def release(
        self, lease_id: str, used_tokens: int | None, status: int | None, retry_after_s: float | None
    ) -> bool:
        """End a lease (``False``: unknown or reclaimed already). ``used_tokens``: the provider's
        reported total (corrects the token bucket; ``None`` keeps the reservation); ``status``
        429 slows the alias down, ``retry_after_s`` blocks grants until it passed."""
        held = self._held.pop(lease_id, None)
        now = self.clock()
        if status == 429:
            self.slow_down(now, retry_after_s)
        if held is None:
            return False
        if used_tokens is not None:
            used = max(int(used_tokens), 0)
            extra = float(max(used - held.est_tokens, 0))
            if self._tpm is not None:
                tpm = self._tpm
                tpm.refill(now, self.factor(now))
                # one call's debt is at most one bucket, and a misreport never overfills it
                tpm.level = min(max(tpm.level - (used - held.tokens), -tpm.capacity), tpm.capacity)
                extra = min(extra, tpm.capacity)
            self.extra_tokens += EXTRA_WEIGHT * (extra - self.extra_tokens)
        return True

    def slow_down(self, now: float, retry_after_s: float | None) -> None:
        """A 429: halve the effective limits (down to :data:`MIN_FACTOR`), empty the buckets, and
        hold every grant until ``retry_after_s`` (seconds) passed."""
        factor = self.factor(now)
        for bucket in (self._rpm, self._tpm):
            if bucket is not None:
                bucket.refill(now, factor)
                bucket.level = min(bucket.level, 0.0)
        self._slow_factor = max(factor / 2.0, MIN_FACTOR)
        self._slowed_at = now
        if retry_after_s is not None and retry_after_s > 0:
            self.blocked_until = max(self.blocked_until, now + retry_after_s)

    def _reclaim(self, now: float) -> None:
        for lease_id in [k for k, h in self._held.items() if now - h.since >= LEASE_TTL_S]:
            del self._held[lease_id]

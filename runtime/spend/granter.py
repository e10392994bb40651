"""Waiting for provider leases in one event loop: :class:`AsyncGranter` wraps a
:class:`~runtime.spend.limits.LeaseBook` with futures and one timer, and :class:`LocalProviderGate`
is the :class:`~runtime.llm.limits.ProviderGate` of one process over them
(docs/decisions.md#spend-provider-limits).

The cluster-wide gate (``actors/limits``) runs an :class:`AsyncGranter` per alias inside one Ray
actor, and falls back to a :class:`LocalProviderGate` when that actor does not answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from runtime import metrics
from runtime.config import ProviderConfig, ProviderLimits
from runtime.llm.attribution import CallAttribution
from runtime.llm.limits import Lease, ProviderBusyError
from runtime.spend.limits import Grant, LeaseBook

__all__ = ["WAKE_SLACK_S", "AsyncGranter", "LocalProviderGate", "gated_limits"]

WAKE_SLACK_S = 0.001
"""Added to each timer so the bucket has surely refilled when it fires (seconds)."""


def gated_limits(providers: Mapping[str, ProviderConfig]) -> dict[str, ProviderLimits]:
    """The limits of every alias that has any (``concurrency``, ``rpm`` or ``tpm`` set)."""
    return {a: p.limits for a, p in providers.items() if p.limits is not None and p.limits.limited()}


class AsyncGranter:
    """Leases of one alias for callers in the running event loop.

    Args:
        alias: The provider alias (metrics label).
        limits: Its ``limits``.
        clock: Monotonic seconds.
    """

    def __init__(
        self, alias: str, limits: ProviderLimits, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.alias = alias
        self.book = LeaseBook(limits, clock)
        self._waiting: dict[int, asyncio.Future[Grant]] = {}
        self._timer: asyncio.TimerHandle | None = None

    async def acquire(self, session_key: str, master: bool, est_tokens: int) -> Grant:
        """Wait for a lease of about ``est_tokens`` tokens for ``session_key``.

        Raises:
            ProviderBusyError: none within ``limits.max_wait_s``.
        """
        ticket = self.book.enqueue(session_key, master, est_tokens)
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiting[ticket] = future
        self._pump()
        try:
            return await future
        except asyncio.CancelledError:
            self._waiting.pop(ticket, None)
            granted = future.done() and not future.cancelled() and future.exception() is None
            if not self.book.cancel(ticket) and granted:  # granted while we were cancelled
                self.release(future.result().lease_id, None, None, None)
            raise

    def release(
        self, lease_id: str, used_tokens: int | None, status: int | None, retry_after_s: float | None
    ) -> None:
        """End a lease (see :meth:`LeaseBook.release`) and grant whoever fits now."""
        if status == 429:
            metrics.PROVIDER_429S.inc(alias=self.alias)
        self.book.release(lease_id, used_tokens, status, retry_after_s)
        self._pump()

    def _pump(self) -> None:
        for grant in self.book.grant_ready():
            future = self._waiting.pop(grant.ticket, None)
            metrics.PROVIDER_LEASE_WAIT.observe(grant.waited_s, alias=self.alias)
            if future is None or future.done():
                self.book.release(grant.lease_id, None, None, None)  # its caller is gone
            else:
                future.set_result(grant)
        for ticket in self.book.expire():
            future = self._waiting.pop(ticket, None)
            metrics.PROVIDER_REFUSALS.inc(alias=self.alias)
            if future is not None and not future.done():
                future.set_exception(ProviderBusyError(self.alias, self.book.limits.max_wait_s))
        metrics.PROVIDER_QUEUE_DEPTH.set(self.book.depth(), alias=self.alias)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        wake = self.book.next_wake_s()
        if wake is not None:
            self._timer = asyncio.get_running_loop().call_later(wake + WAKE_SLACK_S, self._pump)


class LocalProviderGate:
    """A :class:`~runtime.llm.limits.ProviderGate` that grants within this process only.

    Args:
        providers: ``ai.providers``; aliases with ``limits`` are gated.
        clock: Monotonic seconds.
    """

    def __init__(
        self, providers: Mapping[str, ProviderConfig], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._granters = {a: AsyncGranter(a, lim, clock) for a, lim in gated_limits(providers).items()}

    def governs(self, alias: str) -> bool:
        return alias in self._granters

    async def acquire(self, alias: str, attribution: CallAttribution | None, est_tokens: int) -> Lease:
        a = attribution or CallAttribution()
        grant = await self._granters[alias].acquire(a.session_key, a.master, est_tokens)
        return Lease(alias, grant.lease_id, grant.tokens, grant.waited_s)

    async def release(
        self, lease: Lease, used_tokens: int | None, status: int | None, retry_after_s: float | None
    ) -> None:
        granter = self._granters.get(lease.alias)
        if granter is not None:
            granter.release(lease.lease_id, used_tokens, status, retry_after_s)

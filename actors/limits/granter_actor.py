"""The lease granter of one provider alias for the whole cluster: a detached, named, async Ray
actor (``sessionray-limits-<alias>`` in namespace ``sessionray``) around a
:class:`runtime.spend.granter.AsyncGranter` (docs/decisions.md#spend-provider-limits).

Every session host reaches the same actor by name (``get_if_exists``), so a restarted serve finds
it with its buckets and its 429 slow-down intact. A crashed actor is restarted by Ray with fresh
buckets and no leases (the leases of calls then in flight are forgotten: the provider may briefly
see more than the limit, never less than the configured rate is granted); a caller that cannot
reach it falls back to its own process's granter (:mod:`actors.limits.cluster_gate`).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import ray

from runtime.config import ProviderLimits
from runtime.spend.granter import AsyncGranter

__all__ = ["MAX_WAITERS", "NAMESPACE", "ProviderLimitsActor", "limits_actor_name"]

NAMESPACE = "sessionray"
MAX_WAITERS = 100_000
"""Calls the actor serves at once (``max_concurrency``, set where it is created): every waiting
``acquire`` holds one, and ``release`` must never queue behind them."""


def limits_actor_name(alias: str) -> str:
    """The actor's name for ``alias`` (one per alias in the cluster)."""
    return f"sessionray-limits-{alias}"


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class ProviderLimitsActor:
    """Grants the leases of ``alias``; methods mirror :class:`~runtime.spend.granter.AsyncGranter`.
    Every method is a coroutine, so all of them run on the actor's one event loop.

    Args:
        alias: The provider alias.
        limits: Its ``ai.providers.<alias>.limits`` as a dict (``ProviderLimits.model_dump()``).
    """

    def __init__(self, alias: str, limits: dict[str, Any]) -> None:
        from actors.raylife.metrics import install_ray_metrics

        install_ray_metrics()
        self.granter = AsyncGranter(alias, ProviderLimits.model_validate(limits))
        self._calls: dict[str, asyncio.Task[Any]] = {}
        self._abandoned: collections.OrderedDict[str, None] = collections.OrderedDict()

    async def configure(self, limits: dict[str, Any]) -> None:
        """Take the limits of the caller's configuration (the last serve started wins)."""
        self.granter.book.reconfigure(ProviderLimits.model_validate(limits))

    async def acquire(
        self, request_id: str, session_key: str, master: bool, est_tokens: int
    ) -> tuple[str, int, float]:
        """Wait for a lease: ``(lease_id, tokens reserved, seconds waited)``.

        Raises:
            runtime.llm.limits.ProviderBusyError: none within ``max_wait_s``.
            asyncio.CancelledError: :meth:`abandon` was called for ``request_id``.
        """
        if request_id in self._abandoned:  # its caller gave up before this call ran
            raise asyncio.CancelledError
        task = asyncio.ensure_future(self.granter.acquire(session_key, master, est_tokens))
        self._calls[request_id] = task
        try:
            grant = await task
        finally:
            self._calls.pop(request_id, None)
        return grant.lease_id, grant.tokens, grant.waited_s

    async def abandon(self, request_id: str, lease_id: str | None = None) -> None:
        """The caller of ``request_id`` gave up (its turn was aborted, it fell back to its own
        granter): drop its wait, or give back ``lease_id`` when it was granted after all."""
        task = self._calls.pop(request_id, None)
        if task is not None:
            task.cancel()
        elif lease_id is None:  # not started yet (calls may overtake each other): refuse it later
            self._abandoned[request_id] = None
            while len(self._abandoned) > MAX_WAITERS:
                self._abandoned.popitem(last=False)
        if lease_id is not None:
            self.granter.release(lease_id, None, None, None)

    async def release(
        self, lease_id: str, used_tokens: int | None, status: int | None, retry_after_s: float | None
    ) -> None:
        """End a lease (see :meth:`runtime.spend.limits.LeaseBook.release`)."""
        self.granter.release(lease_id, used_tokens, status, retry_after_s)

    async def status(self) -> dict[str, Any]:
        """``{"depth", "in_flight", "factor"}``: waiters, leases out, share of the limits in force."""
        book = self.granter.book
        return {"depth": book.depth(), "in_flight": book.in_flight(), "factor": book.factor(book.clock())}

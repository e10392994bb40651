"""The provider gate of a session host: asks the alias's :class:`ProviderLimitsActor` for every
lease, so every host and node shares one set of limits (docs/decisions.md#spend-provider-limits).

When the actor does not answer — it died and is being restarted, or it hangs — no call waits on it
forever: after ``max_wait_s`` + :data:`ACTOR_GRACE_S` (or at once for a dead actor) the call falls
back to this process's own :class:`~runtime.spend.granter.LocalProviderGate` (the same limits,
enforced per process), with a log line; for :data:`FALLBACK_S` every call of that alias stays
local, then the actor is resolved again by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

import ray

from actors.limits.granter_actor import MAX_WAITERS, NAMESPACE, ProviderLimitsActor, limits_actor_name
from runtime.config import ProviderConfig
from runtime.llm.attribution import CallAttribution
from runtime.llm.limits import Lease, ProviderBusyError, set_provider_gate
from runtime.spend.granter import LocalProviderGate, gated_limits

__all__ = ["ACTOR_GRACE_S", "FALLBACK_S", "LOCAL_PREFIX", "ClusterProviderGate", "install_provider_gate"]

log = logging.getLogger(__name__)

ACTOR_GRACE_S = 5.0
"""Seconds past ``max_wait_s`` a lease request may take before the actor counts as unreachable."""
FALLBACK_S = 10.0
"""Seconds an alias stays on the local granter after its actor failed to answer."""
RELEASE_TIMEOUT_S = 5.0
"""Longest wait for the actor to take a lease back (seconds); a lost release is reclaimed by TTL."""
LOCAL_PREFIX = "local:"
"""Lease ids granted by the local fallback start with this."""


class ClusterProviderGate:
    """A :class:`~runtime.llm.limits.ProviderGate` over one Ray actor per gated alias.

    Args:
        providers: ``ai.providers``; aliases with ``limits`` are gated.
    """

    def __init__(self, providers: Mapping[str, ProviderConfig]) -> None:
        self._limits = gated_limits(providers)
        self._local = LocalProviderGate(providers)
        self._actors: dict[str, Any] = {}
        self._local_until: dict[str, float] = {}

    def governs(self, alias: str) -> bool:
        return alias in self._limits

    def _actor(self, alias: str) -> Any:
        actor = self._actors.get(alias)
        if actor is None:
            limits = self._limits[alias].model_dump()
            actor = ProviderLimitsActor.options(  # type: ignore[attr-defined]
                name=limits_actor_name(alias),
                namespace=NAMESPACE,
                lifetime="detached",
                get_if_exists=True,
                max_concurrency=MAX_WAITERS,
            ).remote(alias, limits)
            actor.configure.remote(limits)  # an actor left by an earlier serve takes this config
            self._actors[alias] = actor
        return actor

    async def acquire(self, alias: str, attribution: CallAttribution | None, est_tokens: int) -> Lease:
        if time.monotonic() < self._local_until.get(alias, 0.0):
            return await self._acquire_local(alias, attribution, est_tokens)
        a = attribution or CallAttribution()
        request_id = uuid.uuid4().hex
        timeout = self._limits[alias].max_wait_s + ACTOR_GRACE_S
        actor = None
        try:
            actor = self._actor(alias)
            ref = actor.acquire.remote(request_id, a.session_key, a.master, est_tokens)
            lease_id, tokens, waited = await asyncio.wait_for(ref, timeout)
        except ProviderBusyError:  # arrives wrapped in Ray's task error: raise it plain
            raise ProviderBusyError(alias, self._limits[alias].max_wait_s) from None
        except asyncio.CancelledError:
            if actor is not None:
                actor.abandon.remote(request_id)
            raise
        except Exception as exc:  # the actor died, hangs, or cannot be created
            log.warning(
                "provider limits of %r: the granter actor did not answer (%s); granting in this "
                "process for %g s (docs/decisions.md#spend-provider-limits)",
                alias,
                type(exc).__name__,
                FALLBACK_S,
            )
            if actor is not None:
                with contextlib.suppress(Exception):
                    actor.abandon.remote(request_id)
            self._actors.pop(alias, None)  # resolved again by name after the fallback
            self._local_until[alias] = time.monotonic() + FALLBACK_S
            return await self._acquire_local(alias, attribution, est_tokens)
        return Lease(alias, lease_id, tokens, waited)

    async def _acquire_local(self, alias: str, attribution: CallAttribution | None, est_tokens: int) -> Lease:
        lease = await self._local.acquire(alias, attribution, est_tokens)
        return Lease(alias, LOCAL_PREFIX + lease.lease_id, lease.est_tokens, lease.waited_s)

    async def release(
        self, lease: Lease, used_tokens: int | None, status: int | None, retry_after_s: float | None
    ) -> None:
        if lease.lease_id.startswith(LOCAL_PREFIX):
            local = Lease(lease.alias, lease.lease_id.removeprefix(LOCAL_PREFIX), lease.est_tokens)
            await self._local.release(local, used_tokens, status, retry_after_s)
            return
        actor = self._actors.get(lease.alias)
        if actor is None:
            return  # the actor was given up on; its TTL reclaims the lease
        try:
            ref = actor.release.remote(lease.lease_id, used_tokens, status, retry_after_s)
            await asyncio.wait_for(ref, RELEASE_TIMEOUT_S)
        except Exception as exc:
            log.warning(
                "provider limits of %r: a lease was not given back (%s)", lease.alias, type(exc).__name__
            )


def install_provider_gate(providers: Mapping[str, ProviderConfig]) -> None:
    """Install this process's provider gate: the cluster-wide one when Ray runs here, else the
    process's own; none when no provider has limits."""
    if not gated_limits(providers):
        set_provider_gate(None)
    elif ray.is_initialized():
        set_provider_gate(ClusterProviderGate(providers))
    else:
        set_provider_gate(LocalProviderGate(providers))

"""Structured-output capabilities for sessions: the store-backed cache of a process, the probe at
first use or at start-up, and the rows ``/models`` and ``GET /admin/models`` show
(docs/decisions.md#structured-capability-cache).

* :func:`capability_cache` — a :class:`~runtime.reply.capability.CapabilityCache` on the SQL
  ``model_capabilities`` table (shared by every process of every node) with ``ai.capability_ttl_s``
  and ``ai.downgrade_after``; the session setup injects it into every turn and ``/models``.
* :func:`default_probe` — :func:`runtime.reply.probe.probe_tier` over the real provider stream.
* :func:`probe_configured` — ``ai.probe_on_start``: resolve every configured model once.
* :func:`configured_models` / :func:`describe` — what the listings show.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from runtime.llm.types import Model
from runtime.memory.db import Database
from runtime.reply.capability import CapabilityCache, CapabilityRecord, ProbeResult
from runtime.session.capability_store import SqlCapabilityStore

__all__ = [
    "capability_cache",
    "configured_models",
    "default_probe",
    "describe",
    "model_rows",
    "probe_configured",
]

log = logging.getLogger("sessionray.capabilities")


def capability_cache(config: Any, db: Database) -> CapabilityCache:
    """A cache on ``db``'s ``model_capabilities`` table (created by ``Database.create_tables``)
    with ``config.ai.capability_ttl_s`` and ``config.ai.downgrade_after``."""
    ai = config.ai
    store = SqlCapabilityStore(db)
    return CapabilityCache(store, ttl_s=ai.capability_ttl_s, downgrade_after=ai.downgrade_after)


async def default_probe(model: Model) -> ProbeResult:
    """Probe ``model`` through the registered provider (real HTTP; keys from the config)."""
    from runtime.reply.probe import probe_tier

    return await probe_tier(model)


def configured_models(config: Any) -> list[Model]:
    """Every model listed under ``ai.providers`` (config order), then the default, vision and
    fallback models that are referenced but not listed.

    Raises:
        runtime.config.ConfigError: a reference names an unknown provider.
    """
    from runtime.config import get_model, resolve_model_ref

    ai = config.ai
    models = [get_model(alias, m.id, config) for alias, p in ai.providers.items() for m in p.models]
    for ref in [ai.default_model, ai.vision_model, *ai.fallback_models]:
        if ref and all(m.ref() != ref for m in models):
            models.append(resolve_model_ref(ref, config))
    return models


async def probe_configured(config: Any, cache: CapabilityCache) -> list[CapabilityRecord | None]:
    """Resolve (probe when unknown or expired) every configured model, one after another; a model
    whose probe raises is logged and skipped (``None``). Used when ``ai.probe_on_start`` is true."""
    out: list[CapabilityRecord | None] = []
    for model in configured_models(config):
        try:
            out.append(await cache.resolve(model, default_probe))
        except Exception:
            log.warning("capability probe of %s at start-up failed", model.ref(), exc_info=True)
            out.append(None)
    return out


def describe(model: Model, rec: CapabilityRecord | None, now_ms: int | None = None) -> dict[str, Any]:
    """One listing row: ``{"model": ref, "api", "tier", "source", "age_s", "reason", "failures"}``;
    ``tier``/``source`` are ``None`` and ``age_s`` is ``None`` for an unknown model or a config tier
    (a config tier has no age)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    known = rec is not None and rec.source != "config"
    return {
        "model": model.ref(),
        "api": model.api,
        "tier": rec.tier if rec is not None else None,
        "source": rec.source if rec is not None else None,
        "age_s": round(rec.age_s(now), 3) if known and rec is not None else None,
        "reason": rec.reason if rec is not None else "",
        "failures": rec.failures if rec is not None else 0,
    }


async def model_rows(models: Sequence[Model], cache: CapabilityCache) -> list[dict[str, Any]]:
    """:func:`describe` of each model after reading the stored records (:meth:`CapabilityCache.snapshot`)."""
    return [describe(m, rec) for m, rec in await cache.snapshot(models)]

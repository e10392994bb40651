"""The capability probe: which structured-output tier a model really supports.

:func:`probe_tier` sends a one-field schema (``{"ok": true}``) at each tier, strongest first, and
returns the first tier that gives a valid object with the raw evidence; :func:`probe_capability`
runs it through a :class:`~runtime.reply.capability.CapabilityCache` (first use, TTL, store:
`docs/decisions.md#structured-capability-cache`).
"""

from __future__ import annotations

from pydantic import BaseModel

from runtime.llm.options import StreamOptions
from runtime.llm.types import Context, Model, UserMessage
from runtime.reply.capability import CAPABILITIES, TIERS, CapabilityCache, ProbeResult, Tier
from runtime.reply.json_schema import strict_json_schema
from runtime.reply.structured import StreamFn, bounded_call, extract_raw, prepare_request, validate_raw

__all__ = ["PROBE_TIMEOUT_S", "probe_capability", "probe_tier"]

PROBE_TIMEOUT_S = 30.0
"""Bound of each probe request in seconds."""


class _Probe(BaseModel):
    """Tiny schema used by :func:`probe_tier`."""

    ok: bool


async def probe_tier(
    model: Model, *, options: StreamOptions | None = None, stream_fn: StreamFn | None = None
) -> ProbeResult:
    """Probe ``model`` with a one-field schema, strongest tier first (at most one request per tier
    above ``prompt``, each bounded by :data:`PROBE_TIMEOUT_S`).

    Returns:
        The first tier whose answer validates, else ``prompt``; ``reason`` says what each tried
        tier did and ``evidence`` holds their raw answers (``tier: raw`` lines).
    """
    schema = strict_json_schema(_Probe)
    ctx = Context(system_prompt="Capability probe.", messages=[UserMessage(content='Answer {"ok": true}.')])
    notes: list[str] = []
    evidence: list[str] = []
    for tier in TIERS[:-1]:
        c, o = prepare_request(ctx, options, tier, schema, "probe")
        msg = await bounded_call(model, c, o, timeout=PROBE_TIMEOUT_S, stream_fn=stream_fn, reason="probe")
        raw, problem = extract_raw(msg, tier, "probe")
        if msg.stop_reason == "error":
            notes.append(f"{tier}: provider error: {msg.error_message}")
            evidence.append(f"{tier}: {msg.error_message}")
            continue
        evidence.append(f"{tier}: {raw}")
        value, error = (None, problem) if problem else validate_raw(_Probe, raw)
        if value is not None and msg.stop_reason in ("stop", "toolUse"):
            notes.append(f"{tier}: valid")
            return ProbeResult(tier, "; ".join(notes), "\n".join(evidence))
        notes.append(f"{tier}: {error or msg.stop_reason}")
    notes.append("prompt: fallback")
    return ProbeResult("prompt", "; ".join(notes), "\n".join(evidence))


async def probe_capability(
    model: Model,
    *,
    options: StreamOptions | None = None,
    cache: CapabilityCache | None = None,
    stream_fn: StreamFn | None = None,
) -> Tier:
    """The model's tier through ``cache`` (default :data:`CAPABILITIES`): the known one (config,
    unexpired record), else :func:`probe_tier` — whose result the cache stores.

    Returns:
        The strongest working tier (``prompt`` when nothing stronger worked).
    """
    cache = cache if cache is not None else CAPABILITIES
    known = cache.get(model)
    if known is not None and cache.store is None and cache.ttl_s is None:
        return known

    async def run(m: Model) -> ProbeResult:
        return await probe_tier(m, options=options, stream_fn=stream_fn)

    rec = await cache.resolve(model, run)
    return rec.tier if rec is not None else "prompt"

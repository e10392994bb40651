"""The capability probe: which structured-output tier a model really supports.

:func:`probe_capability` sends a one-field schema (``{"ok": true}``) at each tier, strongest
first, and records the first tier that returns a valid object in the capability cache
(`docs/decisions.md#structured-capability-cache`).
"""

from __future__ import annotations

from pydantic import BaseModel

from runtime.llm.options import StreamOptions
from runtime.llm.types import Context, Model, UserMessage
from runtime.reply.capability import CAPABILITIES, TIERS, CapabilityCache, Tier
from runtime.reply.json_schema import strict_json_schema
from runtime.reply.structured import StreamFn, bounded_call, extract_raw, prepare_request, validate_raw

__all__ = ["probe_capability"]


class _Probe(BaseModel):
    """Tiny schema used by :func:`probe_capability`."""

    ok: bool


async def probe_capability(
    model: Model,
    *,
    options: StreamOptions | None = None,
    cache: CapabilityCache | None = None,
    stream_fn: StreamFn | None = None,
) -> Tier:
    """Probe ``model`` with a one-field schema (``{"ok": true}``), strongest tier first, and cache
    the first tier that returns a valid object. Returns the cached tier at once when known.

    Returns:
        The strongest working tier (``prompt`` when nothing stronger worked).
    """
    cache = cache if cache is not None else CAPABILITIES
    known = cache.get(model)
    if known is not None:
        return known
    schema = strict_json_schema(_Probe)
    ctx = Context(system_prompt="Capability probe.", messages=[UserMessage(content='Answer {"ok": true}.')])
    for tier in TIERS[:-1]:
        c, o = prepare_request(ctx, options, tier, schema, "probe")
        msg = await bounded_call(model, c, o, stream_fn=stream_fn)
        raw, problem = extract_raw(msg, tier, "probe")
        if msg.stop_reason == "stop" or msg.stop_reason == "toolUse":
            value, _ = (None, problem) if problem else validate_raw(_Probe, raw)
            if value is not None:
                cache.record(model, tier)
                return tier
    cache.record(model, "prompt")
    return "prompt"

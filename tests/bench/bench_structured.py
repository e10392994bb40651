"""Structured replies: cost of strict validation, schema generation and one faux round trip.

Figures (all medians): ``validate_typical_us`` (a 5-segment reply, µs), ``validate_40k_ms`` (one
40,000-character text segment, ms), ``schema_ms`` (``Reply.model_json_schema()``, ms),
``finalize_first_try_us`` (``ImReplyContract.finalize`` on a valid message, µs, incl. the log
record and counter), ``complete_structured_faux_ms`` (one native-tier call through the faux model, ms).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from typing import Any


def _median(fn: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run() -> dict[str, float]:
    """Return the figures described in the module docstring."""
    import logging

    from providers.faux import (
        faux_assistant_message,
        faux_text,
        register_faux_provider,
        unregister_faux_provider,
    )
    from runtime import Context, UserMessage
    from runtime.reply.capability import CapabilityCache
    from runtime.reply.im_reply import ImReplyContract, MentionIdentity
    from runtime.reply.segments import Reply
    from runtime.reply.structured import complete_structured

    logging.getLogger("runtime.reply.structured").setLevel(logging.WARNING)
    typical = json.dumps(
        {
            "segments": [
                {"type": "markdown", "data": {"content": "**结果**\n- a\n- b"}},
                {"type": "text", "data": {"text": "请 "}},
                {"type": "mention", "data": {"target": "123456789"}},
                {"type": "text", "data": {"text": " 看看这个问题。"}},
                {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.com/r.png"}}},
            ]
        }
    )
    long = json.dumps({"segments": [{"type": "text", "data": {"text": "长" * 40_000}}]})
    out: dict[str, float] = {
        "validate_typical_us": _median(lambda: Reply.model_validate_json(typical), 2000) * 1e6,
        "validate_40k_ms": _median(lambda: Reply.model_validate_json(long), 200) * 1e3,
        "schema_ms": _median(Reply.model_json_schema, 50) * 1e3,
    }

    async def faux_figures() -> tuple[float, float]:
        handle = register_faux_provider(
            provider="bench-structured",
            models=["m"],
            chunk_size=4096,
            default_response=faux_assistant_message([faux_text(typical)]),
        )
        try:
            model = handle.get_model()
            contract = ImReplyContract(model, cache=CapabilityCache())
            msg = faux_assistant_message([faux_text(typical)])
            t: list[float] = []
            for _ in range(500):
                t0 = time.perf_counter()
                await contract.finalize(msg, MentionIdentity(sender_id="123456789"))
                t.append(time.perf_counter() - t0)
            c: list[float] = []
            ctx = Context(messages=[UserMessage(content="hi")])
            cache = CapabilityCache()
            for _ in range(200):
                t0 = time.perf_counter()
                await complete_structured(model, ctx, Reply, cache=cache, schema_name="reply")
                c.append(time.perf_counter() - t0)
            return statistics.median(t), statistics.median(c)
        finally:
            unregister_faux_provider("bench-structured")

    fin, comp = asyncio.run(faux_figures())
    out["finalize_first_try_us"] = fin * 1e6
    out["complete_structured_faux_ms"] = comp * 1e3
    for k, v in out.items():
        print(f"   {k}: {v:.1f}")
    return out

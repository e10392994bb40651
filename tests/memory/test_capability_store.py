"""The ``model_capabilities`` store behind the capability cache, on SQLite and PostgreSQL: rows
shared by two caches (two processes' views), first-use probe, TTL re-probe, the config pin, the
downgrade after consecutive off-schema answers (docs/decisions.md#structured-capability-cache,
docs/decisions.md#structured-downgrade-on-evidence)."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.config import parse_config
from runtime.llm.types import Model
from runtime.memory.db import Database
from runtime.reply.capability import CapabilityCache, CapabilityRecord, ProbeResult, Tier
from runtime.session.capabilities import describe, probe_configured
from runtime.session.capability_store import SqlCapabilityStore

MODEL = Model(id="m1", api="openai-completions", provider="p")


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


class Probe:
    """A probe that answers ``tier`` and counts its calls."""

    def __init__(self, tier: Tier = "native") -> None:
        self.tier: Tier = tier
        self.calls = 0

    async def __call__(self, model: Model) -> ProbeResult:
        self.calls += 1
        return ProbeResult(self.tier, f"{self.tier}: valid", f'{self.tier}: {{"ok": true}}')


async def test_round_trip_and_upsert(db: Database) -> None:
    store = SqlCapabilityStore(db)
    rec = CapabilityRecord("p", "m1", "native", "probe", 5, "why", "raw", 1)
    await store.save(rec)
    assert await store.load("p", "m1") == rec
    newer = CapabilityRecord("p", "m1", "tool", "downgrade", 9, "2 off-schema", "prose" * 10, 0)
    await store.save(newer)
    assert await store.load_all() == [newer]
    assert await store.load("p", "other") is None


async def test_first_use_probes_once_and_a_second_cache_reuses_the_row(db: Database) -> None:
    clock, probe = Clock(), Probe("tool")
    first = CapabilityCache(SqlCapabilityStore(db), ttl_s=100, clock=clock)
    rec = await first.resolve(MODEL, probe)
    assert rec is not None and (rec.tier, rec.source, rec.checked_at_ms) == ("tool", "probe", 1_000_000)
    assert rec.evidence == 'tool: {"ok": true}'
    other = CapabilityCache(SqlCapabilityStore(db), ttl_s=100, clock=clock)  # another process's view
    assert (await other.resolve(MODEL, probe)) == rec
    assert (probe.calls, other.get(MODEL)) == (1, "tool")


async def test_ttl_triggers_a_re_probe_which_is_the_only_upgrade(db: Database) -> None:
    clock, probe = Clock(), Probe("native")
    cache = CapabilityCache(SqlCapabilityStore(db), ttl_s=100, downgrade_after=1, clock=clock)
    await cache.resolve(MODEL, probe)
    assert await cache.note_invalid(MODEL, "native", "prose", "invalid JSON") is True
    clock.t += 99
    rec = await cache.resolve(MODEL, probe)
    assert rec is not None and (rec.tier, rec.source, probe.calls) == ("tool", "downgrade", 1)
    clock.t += 1  # the downgrade is 100 s old: probe again
    rec = await cache.resolve(MODEL, probe)
    assert rec is not None and (rec.tier, rec.source, probe.calls) == ("native", "probe", 2)
    assert (await SqlCapabilityStore(db).load("p", "m1")) == rec


async def test_consecutive_off_schema_answers_downgrade_and_a_valid_one_resets(db: Database) -> None:
    cache = CapabilityCache(SqlCapabilityStore(db), downgrade_after=2)
    other = CapabilityCache(SqlCapabilityStore(db), downgrade_after=2)
    await cache.resolve(MODEL, Probe("native"))
    assert await cache.note_invalid(MODEL, "native", "prose 1", "bad") is False
    await cache.note_valid(MODEL, "native")  # the streak restarts
    assert await cache.note_invalid(MODEL, "native", "prose 2", "bad") is False
    # the second answer in a row is seen by another process: the count is shared in SQL
    assert await other.note_invalid(MODEL, "native", "prose 3", "bad") is True
    rec = await SqlCapabilityStore(db).load("p", "m1")
    assert rec is not None
    assert (rec.tier, rec.source, rec.evidence, rec.failures) == ("tool", "downgrade", "prose 3", 0)
    assert rec.reason == "2 consecutive off-schema answers at native: bad"
    await cache.resolve(MODEL)
    assert cache.get(MODEL) == "tool"
    # evidence against a tier the model no longer uses changes nothing
    assert await cache.note_invalid(MODEL, "native", "late", "bad") is False


async def test_config_pin_wins_over_probe_and_is_never_downgraded(db: Database) -> None:
    pinned = MODEL.model_copy(update={"compat": {"structured_tier": "prompt"}})
    probe = Probe("native")
    cache = CapabilityCache(SqlCapabilityStore(db), downgrade_after=1)
    await SqlCapabilityStore(db).save(CapabilityRecord("p", "m1", "native", "probe", 1))
    rec = await cache.resolve(pinned, probe)
    assert rec is not None and (rec.tier, rec.source, probe.calls) == ("prompt", "config", 0)
    seeded = MODEL.model_copy(update={"compat": {"structured_output": "native"}})
    assert await cache.note_invalid(seeded, "native", "prose", "bad") is True  # a seed can move down
    assert cache.get(seeded) == "tool"
    assert await cache.note_invalid(pinned, "prompt", "prose", "bad") is False
    assert cache.get(pinned) == "prompt"
    assert describe(pinned, cache.effective(pinned), now_ms=0)["source"] == "config"


async def test_probe_on_start_probes_every_configured_model(db: Database, monkeypatch: Any) -> None:
    import runtime.session.capabilities as caps

    probe = Probe("tool")
    monkeypatch.setattr(caps, "default_probe", probe)
    cfg = parse_config(
        {
            "ai": {
                "probe_on_start": True,
                "providers": {
                    "p": {
                        "api": "openai-completions",
                        "models": [{"id": "a"}, {"id": "b", "structured_tier": "native"}],
                    }
                },
            }
        }
    )
    cache = caps.capability_cache(cfg, db)
    recs = await probe_configured(cfg, cache)
    assert [(r.model, r.tier, r.source) for r in recs if r is not None] == [
        ("a", "tool", "probe"),
        ("b", "native", "config"),
    ]
    assert probe.calls == 1
    assert [r.model for r in await SqlCapabilityStore(db).load_all()] == ["a"]


@pytest.mark.parametrize(("seconds", "text"), [(5, "<1 min"), (61, "1 min"), (7200, "2 h"), (200000, "2 d")])
def test_age_text(seconds: float, text: str) -> None:
    from runtime.reply.capability import age_text

    assert age_text(seconds) == text


def probe_answer(context: Any, options: Any = None) -> Any:
    """A scripted faux model (``ai.providers.<alias>.script``) that answers the probe validly."""
    from runtime.llm.types import AssistantMessage, TextContent

    return AssistantMessage(
        content=[TextContent(text='{"ok": true}')], provider="s", model="m", stop_reason="stop"
    )


async def test_start_up_probe_reaches_the_configured_providers(db: Database) -> None:
    """``ai.probe_on_start`` registers the configured providers (their keys, scripted faux models)
    before probing: a scripted model is probed and its tier stored."""
    from actors.placement.runtime import _probe_on_start

    cfg = parse_config(
        {
            "ai": {
                "probe_on_start": True,
                "providers": {
                    "s": {"api": "faux", "script": f"{__name__}:probe_answer", "models": [{"id": "m"}]}
                },
            }
        }
    )
    await _probe_on_start(cfg, db)
    assert [(r.provider, r.model, r.tier, r.source) for r in await SqlCapabilityStore(db).load_all()] == [
        ("s", "m", "native", "probe")
    ]


async def test_complete_structured_counts_off_schema_answers_in_the_shared_store(db: Database) -> None:
    """``complete_structured`` with the sessions' store-backed cache: one off-schema native answer is
    evidence, not a downgrade (that call is corrected at ``native``); the ``ai.downgrade_after``-th
    in a row — seen by another process — moves the model, stored for both
    (docs/decisions.md#structured-downgrade-on-evidence)."""
    from pydantic import BaseModel, ConfigDict

    from providers.faux import (
        faux_assistant_message,
        faux_text,
        faux_tool_call,
        register_faux_provider,
        unregister_faux_provider,
    )
    from runtime.llm.types import Context, UserMessage
    from runtime.reply.structured import complete_structured, run_structured
    from runtime.session.capabilities import capability_cache

    class Verdict(BaseModel):
        model_config = ConfigDict(extra="forbid")
        ok: bool

    cfg = parse_config({"ai": {"downgrade_after": 2}})
    here, there = capability_cache(cfg, db), capability_cache(cfg, db)  # two processes' views
    handle = register_faux_provider(provider="store-evidence", models=["m"])
    model, ctx = handle.get_model(), Context(messages=[UserMessage(content="ok?", timestamp=1)])
    prose = faux_assistant_message([faux_text("Looks fine.")])
    try:
        handle.set_responses([prose, faux_assistant_message([faux_text('{"ok": true}')])])
        assert await complete_structured(model, ctx, Verdict, cache=here) == Verdict(ok=True)
        row = await SqlCapabilityStore(db).load("store-evidence", "m")
        assert row is not None and (row.tier, row.failures) == ("native", 1)
        handle.set_responses([prose, faux_assistant_message([faux_tool_call("Verdict", {"ok": False})])])
        out = await run_structured(model, ctx, Verdict, cache=there)
        assert (out.value, out.tier, out.outcome, out.downgrades) == (
            Verdict(ok=False), "tool", "first_try", [("native", "tool")]
        )  # fmt: skip
        row = await SqlCapabilityStore(db).load("store-evidence", "m")
        assert row is not None
        assert (row.tier, row.source, row.evidence) == ("tool", "downgrade", "Looks fine.")
        handle.set_responses([faux_assistant_message([faux_tool_call("Verdict", {"ok": True})])])
        again = await run_structured(model, ctx, Verdict, cache=here)  # the first process reads the row
        assert (again.tier, again.outcome, again.calls, handle.call_count) == ("tool", "first_try", 1, 5)
    finally:
        unregister_faux_provider("store-evidence")


async def test_the_probe_lease_is_one_holders_until_released_or_run_out(db: Database) -> None:
    store = SqlCapabilityStore(db)
    assert await store.claim_probe("p", "m1", "a", 60)
    assert not await store.claim_probe("p", "m1", "b", 60)  # another process waits
    assert await store.claim_probe("p", "m1", "a", 60)  # its holder may renew it
    assert await store.claim_probe("p", "m2", "b", 60)  # per model
    await store.release_probe("p", "m1", "b")  # not b's: nothing changes
    assert not await store.claim_probe("p", "m1", "b", 60)
    await store.release_probe("p", "m1", "a")
    assert await store.claim_probe("p", "m1", "b", 60)
    assert await store.claim_probe("p", "m3", "dead", -1)  # a holder that died: its lease ran out
    assert await store.claim_probe("p", "m3", "c", 60)


class CountingStore(SqlCapabilityStore):
    claims = 0

    async def claim_probe(self, provider: str, model: str, holder: str, lease_s: float) -> bool:
        self.claims += 1
        return await super().claim_probe(provider, model, holder, lease_s)


async def test_two_processes_at_first_use_probe_once(db: Database) -> None:
    """Two caches (two hosts' views) resolve an unknown model at once: one probes, the other waits
    for its row (docs/decisions.md#structured-capability-cache)."""
    import asyncio

    release = asyncio.Event()
    calls = 0

    async def probe(model: Model) -> ProbeResult:
        nonlocal calls
        calls += 1
        await release.wait()
        return ProbeResult("tool", "tool: valid", "tool: {}")

    stores = [CountingStore(db), CountingStore(db)]
    caches = [CapabilityCache(s, ttl_s=100) for s in stores]
    first = asyncio.ensure_future(caches[0].resolve(MODEL, probe))
    while calls == 0:
        await asyncio.sleep(0.01)
    second = asyncio.ensure_future(caches[1].resolve(MODEL, probe))
    while calls < 2 and stores[1].claims < 2:  # the other one probed too, or it waits for the lease
        await asyncio.sleep(0.01)
    release.set()
    one, two = await asyncio.gather(first, second)
    assert calls == 1
    assert one == two and one is not None and (one.tier, one.source) == ("tool", "probe")

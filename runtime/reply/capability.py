"""The structured-output capability of each model: the strongest working tier per
``(provider, model id)``, with where it came from (docs/decisions.md#structured-capability-cache).

Sources of a tier, strongest claim first:

* ``config`` — ``Model.compat["structured_tier"]`` (``ai.providers.<alias>.models[].structured_tier``)
  pins the tier: no probe, no downgrade. ``compat["structured_output"]`` or
  ``compat["supports_json_schema"] is False`` (→ ``tool``) seed it: no probe, but a downgrade on
  evidence may move the model below the seed (until ``ttl_s`` expires it).
* ``probe`` — :func:`runtime.reply.probe.probe_tier` found it (a tiny request per tier).
* ``downgrade`` — the model rejected a tier (a capability error) or answered off-schema
  ``downgrade_after`` times in a row (docs/decisions.md#structured-downgrade-on-evidence).

The cache keeps an in-memory copy per process; an optional :class:`CapabilityStore` (the SQL table
``model_capabilities``, :mod:`runtime.session.capability_store`, injected by the session setup) shares
the records between every process of every node. This module holds no SQL.

Used by :mod:`runtime.reply.structured` (generic structured output) and :mod:`runtime.reply.im_reply`
(the IM reply contract).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol, TypeAlias

from runtime.llm.types import Model

__all__ = [
    "CAPABILITIES",
    "EVIDENCE_CHARS",
    "PROBE_LEASE_S",
    "PROBE_POLL_S",
    "TIERS",
    "CapabilityCache",
    "CapabilityRecord",
    "CapabilityStore",
    "ProbeFn",
    "ProbeResult",
    "Source",
    "Tier",
    "age_text",
    "is_capability_error",
]

log = logging.getLogger("runtime.reply.capability")

Tier: TypeAlias = Literal["native", "tool", "prompt"]
"""Structured-output strength: ``native`` > ``tool`` > ``prompt``."""
TIERS: tuple[Tier, ...] = ("native", "tool", "prompt")
"""All tiers, strongest first."""
Source: TypeAlias = Literal["probe", "config", "downgrade"]
"""Where a tier came from (see the module docstring)."""
PROBE_LEASE_S = 90.0
"""How long one process may hold a model's probe lease (a probe is at most two requests of
:data:`runtime.reply.probe.PROBE_TIMEOUT_S`), in seconds; a lease whose holder died runs out."""
PROBE_POLL_S = 0.25
"""How often a process that waits for another's probe reads the store, in seconds."""
EVIDENCE_CHARS = 4000
"""Raw evidence kept per record (characters; longer output is cut, marked with ``…``)."""


@dataclass(frozen=True)
class CapabilityRecord:
    """What is known of one ``(provider, model)``.

    Attributes:
        provider: ``Model.provider`` (or ``Model.api`` without one).
        model: The model id.
        tier: The tier to request.
        source: ``probe`` | ``config`` | ``downgrade``.
        checked_at_ms: When the tier was established (Unix ms); the age counts from here.
        reason: Why (probe summary, downgrade cause, config key).
        evidence: Raw output that decided it (cut to :data:`EVIDENCE_CHARS`).
        failures: Consecutive off-schema answers seen at ``tier`` since then.
    """

    provider: str
    model: str
    tier: Tier
    source: Source
    checked_at_ms: int
    reason: str = ""
    evidence: str = ""
    failures: int = 0

    def age_s(self, now_ms: int | None = None) -> float:
        """Seconds since :attr:`checked_at_ms` (``now_ms`` default: the wall clock)."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return max(0.0, (now - self.checked_at_ms) / 1000)


@dataclass(frozen=True)
class ProbeResult:
    """What a probe found: the strongest working ``tier``, a ``reason`` and the raw ``evidence``."""

    tier: Tier
    reason: str
    evidence: str


ProbeFn: TypeAlias = Callable[[Model], Awaitable[ProbeResult]]
"""``(model) -> ProbeResult``; :func:`runtime.reply.probe.probe_tier` bound to options."""


class CapabilityStore(Protocol):
    """Persistent records shared by every process
    (:class:`runtime.session.capability_store.SqlCapabilityStore`).

    Methods raise whatever the backend raises (the cache logs and carries on in memory)."""

    async def load(self, provider: str, model: str) -> CapabilityRecord | None:
        """The stored record of ``(provider, model)``, or ``None``."""
        ...

    async def save(self, record: CapabilityRecord) -> None:
        """Insert or replace the record of ``(record.provider, record.model)``."""
        ...

    async def load_all(self) -> list[CapabilityRecord]:
        """Every stored record."""
        ...


def age_text(seconds: float) -> str:
    """An age for people: ``<1 min``, ``5 min``, ``3 h`` or ``2 d`` (rounded down)."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit}"
    return "<1 min"


def _cut(text: str) -> str:
    return text if len(text) <= EVIDENCE_CHARS else text[: EVIDENCE_CHARS - 1] + "…"


class CapabilityCache:
    """Strongest working tier per ``(provider, model id)`` (docs/decisions.md#structured-capability-cache).

    Args:
        store: Persistent backend shared across processes (``None``: this process only).
        ttl_s: Age in seconds after which a probed or downgraded record is probed again
            (``None``: never expires). Config ``ai.capability_ttl_s``.
        downgrade_after: Consecutive off-schema answers at a tier that move the model to the next
            tier (≥ 1). Config ``ai.downgrade_after``.
        clock: Wall clock in seconds (tests inject one).

    The sync :meth:`get`/:meth:`record` read and write the in-memory copy only; the async methods
    also read and write the store. Thread-safe for the in-memory part.
    """

    def __init__(
        self,
        store: CapabilityStore | None = None,
        *,
        ttl_s: float | None = None,
        downgrade_after: int = 2,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if downgrade_after < 1:
            raise ValueError(f"downgrade_after must be ≥ 1, got {downgrade_after}")
        self.store = store
        self.ttl_s = ttl_s
        self.downgrade_after = downgrade_after
        self.clock = clock
        self._records: dict[tuple[str, str], CapabilityRecord] = {}
        self._lock = threading.Lock()
        self._probing: dict[tuple[str, str], asyncio.Lock] = {}

    # ------------------------------------------------------------------ in memory
    @staticmethod
    def key(model: Model) -> tuple[str, str]:
        """Return the cache key ``(provider or api, model id)``."""
        return (model.provider or model.api, model.id)

    @staticmethod
    def pinned(model: Model) -> Tier | None:
        """The tier ``compat["structured_tier"]`` pins (config ``models[].structured_tier``), or ``None``."""
        value = model.compat.get("structured_tier")
        return value if value in TIERS else None

    @staticmethod
    def seeded(model: Model) -> Tier | None:
        """Return the tier the model's config declares, or ``None`` when it says nothing.

        ``structured_tier`` (the pin) wins, then ``compat["structured_output"]``
        (``native``/``tool``/``prompt``); otherwise ``supports_json_schema: false`` (the
        OpenAI-compatible profile flag) means ``tool``.
        """
        value = CapabilityCache.pinned(model) or model.compat.get("structured_output")
        if value in TIERS:
            return value
        if model.compat.get("supports_json_schema") is False:
            return "tool"
        return None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _expired(self, rec: CapabilityRecord) -> bool:
        return self.ttl_s is not None and rec.age_s(self._now_ms()) >= self.ttl_s

    def effective(self, model: Model) -> CapabilityRecord | None:
        """The record that decides the tier now: the config pin; else a config seed unless a
        weaker, unexpired downgrade is recorded; else the in-memory record; ``None``: unknown."""
        provider, model_id = self.key(model)
        with self._lock:
            rec = self._records.get((provider, model_id))
        pin, seed = self.pinned(model), self.seeded(model)
        if pin is not None or seed is not None:
            tier: Tier = pin or seed  # type: ignore[assignment]
            if (
                pin is None
                and rec is not None
                and rec.source == "downgrade"
                and TIERS.index(rec.tier) > TIERS.index(tier)
                and not self._expired(rec)
            ):
                return rec
            why = "structured_tier (pinned)" if pin is not None else "compat"
            failures = rec.failures if rec is not None and rec.tier == tier else 0
            return CapabilityRecord(provider, model_id, tier, "config", 0, why, "", failures)
        return rec

    def get(self, model: Model) -> Tier | None:
        """Return the tier to request (see :meth:`effective`), or ``None`` (unknown)."""
        rec = self.effective(model)
        return rec.tier if rec is not None else None

    def record(self, model: Model, tier: Tier) -> None:
        """Remember in memory that ``tier`` works for ``model`` (source ``probe`` when it is new;
        a record already at ``tier`` keeps its source). Not persisted."""
        provider, model_id = self.key(model)
        with self._lock:
            old = self._records.get((provider, model_id))
            if old is None or old.tier != tier:
                self._records[(provider, model_id)] = CapabilityRecord(
                    provider, model_id, tier, "probe", self._now_ms(), "answered at this tier"
                )

    def clear(self) -> None:
        """Forget the in-memory copy (tests, configuration reload); the store is untouched."""
        with self._lock:
            self._records.clear()

    def _remember(self, rec: CapabilityRecord) -> None:
        with self._lock:
            self._records[(rec.provider, rec.model)] = rec

    # ------------------------------------------------------------------ with the store
    async def _save(self, rec: CapabilityRecord) -> None:
        self._remember(rec)
        if self.store is not None:
            try:
                await self.store.save(rec)
            except Exception:
                log.warning("capability store: saving %s/%s failed", rec.provider, rec.model, exc_info=True)

    async def _reload(self, model: Model) -> CapabilityRecord | None:
        """Read the model's record from the store into memory (store errors: keep memory)."""
        provider, model_id = self.key(model)
        if self.store is not None:
            try:
                rec = await self.store.load(provider, model_id)
            except Exception:
                log.warning("capability store: loading %s/%s failed", provider, model_id, exc_info=True)
            else:
                with self._lock:
                    if rec is None:
                        self._records.pop((provider, model_id), None)
                    else:
                        self._records[(provider, model_id)] = rec
        with self._lock:
            return self._records.get((provider, model_id))

    async def resolve(self, model: Model, probe: ProbeFn | None = None) -> CapabilityRecord | None:
        """The model's record at first use (docs/decisions.md#structured-capability-cache): read the
        store; when the model has no config tier and no unexpired record, run ``probe`` (once per
        deployment at a time: a process holds the store's probe lease, the others wait for its
        record) and store its result (source ``probe``). Without ``probe`` an unknown
        model stays unknown (``None``: callers default to ``native``)."""
        if self.pinned(model) is not None:
            return self.effective(model)
        rec = await self._reload(model)
        if self.seeded(model) is not None:
            return self.effective(model)
        if (rec is not None and not self._expired(rec)) or probe is None:
            return rec
        lock = self._probing.setdefault(self.key(model), asyncio.Lock())
        async with lock:
            rec = await self._reload(model)  # another process or task may have probed meanwhile
            if rec is not None and not self._expired(rec):
                return rec
            lease = await self._lease(model)
            if isinstance(lease, CapabilityRecord):  # another process probed it meanwhile
                return lease
            try:
                return await self._probe(model, probe, rec)
            finally:
                if lease is not None:
                    await self._release(model, lease)

    async def _probe(self, model: Model, probe: ProbeFn, old: CapabilityRecord | None) -> CapabilityRecord:
        provider, model_id = self.key(model)
        found = await probe(model)
        new = CapabilityRecord(
            provider, model_id, found.tier, "probe", self._now_ms(), found.reason, _cut(found.evidence)
        )
        log.info(
            "capability probe: %s → %s (%s; was %s)",
            model.ref(),
            found.tier,
            found.reason,
            f"{old.tier} from {old.source}" if old is not None else "unknown",
        )
        await self._save(new)
        return new

    async def _lease(self, model: Model) -> str | CapabilityRecord | None:
        """Take the store's probe lease of ``model`` (one process of the deployment probes a model
        at a time: docs/decisions.md#structured-capability-cache); returns its holder id. While
        another process holds it, read the store every :data:`PROBE_POLL_S` and return that
        process's record once it is there (or take the lease once it ran out). ``None``: the
        store has no leases, or failed (logged) — this process probes on its own."""
        claim = getattr(self.store, "claim_probe", None)
        if claim is None:
            return None
        provider, model_id = self.key(model)
        holder = uuid.uuid4().hex
        while True:
            try:
                if await claim(provider, model_id, holder, PROBE_LEASE_S):
                    return holder
            except Exception:
                log.warning(
                    "capability store: probe lease of %s/%s failed", provider, model_id, exc_info=True
                )
                return None
            await asyncio.sleep(PROBE_POLL_S)
            rec = await self._reload(model)
            if rec is not None and not self._expired(rec):
                return rec

    async def _release(self, model: Model, holder: str) -> None:
        provider, model_id = self.key(model)
        try:
            await self.store.release_probe(provider, model_id, holder)  # type: ignore[union-attr]
        except Exception:  # the lease runs out by itself
            log.warning("capability store: releasing the probe lease of %s/%s failed", provider, model_id)

    async def note_invalid(self, model: Model, tier: Tier, raw: str, reason: str) -> bool:
        """Count an answer at ``tier`` that did not validate against the schema (evidence;
        docs/decisions.md#structured-downgrade-on-evidence). The ``downgrade_after``-th one in a row
        moves the model to the next tier (:meth:`downgrade`). A pinned tier, the ``prompt`` tier and
        a tier the model no longer uses are never downgraded. Returns whether it downgraded."""
        if self.pinned(model) is not None or tier == "prompt":
            return False
        await self._reload(model)
        current = self.effective(model)
        if current is not None and current.tier != tier:
            return False  # already moved (another turn or process)
        failures = (current.failures if current is not None else 0) + 1
        if failures >= self.downgrade_after:
            why = f"{failures} consecutive off-schema answers at {tier}: {reason}"
            await self.downgrade(model, tier, why, raw)
            return True
        provider, model_id = self.key(model)
        base = current or CapabilityRecord(provider, model_id, tier, "probe", self._now_ms(), "default tier")
        await self._save(replace(base, failures=failures))  # how the tier was established stays
        log.info(
            "structured output: %s answered off-schema at %s (%d/%d): %s; raw output: %r",
            model.ref(),
            tier,
            failures,
            self.downgrade_after,
            reason,
            _cut(raw),
        )
        return False

    async def note_valid(self, model: Model, tier: Tier) -> None:
        """A valid answer at ``tier``: the off-schema streak restarts (stored only when there was one)."""
        rec = self.effective(model)
        if rec is not None and rec.tier == tier and rec.failures:
            await self._save(replace(rec, failures=0))
        elif rec is None:
            self.record(model, tier)

    async def downgrade(self, model: Model, src: Tier, reason: str, raw: str = "") -> Tier:
        """Move ``model`` from ``src`` to the next tier now: stored (source ``downgrade``), logged
        with the raw output, reason and tiers, counted in ``sessionray_structured_downgrades_total
        {from_mode, to_mode}``. Returns the new tier (``src`` when it is ``prompt`` or pinned)."""
        from runtime import metrics

        if src == "prompt" or self.pinned(model) is not None:
            log.warning("structured output: %s cannot leave %s (%s)", model.ref(), src, reason)
            return src
        dst = TIERS[TIERS.index(src) + 1]
        provider, model_id = self.key(model)
        await self._save(
            CapabilityRecord(provider, model_id, dst, "downgrade", self._now_ms(), reason, _cut(raw))
        )
        metrics.STRUCTURED_DOWNGRADES.inc(from_mode=src, to_mode=dst)
        log.warning(
            "structured output downgrade %s -> %s for %s: %s; raw output: %r",
            src,
            dst,
            model.ref(),
            reason,
            _cut(raw),
        )
        return dst

    async def snapshot(self, models: Sequence[Model]) -> list[tuple[Model, CapabilityRecord | None]]:
        """``(model, effective record)`` for each of ``models`` after reading every stored record
        (``/models``, ``GET /admin/models``)."""
        if self.store is not None:
            try:
                for rec in await self.store.load_all():
                    self._remember(rec)
            except Exception:
                log.warning("capability store: listing failed", exc_info=True)
        return [(m, self.effective(m)) for m in models]


CAPABILITIES = CapabilityCache()
"""The process-wide capability cache used when no ``cache`` is passed (memory only)."""

_CAPABILITY_ERROR = re.compile(
    r"\b(400|404|415|422)\b|not supported|unsupported|invalid[_ ]request|response_format|json_schema"
    r"|tool_choice|does not support",
    re.IGNORECASE,
)
_FEATURE = re.compile(
    r"response_format|json_schema|responseSchema|response_schema|structured|tool_choice|\btools?\b"
    r"|function[_ ]call|not supported|unsupported|does not support",
    re.IGNORECASE,
)
_NOT_A_CAPABILITY = re.compile(
    r"context[_ ]length|context window|maximum context|too many tokens|max_tokens|too long|prompt is too"
    r"|rate[_ ]limit|quota|api[_ ]key|unauthori[sz]ed|authentication|permission|forbidden|billing"
    r"|model[_ ]not[_ ]found|no such model|does not exist",
    re.IGNORECASE,
)


def is_capability_error(error_message: str | None) -> bool:
    """True when a provider error reads like a rejected feature (HTTP 400/404/415/422, "unsupported",
    ``invalid_request``, a complaint about ``response_format``/``json_schema``/``tool_choice``),
    as opposed to a transport failure (429/5xx are retried by the transport already).

    A 4xx that names a request problem unrelated to structured output — context length, max
    tokens, rate limit/quota, API key/auth/permission, an unknown model — is *not* a capability
    error unless it also names the feature (``response_format``, ``json_schema``, ``tool_choice``,
    tools, "not supported"): downgrading would not help, and the downgrade is cached for the
    (provider, model), so a single over-long prompt must not demote a model for good.
    """
    text = error_message or ""
    if not text or not _CAPABILITY_ERROR.search(text):
        return False
    return not _NOT_A_CAPABILITY.search(text) or bool(_FEATURE.search(text))

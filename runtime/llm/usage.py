"""What every LLM call used, reported once when it ends: the usage-observer hook of the single
entry point (docs/decisions.md#spend-ledger, docs/decisions.md#llm-single-entry).

:func:`runtime.llm.stream.stream` / ``stream_simple`` hand the provider's event stream to
:func:`observed`, a view that passes every event through unchanged (no extra task: a consumer sees
each event as early as before) and, once the provider ended the call (success, error or abort
alike), calls :func:`report_usage` once with a :class:`CallUsage`:
the model's ``provider/id``, whatever usage the provider reported (made sane by
:func:`sane_usage`, on the message too), its cost in USD and the
:func:`~runtime.llm.attribution.current_attribution` of the caller. The terminal ``done`` /
``error`` event and ``result()`` are held until then, so the consumer sees the end of a call only
after every observer has finished with it — the usage ledger's row is committed (or, for a
turn's own call, staged for the turn's next write) before the turn goes on
(docs/decisions.md#spend-ledger, docs/decisions.md#spend-quotas: a quota then holds exactly).

:func:`report_usage` also counts ``sessionray_llm_tokens_total{api,kind,model}`` and
``sessionray_llm_cost_usd_total{model}``. A call that does not stream (image generation,
:mod:`providers.openai_images`) calls :func:`report_usage` itself.

Observers (:func:`add_usage_observer`) are process-wide; one that raises is logged and the call
goes on (a model call never fails because its accounting did).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable

from runtime import metrics
from runtime.llm.attribution import CallAttribution, current_attribution
from runtime.llm.events import AssistantMessageEvent, AssistantMessageEventStream
from runtime.llm.types import AssistantMessage, Cost, Model, ModelCost, Usage, now_ms

__all__ = [
    "MAX_COUNT",
    "CallUsage",
    "UsageObserver",
    "add_usage_observer",
    "call_cost",
    "observed",
    "priced",
    "remove_usage_observer",
    "report_usage",
    "sane_usage",
]

log = logging.getLogger("sessionray.llm.usage")


@dataclasses.dataclass(frozen=True, slots=True)
class CallUsage:
    """One finished LLM call (tokens; ``cost_usd`` in USD; ``ts_ms`` Unix ms when it ended)."""

    model: str
    """``provider/id`` as configured (:meth:`Model.ref`)."""
    api: str
    usage: Usage
    cost_usd: float
    stop_reason: str
    """``stop`` | ``length`` | ``toolUse`` | ``error`` | ``aborted`` (``image`` calls: ``stop``/``error``)."""
    attribution: CallAttribution | None
    ts_ms: int


UsageObserver = Callable[[CallUsage], Awaitable[None] | None]
"""Called once per finished call; may be async (then awaited before the call's end is seen)."""

_observers: list[UsageObserver] = []


def add_usage_observer(fn: UsageObserver) -> UsageObserver:
    """Register ``fn`` for every call of this process (idempotent); returns ``fn``."""
    if fn not in _observers:
        _observers.append(fn)
    return fn


def remove_usage_observer(fn: UsageObserver) -> None:
    """Unregister ``fn`` (no-op when it is not registered)."""
    if fn in _observers:
        _observers.remove(fn)


def priced(prices: ModelCost, usage: Usage) -> Cost:
    """The USD cost of ``usage`` at ``prices`` (USD per million tokens), split like ``usage``
    (the one pricing rule; :func:`providers.common.apply_cost` stores it on a message)."""
    c = Cost(
        input=usage.input * prices.input / 1e6,
        output=usage.output * prices.output / 1e6,
        cache_read=usage.cache_read * prices.cache_read / 1e6,
        cache_write=usage.cache_write * prices.cache_write / 1e6,
    )
    c.total = c.input + c.output + c.cache_read + c.cache_write
    return c


def call_cost(model: Model, usage: Usage) -> float:
    """The call's cost in USD: ``usage.cost.total`` when the provider adapter filled it
    (:func:`providers.common.apply_cost`), else priced from ``model.cost`` (the ``faux`` api reports
    tokens only)."""
    return usage.cost.total if usage.cost.total > 0 else priced(model.cost, usage).total


async def report_usage(call: CallUsage) -> None:
    """Count ``call`` in the metrics and hand it to every observer in turn (awaiting async ones).
    Never raises: an observer's exception is logged with its traceback."""
    u = call.usage
    kinds = (
        ("input", u.input),
        ("output", u.output),
        ("cache_read", u.cache_read),
        ("cache_write", u.cache_write),
    )
    for kind, n in kinds:
        if n:
            metrics.LLM_TOKENS.inc(n, api=call.api, kind=kind, model=call.model)
    if call.cost_usd > 0:
        metrics.LLM_COST.inc(call.cost_usd, model=call.model)
    for fn in list(_observers):
        try:
            done = fn(call)
            if inspect.isawaitable(done):
                await done
        except Exception:
            log.exception("usage observer %r failed for a call of %s", fn, call.model)


MAX_COUNT = 2**63 - 1
"""The largest token count recorded (a 64-bit SQL integer); a larger reported one is cut to it."""


def _count(value: object) -> int:
    """A reported token count as a whole number in 0 … :data:`MAX_COUNT` (anything else: 0)."""
    if isinstance(value, bool):
        n = 0
    elif isinstance(value, str):
        digits = value.strip()
        n = int(digits) if digits.isdigit() else 0
    elif isinstance(value, int):
        n = value
    elif isinstance(value, float) and math.isfinite(value):
        n = int(value)
    else:
        n = 0
    return min(max(n, 0), MAX_COUNT)


def sane_usage(usage: Usage) -> Usage:
    """``usage`` with every token count a whole number in 0 … :data:`MAX_COUNT` (a negative, NaN,
    missing or non-numeric count from a provider becomes 0, a float is truncated, a digit string is
    read, a count beyond a 64-bit SQL integer is cut to it) and a cost total
    that is finite and ≥ 0 (else 0, so :func:`call_cost` prices the tokens): the ledger's sums and
    the quotas built on them never go backwards or become NaN (docs/decisions.md#spend-ledger)."""
    counts = {k: _count(getattr(usage, k, 0)) for k in ("input", "output", "cache_read", "cache_write")}
    total = getattr(getattr(usage, "cost", None), "total", 0.0)
    ok_total = isinstance(total, int | float) and math.isfinite(total) and total >= 0
    clean = Usage(**counts, total_tokens=min(sum(counts.values()), MAX_COUNT))
    if ok_total and isinstance(usage.cost, Cost):
        clean.cost = usage.cost.model_copy()
    return clean


def _call_of(model: Model, message: AssistantMessage) -> CallUsage:
    usage = sane_usage(message.usage)
    if usage.model_dump(exclude={"cost", "total_tokens"}) != {
        k: getattr(message.usage, k, None) for k in ("input", "output", "cache_read", "cache_write")
    }:
        log.warning("%s reported unusable usage %r; recorded as %r", model.ref(), message.usage, usage)
        message.usage = usage  # the turn (context budget calibration, stats) sees the same counts
    return CallUsage(
        model=model.ref(),
        api=model.api,
        usage=usage,
        cost_usd=call_cost(model, usage),
        stop_reason=message.stop_reason,
        attribution=current_attribution(),
        ts_ms=now_ms(),
    )


_PENDING: set[asyncio.Future[AssistantMessage]] = set()


class _Observed(AssistantMessageEventStream):
    """``inner``'s events as they are (same objects, no extra task between producer and consumer),
    with the terminal event and :meth:`result` held until the call's usage was reported."""

    def __init__(self, model: Model, inner: AssistantMessageEventStream) -> None:
        super().__init__()
        self._inner = inner
        self._model = model
        # a task copies the caller's context: the report carries the caller's attribution
        self._reported = asyncio.ensure_future(self._report())
        _PENDING.add(self._reported)  # held until done, even if nobody reads the stream
        self._reported.add_done_callback(_PENDING.discard)

    async def _report(self) -> AssistantMessage:
        final = await self._inner.result()
        await report_usage(_call_of(self._model, final))
        return final

    def push(self, event: AssistantMessageEvent) -> None:
        """Producers push into the provider's own stream, never into this view."""
        raise TypeError("an observed stream is read-only")

    @property
    def ended(self) -> bool:
        """True once the terminal event arrived and the usage was reported."""
        return self._inner.ended and self._reported.done()

    def __aiter__(self) -> AsyncIterator[AssistantMessageEvent]:
        return self._forward()

    async def _forward(self) -> AsyncIterator[AssistantMessageEvent]:
        async for event in self._inner:
            if event.type == "done" or event.type == "error":
                await asyncio.shield(self._reported)
            yield event

    async def result(self) -> AssistantMessage:
        """The final message, once its usage was reported (never raises for provider errors)."""
        return await asyncio.shield(self._reported)


def observed(model: Model, inner: AssistantMessageEventStream) -> AssistantMessageEventStream:
    """A view of ``inner`` that reports the call's usage (:func:`report_usage`) once, when it ends,
    before its terminal event or :meth:`~AssistantMessageEventStream.result` are seen — whether or
    not anyone reads it. Must be called with a running event loop (as
    :func:`runtime.llm.stream.stream` is)."""
    return _Observed(model, inner)

"""Generic structured output: ``complete_structured`` with three tiers, a cached capability probe,
one retry carrying the validation error, and explicit fallbacks
(docs/decisions.md#structured-one-retry).

Tiers, strongest first (docs/decisions.md#structured-tiers):

* ``native`` — the provider's JSON-schema output: ``StreamOptions.output_schema`` (OpenAI strict
  ``json_schema``, Gemini ``responseSchema``); the answer is the message text.
* ``tool`` — a forced tool call whose parameters are the schema (``tool_choice`` = its name);
  the answer is that call's arguments.
* ``prompt`` — the schema in the system prompt; the answer is the message text.

``mode="auto"`` starts at the strongest tier the model is known to support: the
:class:`CapabilityCache` entry for ``(provider, model id)`` (read from its store first, if any),
else ``Model.compat["structured_output"]`` (``native``/``tool``/``prompt``), else ``native``, the
first real call then acting as the probe.
A native request the provider rejects (a 4xx-style capability error) downgrades to the next tier,
records the capability and counts ``STRUCTURED_DOWNGRADES``. A 200 whose body does not follow the
schema at ``native`` (not a ``check`` rule) is evidence
(docs/decisions.md#structured-downgrade-on-evidence): with a caller's ``cache`` it is counted by
:meth:`CapabilityCache.note_invalid` and only the ``downgrade_after``-th in a row moves the model —
before that the call takes its one retry at ``native``; without one (the process-wide
:data:`CAPABILITIES`) the first one moves it. Either way a downgrade continues the call at ``tool``.
:func:`probe_capability` runs the probe explicitly with a tiny schema.

Validation is strict (no coercion, no fence stripping, no JSON extraction from prose). On invalid
output there is exactly one retry that carries the validation error; then an explicit tier: the
caller's safe ``default`` or :class:`StructuredOutputError` (raw output, reason, tier). Every
outcome writes one log record on the ``runtime.reply.structured`` logger (``extra={"structured": {...}}``
with raw output, reason, tier, outcome) and increments ``sessionray_structured_replies_total``
(``mode`` = tier, ``outcome`` ∈ first_try / corrected / default / failed) — every
fallback leaves a structured log and a metric (docs/decisions.md#structured-every-outcome-counted).

The building blocks (:func:`prepare_request`, :func:`extract_raw`, :func:`validate_raw`,
:func:`bounded_call`, :func:`record_outcome`) are public so the IM reply contract
(:mod:`runtime.reply.im_reply`) composes the same pieces with its own correction call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, TypeAlias, TypeVar

from pydantic import BaseModel, ValidationError

from runtime import metrics
from runtime.llm.abort import AbortController, AbortSignal
from runtime.llm.attribution import CallReason, attributed
from runtime.llm.events import AssistantMessageEventStream
from runtime.llm.options import StreamOptions
from runtime.llm.stream import stream as default_stream
from runtime.llm.types import AssistantMessage, Context, Model, TextContent, Tool, UserMessage
from runtime.reply.capability import CAPABILITIES, TIERS, CapabilityCache, Tier, is_capability_error
from runtime.reply.json_schema import strict_json_schema
from runtime.reply.strict_json import json_contract_problem

__all__ = [
    "Check",
    "Outcome",
    "SleepFn",
    "StreamFn",
    "StructuredOutcome",
    "StructuredOutputError",
    "bounded_call",
    "complete_structured",
    "extract_raw",
    "prepare_request",
    "record_outcome",
    "run_structured",
    "schema_instructions",
    "validate_raw",
]

log = logging.getLogger("runtime.reply.structured")

Outcome: TypeAlias = Literal["first_try", "corrected", "default", "failed"]
"""How a structured call ended (the ``outcome`` label of ``STRUCTURED_REPLIES``)."""

StreamFn: TypeAlias = Callable[[Model, Context, StreamOptions | None], AssistantMessageEventStream]
"""``runtime.llm.stream.stream``'s shape; injectable for tests."""
SleepFn: TypeAlias = Callable[[float], Awaitable[Any]]
"""Awaitable timer used for deadlines (``asyncio.sleep`` by default; injectable clock in tests)."""
Check: TypeAlias = Callable[[Any], "str | None"]
"""Extra contract check on a schema-valid value: returns an error text, or ``None`` when fine."""

T = TypeVar("T", bound=BaseModel)


class StructuredOutputError(Exception):
    """Structured output failed after the retry and no default was configured (a domain
    exception with context, never a silent ``None``: docs/decisions.md#structured-one-retry).

    Attributes:
        reason: Why the last attempt failed (validation error text, ``provider error: …``,
            ``timeout``, ``aborted``).
        raw: The raw output of the last attempt (``""`` when there was none).
        tier: The tier of the last attempt.
        output_type: The requested type's name.
    """

    def __init__(self, reason: str, *, raw: str, tier: Tier, output_type: str = "") -> None:
        super().__init__(f"structured output {output_type or '?'} failed at tier {tier}: {reason}")
        self.reason, self.raw, self.tier, self.output_type = reason, raw, tier, output_type


# --------------------------------------------------------------------------- request / response


def schema_instructions(schema: dict[str, Any]) -> str:
    """Return the ``prompt``-tier instruction text that embeds ``schema`` (compact JSON)."""
    return (
        "Answer with exactly one JSON object that follows this JSON Schema. Output only the JSON: "
        "no prose before or after it, no Markdown code fences.\nJSON Schema: "
        + json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
    )


def prepare_request(
    context: Context,
    options: StreamOptions | None,
    tier: Tier,
    schema: dict[str, Any],
    name: str,
    *,
    keep_tools: bool = False,
    tool_description: str = "Return the final answer as the arguments of this tool.",
) -> tuple[Context, StreamOptions]:
    """Return the context and options of a request for ``tier`` (inputs are not mutated).

    Args:
        context: The caller's context.
        options: Per-call template (``None``: defaults).
        tier: ``native`` sets ``output_schema``/``output_schema_name``; ``tool`` adds a tool named
            ``name`` with ``schema`` as parameters and forces it (``tool_choice=name``) unless
            ``keep_tools``, in which case the caller's tools stay and ``tool_choice`` is
            ``"required"`` (an agent turn whose final answer is the output tool); ``prompt``
            appends :func:`schema_instructions` to the system prompt.
        schema: The JSON Schema of the output.
        name: Schema/tool name (``[a-zA-Z0-9_-]``, ≤ 64 chars).
        keep_tools: Keep ``context.tools`` (agent turns); ``False`` for one-shot calls.
        tool_description: Description of the output tool (``tool`` tier).
    """
    opts = replace(options) if options is not None else StreamOptions()
    if tier == "native":
        ctx = context.model_copy(update={"tools": context.tools if keep_tools else None})
        opts.output_schema, opts.output_schema_name = schema, name
        return ctx, opts
    if tier == "tool":
        tool = Tool(name=name, description=tool_description, parameters=schema)
        others = [t for t in (context.tools or []) if t.name != name] if keep_tools else []
        opts.tool_choice = "required" if keep_tools and others else name
        return context.model_copy(update={"tools": [*others, tool]}), opts
    system = (context.system_prompt + "\n\n" if context.system_prompt else "") + schema_instructions(schema)
    ctx = context.model_copy(update={"system_prompt": system, "tools": context.tools if keep_tools else None})
    return ctx, opts


def extract_raw(message: AssistantMessage, tier: Tier, name: str) -> tuple[str, str | None]:
    """Return ``(raw, problem)`` for the answer of ``message`` at ``tier``.

    ``native``/``prompt``: the concatenated text blocks (thinking is never part of the answer).
    ``tool``: the arguments of the first call named ``name`` as compact JSON; ``problem`` is set
    when there is no such call (raw is then the message text, for the record).
    """
    if tier == "tool":
        for call in message.tool_calls():
            if call.name == name:
                return json.dumps(call.arguments, ensure_ascii=False), None
        return message.text(), f"no call of the output tool {name!r}"
    return message.text(), None


def _error_text(err: ValidationError) -> str:
    lines = []
    for e in err.errors(include_url=False):
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        lines.append(f"{loc}: {e['msg']}")
    return "; ".join(lines)


def validate_raw(output_type: type[T], raw: str, check: Check | None = None) -> tuple[T | None, str | None]:
    """Strictly validate ``raw`` JSON text as ``output_type``; return ``(value, None)`` or ``(None, error)``.

    Strict JSON mode: no coercion, no fence stripping, no extraction from prose
    (docs/decisions.md#reply-strict-validation), and no duplicate keys, ``NaN``/``Infinity`` or
    overflowing numbers (:mod:`runtime.reply.strict_json`). ``check`` runs on a schema-valid value
    for rules a schema cannot express (mention identity).
    """
    problem = json_contract_problem(raw)
    if problem is not None:
        return None, f"(root): Invalid JSON: {problem}"
    try:
        value = output_type.model_validate_json(raw, strict=True)
    except ValidationError as err:
        return None, _error_text(err)
    if check is not None:
        problem = check(value)
        if problem:
            return None, problem
    return value, None


async def bounded_call(
    model: Model,
    context: Context,
    options: StreamOptions,
    *,
    timeout: float | None = None,
    sleep: SleepFn = asyncio.sleep,
    stream_fn: StreamFn | None = None,
    reason: CallReason | None = None,
) -> AssistantMessage:
    """Run one LLM call, bounded by ``timeout`` seconds and the caller's ``options.signal``;
    ``reason`` narrows the call's attribution (docs/decisions.md#spend-ledger; ``None``: kept).

    Returns the final message. On timeout or cancellation the call is aborted (its own
    signal fires) and a message with ``stop_reason`` ``error`` (``error_message="timeout after
    N s"``) or ``aborted`` is returned at once; nothing raises for provider failures.
    ``sleep`` is the deadline timer (injectable clock for tests).
    """
    own = AbortController()
    opts = replace(options, signal=AbortSignal.any(options.signal, own.signal))
    fn = stream_fn or default_stream
    with attributed(reason=reason) if reason else contextlib.nullcontext():  # the task copies it
        result = asyncio.ensure_future(fn(model, context, opts).result())
    waiters: dict[asyncio.Future[Any], str] = {result: "done"}
    if timeout is not None:
        waiters[asyncio.ensure_future(sleep(timeout))] = "timeout"
    if options.signal is not None:
        waiters[asyncio.ensure_future(options.signal.wait())] = "aborted"
    try:
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in waiters:
            if fut is not result and not fut.done():
                fut.cancel()
    if result in done:
        return result.result()
    why = "aborted" if any(waiters[f] == "aborted" for f in done) else "timeout"
    own.abort(why)
    result.cancel()
    if why == "aborted":
        return AssistantMessage.error_for(model, "aborted", aborted=True)
    return AssistantMessage.error_for(model, f"timeout after {timeout} s")


def record_outcome(
    tier: Tier,
    outcome: Outcome,
    *,
    raw: str,
    reason: str | None,
    output_type: str,
    **extra: Any,
) -> None:
    """Write the one structured log record of a structured call and count it (raw output,
    failure reason and fallback tier — all three, every time:
    docs/decisions.md#structured-every-outcome-counted).

    Log level: INFO for ``first_try``/``corrected``, WARNING for ``default``/``failed``.
    Counter: ``STRUCTURED_REPLIES(mode=tier, outcome=outcome)``.
    """
    metrics.STRUCTURED_REPLIES.inc(mode=tier, outcome=outcome)
    record = {
        "tier": tier,
        "outcome": outcome,
        "reason": reason,
        "raw": raw,
        "output_type": output_type,
        **extra,
    }
    level = logging.INFO if outcome in ("first_try", "corrected") else logging.WARNING
    log.log(
        level,
        "structured output %s at tier %s: %s",
        outcome,
        tier,
        reason or "ok",
        extra={"structured": record},
    )


# --------------------------------------------------------------------------- the generic flow


@dataclass
class StructuredOutcome(Generic[T]):
    """The full story of one structured call.

    Attributes:
        value: The validated value, the default, or ``None`` when ``outcome == "failed"``.
        tier: The tier of the last attempt.
        outcome: ``first_try`` | ``corrected`` | ``default`` | ``failed``.
        raw: Raw output of the last attempt.
        reason: Why the last invalid attempt failed (``None`` on first-try success).
        calls: LLM calls made (probe downgrades and the retry included).
        downgrades: ``(from_tier, to_tier)`` pairs, in order.
    """

    value: T | None
    tier: Tier
    outcome: Outcome
    raw: str = ""
    reason: str | None = None
    calls: int = 0
    downgrades: list[tuple[Tier, Tier]] = field(default_factory=list)


def _retry_context(context: Context, tier: Tier, raw: str, error: str) -> Context:
    """Seed 003 §07 change 3: feed the validation error back once."""
    note = (
        "Your previous answer was not valid for the required schema.\n"
        f"Error: {error}\nPrevious answer:\n{raw}\n\n"
        "Answer again with only the corrected JSON object."
    )
    messages = [*context.messages, UserMessage(content=[TextContent(text=note)])]
    return context.model_copy(update={"messages": messages})


def _tiers_for(model: Model, mode: Tier | Literal["auto"], cache: CapabilityCache) -> list[Tier]:
    if mode != "auto":
        return [mode]
    start = cache.get(model) or "native"
    return list(TIERS[TIERS.index(start) :])


@dataclass
class _StructuredRun(Generic[T]):
    """One :func:`run_structured` call: what it asks for, and the :class:`StructuredOutcome` it
    builds as it goes down the tiers."""

    model: Model
    output_type: type[T]
    name: str
    """Name sent with the schema / of the output tool."""
    default: T | None
    cache: CapabilityCache
    counts_evidence: bool
    """A caller's cache: off-schema answers count against its ``downgrade_after``."""
    check: Check | None
    retry_timeout: float | None
    sleep: SleepFn
    stream_fn: StreamFn | None
    out: StructuredOutcome[T]

    def finish(self, outcome: Outcome, value: T | None, raw: str, reason: str | None) -> StructuredOutcome[T]:
        """Set the outcome, and log and count it (:func:`record_outcome`)."""
        out = self.out
        out.value, out.outcome, out.raw, out.reason = value, outcome, raw, reason
        name = self.output_type.__name__
        record_outcome(out.tier, outcome, raw=raw, reason=reason, output_type=name, calls=out.calls)
        return out

    def fallback(self, raw: str, reason: str) -> StructuredOutcome[T]:
        """The caller's ``default`` (never for an abort), else ``failed``."""
        if self.default is not None and reason != "aborted":
            return self.finish("default", self.default, raw, reason)
        return self.finish("failed", None, raw, reason)

    async def downgrade(self, src: Tier, dst: Tier, reason: str, raw: str = "") -> None:
        """Move the model from ``src`` to ``dst`` (stored, logged and counted by the cache)."""
        self.out.downgrades.append((src, dst))
        await self.cache.downgrade(self.model, src, reason, raw)

    async def off_schema(self, raw: str, error: str) -> bool:
        """Evidence against ``native``; whether the model moved to ``tool`` (module docstring)."""
        if not self.counts_evidence:
            await self.downgrade("native", "tool", f"answer ignored the schema: {error}", raw)
            return True
        if await self.cache.note_invalid(self.model, "native", raw, error):  # stored, logged and counted
            self.out.downgrades.append(("native", "tool"))
            return True
        return False

    async def at_tier(
        self, ctx: Context, opts: StreamOptions, tier: Tier, next_tier: Tier | None
    ) -> StructuredOutcome[T] | None:
        """One call at ``tier``, then its one retry when the answer is invalid. None: the call
        goes on at ``next_tier`` (a capability error, or off-schema evidence that moved it)."""
        msg = await bounded_call(self.model, ctx, opts, sleep=self.sleep, stream_fn=self.stream_fn)
        self.out.calls += 1
        if msg.stop_reason == "aborted":
            return self.fallback(msg.text(), "aborted")
        if msg.stop_reason == "error":
            if next_tier is not None and is_capability_error(msg.error_message):
                await self.downgrade(tier, next_tier, f"provider error: {msg.error_message}")
                return None
            return self.fallback(msg.text(), f"provider error: {msg.error_message}")
        raw, problem = extract_raw(msg, tier, self.name)
        value, error = (None, problem) if problem else validate_raw(self.output_type, raw, self.check)
        if value is not None:
            self.cache.record(self.model, tier)
            if self.counts_evidence:
                await self.cache.note_valid(self.model, tier)  # the off-schema streak restarts
            return self.finish("first_try", value, raw, None)
        if (  # a 200 that does not follow the native schema (a ``check`` rule is no evidence)
            tier == "native"
            and next_tier is not None
            and validate_raw(self.output_type, raw)[0] is None
            and await self.off_schema(raw, error or "invalid")
        ):
            return None
        return await self.retry(ctx, opts, tier, raw, error)

    async def retry(
        self, ctx: Context, opts: StreamOptions, tier: Tier, raw: str, error: str | None
    ) -> StructuredOutcome[T]:
        """Exactly one retry carrying the validation error (docs/decisions.md#structured-one-retry):
        ``corrected`` when its answer is valid, else the fallback."""
        retry = await bounded_call(
            self.model,
            _retry_context(ctx, tier, raw, error or "invalid"),
            opts,
            timeout=self.retry_timeout,
            sleep=self.sleep,
            stream_fn=self.stream_fn,
            reason="correction",
        )
        self.out.calls += 1
        if retry.stop_reason == "aborted":
            return self.fallback(retry.text(), "aborted")
        if retry.stop_reason == "error":
            return self.fallback(retry.text(), f"retry failed: {retry.error_message}")
        raw2, problem2 = extract_raw(retry, tier, self.name)
        value2, error2 = (None, problem2) if problem2 else validate_raw(self.output_type, raw2, self.check)
        if value2 is not None:
            self.cache.record(self.model, tier)
            return self.finish("corrected", value2, raw2, error)
        return self.fallback(raw2, error2 or "invalid")


async def run_structured(
    model: Model,
    context: Context,
    output_type: type[T],
    *,
    mode: Tier | Literal["auto"] = "auto",
    options: StreamOptions | None = None,
    default: T | None = None,
    cache: CapabilityCache | None = None,
    check: Check | None = None,
    retry_timeout: float | None = 30.0,
    sleep: SleepFn = asyncio.sleep,
    stream_fn: StreamFn | None = None,
    schema_name: str | None = None,
) -> StructuredOutcome[T]:
    """Like :func:`complete_structured` but returns the whole :class:`StructuredOutcome` and never
    raises for an invalid output (``outcome == "failed"`` then, ``value is None``)."""
    counts_evidence = cache is not None  # a caller's cache applies its ``downgrade_after``
    cache = cache if cache is not None else CAPABILITIES
    if mode == "auto":
        await cache.resolve(model)  # a store-backed cache reads what other processes stored
    name = schema_name or output_type.__name__
    schema = strict_json_schema(output_type)
    tiers = _tiers_for(model, mode, cache)
    base = options or StreamOptions()
    out: StructuredOutcome[T] = StructuredOutcome(value=None, tier=tiers[0], outcome="failed")
    run = _StructuredRun(
        model, output_type, name, default, cache, counts_evidence, check, retry_timeout, sleep, stream_fn, out
    )
    for i, tier in enumerate(tiers):
        out.tier = tier
        ctx, opts = prepare_request(context, base, tier, schema, name)
        done = await run.at_tier(ctx, opts, tier, tiers[i + 1] if i + 1 < len(tiers) else None)
        if done is not None:
            return done
    return run.fallback("", "no tier left")  # pragma: no cover - the loop always returns


async def complete_structured(
    model: Model,
    context: Context,
    output_type: type[T],
    *,
    mode: Tier | Literal["auto"] = "auto",
    options: StreamOptions | None = None,
    default: T | None = None,
    cache: CapabilityCache | None = None,
    check: Check | None = None,
    retry_timeout: float | None = 30.0,
    sleep: SleepFn = asyncio.sleep,
    stream_fn: StreamFn | None = None,
    schema_name: str | None = None,
) -> T:
    """Ask ``model`` for an instance of the pydantic type ``output_type``
    (docs/decisions.md#structured-tiers).

    Args:
        model: The model to call.
        context: System prompt and messages (its tools are not offered: this is a one-shot call).
        output_type: Any pydantic model class; its JSON Schema is generated, never hand-written.
        mode: ``native`` | ``tool`` | ``prompt`` to force a tier (no downgrade), or ``auto``.
        options: Per-call template (signal, api key, timeouts…); ``output_schema``/``tool_choice``
            are set per tier.
        default: Safe default returned (outcome ``default``) when the retry also fails, e.g.
            ``IntentResult(intent="UNKNOWN", confidence=0.0, slots={}, need_human=True)``.
        cache: Capability cache; off-schema ``native`` answers count against its
            ``downgrade_after`` (a session's is store-backed, with ``ai.downgrade_after``).
            Default: the process-wide :data:`CAPABILITIES`, where the first one moves to ``tool``.
        check: Extra rule on a schema-valid value (returns an error text or ``None``).
        retry_timeout: Bound of the retry call in seconds (``None``: unbounded).
        sleep: Deadline timer (injectable clock).
        stream_fn: Replaces :func:`runtime.llm.stream.stream` (tests, wrappers).
        schema_name: Name sent with the schema / of the output tool (default: the class name).

    Returns:
        The validated value (or ``default``).

    Raises:
        StructuredOutputError: the output stayed invalid (or the provider failed, or the call was
            cancelled) and no ``default`` was given; carries ``raw``, ``reason`` and ``tier``.
            Cancellation raises even with a default.
    """
    out = await run_structured(
        model,
        context,
        output_type,
        mode=mode,
        options=options,
        default=default,
        cache=cache,
        check=check,
        retry_timeout=retry_timeout,
        sleep=sleep,
        stream_fn=stream_fn,
        schema_name=schema_name,
    )
    if out.value is None:
        raise StructuredOutputError(
            out.reason or "invalid", raw=out.raw, tier=out.tier, output_type=output_type.__name__
        )
    return out.value

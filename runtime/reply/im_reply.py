"""The IM reply contract for an agent turn (docs/decisions.md#reply-segments).

Entry point for the turn runner — three steps around the ordinary agent loop::

    contract = ImReplyContract(model, output_schema="segments", config=ImReplyConfig(...))
    loop_config = contract.configure(AgentLoopConfig(model=model, ...))   # 1. before the loop
    ...run agent_loop with loop_config; keep the last AssistantMessage as ``final``...
    identity = MentionIdentity.from_messages(sender_id, context_messages)
    outcome = await contract.finalize(final, identity, signal=turn_signal)   # 2. after the loop
    preview.release(outcome)                                                  # 3. publish
    → outcome.reply (a validated Reply) goes to media/leak checks and delivery.

If the loop ended because its LLM-call budget was spent (``agent_end.reason == "max_iterations"``,
the last message still asks for tools), call ``await contract.summarize(messages, identity,
signal=…)`` instead of ``finalize``: one more call with the history and no business tools whose
answer uses the same schema (docs/decisions.md#reply-final-output).

How the final answer is requested per tier (the tier comes from the capability cache shared with
:mod:`runtime.reply.structured`; ``Model.compat["structured_output"]`` seeds it; default ``native``):

* ``native``: every LLM call of the turn carries ``output_schema`` = ``Reply.model_json_schema()``;
  intermediate tool calls keep their own schemas; the final text is the reply JSON.
* ``tool``: a ``reply`` tool whose parameters are the Reply schema is added next to the business
  tools and ``tool_choice="required"`` (or ``"reply"`` without business tools); the wrapped
  ``stream_fn`` turns a lone ``reply`` call into the message's text, so the loop stops there and
  never "executes" it.
* ``prompt``: the schema is appended to the system prompt.

Every tier also gets :data:`IM_INSTRUCTIONS` (docs/decisions.md#reply-mention-identity).

``finalize`` validates strictly (``Reply.model_validate_json`` + mention identity). On failure it
makes exactly one **format-correction call** (docs/decisions.md#reply-one-correction): the invalid
output and the error, no session history, no business tools, bounded by ``correction_timeout_s``
(30 s), aborted with the turn's signal, never re-running tools, never truncating (the whole raw
output is sent and the output budget is raised to fit it). If that is still invalid — or the
provider failed, or the summary call failed — the user gets the host's fixed ``failure_text``; never
a valid part, never raw JSON. A cancelled turn sends nothing. Each outcome writes one log record and
counts ``sessionray_structured_replies_total{mode=tier, outcome}`` (``first_try``, ``corrected``,
``failed``); the fixed failure message is counted as ``failed``.

Downgrades (docs/decisions.md#structured-downgrade-on-evidence): a provider error that reads as a
rejected feature moves the model to the next tier at once; a first answer that does not validate
against the Reply schema (not a mention or provenance rule) counts as evidence, and
``CapabilityCache.downgrade_after`` such answers in a row move it too. Either is stored through
the cache (shared by every process when it has a store) and helps the next turn; the current turn
still gets its one correction call.

``output_schema=False`` is plain-text mode: the final text is one ``text`` segment and ``@name``
in it never becomes a mention (no counter: there is no contract to fail). Sub-agents and non-IM
entry points simply do not use this module (the IM preset is not inherited).

Thinking is never part of the reply: only text blocks (or the ``reply`` call) are read.
A streaming preview is published only after validation (:class:`ReplyPreview`): half JSON is
never shown.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel

from runtime.llm.abort import AbortSignal
from runtime.llm.events import AssistantMessageEventStream, DoneEvent, run_stream
from runtime.llm.options import StreamOptions
from runtime.llm.stream import stream as default_stream
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Context,
    Model,
    TextContent,
    UserMessage,
)
from runtime.reply.capability import CAPABILITIES, CapabilityCache, Tier, is_capability_error
from runtime.reply.mentions import MentionIdentity
from runtime.reply.preview import ReplyPreview
from runtime.reply.segments import Reply
from runtime.reply.structured import (
    Outcome,
    SleepFn,
    StreamFn,
    bounded_call,
    extract_raw,
    prepare_request,
    record_outcome,
    validate_raw,
)

__all__ = [
    "CORRECTION_SYSTEM_PROMPT",
    "IM_INSTRUCTIONS",
    "LONG_REPLY_CHARS",
    "REPLY_TOOL",
    "ImReplyConfig",
    "ImReplyContract",
    "MentionIdentity",
    "OutputSchema",
    "ReplyOutcome",
    "ReplyPreview",
]

log = logging.getLogger("runtime.reply.im_reply")

OutputSchema: TypeAlias = Literal["segments"] | Literal[False]
"""Config ``ai.agent.output_schema``: ``segments`` (the IM preset) or ``False`` (plain text)."""

REPLY_TOOL = "reply"
"""Name of the output tool in the ``tool`` tier (and of the schema in the ``native`` tier)."""
LONG_REPLY_CHARS = 32_000
"""Seed 000: a reply longer than this is still corrected whole, never truncated."""

IM_INSTRUCTIONS = (
    "Your final answer is sent to an IM chat as an ordered list of message segments: a JSON object "
    '{"segments": [...]} following the reply schema. Use "text" or "markdown" for words, '
    '"mention" with data.target = the platform user id to notify someone (the sender\'s id is in '
    "the [sender:id=...] prefix; other ids only from this conversation or a member-lookup tool; "
    "writing @name in text notifies nobody). Never guess an id from a nickname: ask in text instead. "
    "Attach media only with references you were given. "
    '{"segments": []} means no reply is needed.'
)
"""System-prompt addition of the IM preset (all tiers)."""

CORRECTION_SYSTEM_PROMPT = (
    "You repair the format of a chat reply. You get a reply that does not follow the required "
    "JSON schema and the validation error. Return the same reply, with the same content and "
    "segment order, as one JSON object that follows the schema. Do not shorten it, do not add "
    "anything, do not call any tool other than the reply tool when one is offered. If a mention "
    "target is not a known user id, turn that mention into plain text."
)
"""System prompt of the format-correction call (docs/decisions.md#reply-one-correction)."""


@dataclass
class ImReplyConfig:
    """Knobs of the IM reply contract.

    Attributes:
        failure_text: The host's fixed failure message (docs/decisions.md#reply-fixed-failure).
        correction_timeout_s: Bound of the format-correction call in seconds (30 s).
        sleep: Timer for that bound (injectable clock for tests).
        add_instructions: Append :data:`IM_INSTRUCTIONS` to the system prompt of every call.
    """

    failure_text: str = "Sorry, something went wrong while answering. Please try again."
    correction_timeout_s: float = 30.0
    sleep: SleepFn = asyncio.sleep
    add_instructions: bool = True


@dataclass
class ReplyOutcome:
    """What a turn's final answer became.

    Attributes:
        reply: The validated reply to send (the fixed failure message on failure, empty when the
            turn was cancelled or the model chose not to reply).
        tier: ``native`` | ``tool`` | ``prompt``, or ``plain`` in plain-text mode.
        outcome: ``first_try`` | ``corrected`` | ``failed`` | ``plain`` | ``aborted``.
        raw: Raw output of the last attempt.
        reason: Why the first attempt was invalid (``None`` on first-try success).
        calls: LLM calls made here (0, 1 for the correction or summary, 2 for both).
        value: A custom schema's validated instance (``reply`` is then empty; ``None`` for the IM
            preset or a failure: :class:`runtime.reply.custom_output.CustomOutputContract`).
    """

    reply: Reply
    tier: Tier | Literal["plain"]
    outcome: Outcome | Literal["plain", "aborted"]
    raw: str = ""
    reason: str | None = None
    calls: int = 0
    value: Any = None


def _reply_call_to_text(message: AssistantMessage, name: str = REPLY_TOOL) -> AssistantMessage:
    """Tool tier: a lone call of the output tool ``name`` becomes the message's text (the loop then
    stops); next to business calls it is dropped (the final answer comes after their results)."""
    calls = message.tool_calls()
    mine = [c for c in calls if c.name == name]
    if not mine:
        return message
    rest = [b for b in message.content if not (getattr(b, "type", "") == "toolCall" and b in mine)]
    if len(mine) == len(calls):
        text = json.dumps(mine[0].arguments, ensure_ascii=False)
        kept = [b for b in rest if not isinstance(b, TextContent)]
        return message.model_copy(update={"content": [*kept, TextContent(text=text)], "stop_reason": "stop"})
    return message.model_copy(update={"content": rest})


class ImReplyContract:
    """The IM reply contract of one session/turn (see the module docstring for the flow).

    Subclasses swap the answer type (:class:`runtime.reply.custom_output.CustomOutputContract`)
    through the class attributes and :meth:`_validate` / :meth:`_outcome` / :meth:`_failure_reply`.

    Args:
        model: The session's chat model.
        output_schema: ``"segments"`` (default IM preset) or ``False`` (plain text).
        config: :class:`ImReplyConfig`.
        cache: Capability cache (default: the process-wide one).
        stream_fn: The underlying stream function (default :func:`runtime.llm.stream.stream`).
        options: Template of per-call options for the correction/summary calls (api key,
            headers); the turn's signal is filled in per call.

    Raises:
        ValueError: ``output_schema`` is neither ``"segments"`` nor ``False`` (a custom schema is
            :class:`runtime.reply.custom_output.CustomOutputContract`).
    """

    tool_name: str = REPLY_TOOL  # the output tool (tool tier) and the schema's name (native tier)
    tool_description: str = "Send your final answer to the chat: the ordered message segments."
    instructions: str | None = IM_INSTRUCTIONS  # added to every call's system prompt (None: nothing)
    correction_prompt: str = CORRECTION_SYSTEM_PROMPT

    def __init__(
        self,
        model: Model,
        output_schema: OutputSchema = "segments",
        *,
        config: ImReplyConfig | None = None,
        cache: CapabilityCache | None = None,
        stream_fn: StreamFn | None = None,
        options: StreamOptions | None = None,
    ) -> None:
        if output_schema not in ("segments", False):
            raise ValueError(f"output_schema must be 'segments' or False, got {output_schema!r}")
        self.model = model
        self.output_schema: OutputSchema = output_schema
        self.config = config or ImReplyConfig()
        self.cache = cache if cache is not None else CAPABILITIES
        self.base_stream_fn: StreamFn = stream_fn or default_stream
        self.options = options
        self.output_type: type[BaseModel] = Reply
        self.schema = Reply.model_json_schema()
        self.tier: Tier = self.cache.get(model) or "native"

    # ------------------------------------------------------------------ before the loop
    def prepare(self, context: Context, options: StreamOptions | None) -> tuple[Context, StreamOptions]:
        """Return the context/options of one in-loop LLM call for the current tier (business tools
        kept; see the module docstring). Plain-text mode returns them unchanged (copied)."""
        if self.output_schema is False:
            return context, replace(options) if options is not None else StreamOptions()
        ctx, opts = prepare_request(
            context,
            options,
            self.tier,
            self.schema,
            self.tool_name,
            keep_tools=True,
            tool_description=self.tool_description,
        )
        if self.config.add_instructions and self.instructions:
            ctx = ctx.model_copy(update={"system_prompt": _join(ctx.system_prompt, self.instructions)})
        return ctx, opts

    def stream_fn(
        self, model: Model, context: Context, options: StreamOptions | None
    ) -> AssistantMessageEventStream:
        """An ``AgentLoopConfig.stream_fn``: requests the reply per tier; in the ``tool`` tier the
        final ``reply`` call is turned into text so the loop ends without executing it."""
        ctx, opts = self.prepare(context, options)
        inner = self.base_stream_fn(model, ctx, opts)
        if self.output_schema is False or self.tier != "tool":
            return inner

        async def producer(out: AssistantMessageEventStream) -> None:
            async for ev in inner:
                if isinstance(ev, DoneEvent):
                    msg = _reply_call_to_text(ev.message, self.tool_name)
                    reason = (
                        "toolUse" if msg.tool_calls() else ("stop" if ev.reason == "toolUse" else ev.reason)
                    )
                    ev = DoneEvent(reason=reason, message=msg)
                out.push(ev)

        def crash(exc: BaseException) -> AssistantMessage:
            return AssistantMessage.error_for(model, str(exc))

        return run_stream(producer, crash)

    def configure(self, loop_config: Any) -> Any:
        """Return a copy of an ``AgentLoopConfig`` whose ``stream_fn`` applies this contract (the
        original ``stream_fn`` becomes the underlying one)."""
        self.base_stream_fn = loop_config.stream_fn
        return replace(loop_config, stream_fn=self.stream_fn)

    # ------------------------------------------------------------------ after the loop
    async def finalize(
        self,
        final: AssistantMessage | None,
        identity: MentionIdentity | None = None,
        *,
        signal: AbortSignal | None = None,
    ) -> ReplyOutcome:
        """Turn the loop's last assistant message into a validated :class:`ReplyOutcome`.

        Args:
            final: The last assistant message of the run (``None``: the loop produced none).
            identity: Who may be mentioned (default: nobody).
            signal: The turn's cancellation signal (the correction call honours it).

        Never raises for model misbehaviour; see the module docstring for the outcomes.
        """
        identity = identity or MentionIdentity()
        if self.output_schema is False:
            text = final.text() if final is not None and final.stop_reason not in ("error", "aborted") else ""
            if final is not None and final.stop_reason == "error":
                return self._fixed(
                    "plain", "plain", "", f"provider error: {final.error_message}", count=False
                )
            if final is None or final.stop_reason == "aborted" or (signal is not None and signal.aborted):
                return ReplyOutcome(Reply(segments=[]), "plain", "aborted", text, "aborted")
            reply = Reply.of_text(text) if text.strip() else Reply(segments=[])
            return ReplyOutcome(reply, "plain", "plain", text, None)
        tier = self.tier
        if final is None or final.stop_reason == "aborted" or (signal is not None and signal.aborted):
            return self._aborted(tier, final.text() if final else "")
        if final.stop_reason == "error":
            if is_capability_error(final.error_message) and tier != "prompt":
                await self._downgrade(tier, f"provider error: {final.error_message}")
            return self._fixed(tier, "failed", "", f"provider error: {final.error_message}")
        raw, problem = extract_raw(final, "tool" if final.tool_calls() else "native", self.tool_name)
        valid, error = self._validate(raw, identity)
        if problem is None and valid is not None and final.stop_reason != "length":
            await self.cache.note_valid(self.model, tier)
            return self._done(tier, "first_try", valid, raw, None, 0)
        error = problem or error
        if final.stop_reason == "length":
            error = f"the reply was cut off by the output budget ({error or 'incomplete'})"
        elif (
            problem is not None or validate_raw(self.output_type, raw)[0] is None
        ) and await self.cache.note_invalid(self.model, tier, raw, error or "invalid"):
            # off-schema (not a mention/provenance rule) is evidence against this tier; the
            # downgrade helps the next turn, this one still gets its correction call
            # (docs/decisions.md#structured-downgrade-on-evidence)
            self.tier = self.cache.get(self.model) or self.tier
        return await self._correct(tier, raw, error or "invalid", identity, signal, calls=0)

    async def summarize(
        self,
        messages: Sequence[AgentMessage],
        identity: MentionIdentity | None = None,
        *,
        system_prompt: str = "",
        signal: AbortSignal | None = None,
        convert_to_llm: Callable[[list[AgentMessage]], Any] | None = None,
    ) -> ReplyOutcome:
        """The final answer after the tool budget ran out: one call with the history (converted
        messages: user, assistant, tool results) and no business tools, answering in the same
        schema; then :meth:`finalize` (with its correction call). A failed summary call gives the
        fixed failure message (docs/decisions.md#reply-fixed-failure).

        ``convert_to_llm`` is the session's converter (sync or async, e.g. the one that renders the
        sender prefix); default :func:`runtime.agent.replay.default_convert_to_llm`."""
        from runtime.agent.config import resolve
        from runtime.agent.replay import default_convert_to_llm, prepare_replay

        note = UserMessage(
            content="The tool budget for this turn is spent. Do not call tools; give the final answer now."
        )
        convert = convert_to_llm or default_convert_to_llm
        llm = list(prepare_replay(list(await resolve(convert([*messages, note])))))
        ctx = Context(system_prompt=system_prompt, messages=list(llm), tools=None)
        c, o = self.prepare(ctx, self._opts(signal))
        if self.output_schema is not False and self.tier != "tool":
            c = c.model_copy(update={"tools": None})
        msg = await bounded_call(self.model, c, o, stream_fn=self.base_stream_fn)
        if self.output_schema is not False and self.tier == "tool":
            msg = _reply_call_to_text(msg, self.tool_name)
        if msg.stop_reason == "error" and self.output_schema is not False:
            return self._fixed(
                self.tier, "failed", msg.text(), f"summary call failed: {msg.error_message}", calls=1
            )
        out = await self.finalize(msg, identity, signal=signal)
        out.calls += 1
        return out

    def _validate(self, raw: str, identity: MentionIdentity) -> tuple[Any, str | None]:
        """Strict validation with the contract's rules: ``(value, None)`` or ``(None, error)``."""
        return validate_raw(Reply, raw, identity.check)

    def _outcome(
        self, tier: Tier, outcome: Outcome, value: Any, raw: str, why: str | None, calls: int
    ) -> Any:
        """The :class:`ReplyOutcome` of a validated answer ``value``."""
        return ReplyOutcome(value, tier, outcome, raw, why, calls)

    def _failure_reply(self) -> Reply:
        """What the chat gets when the answer failed: the fixed failure message."""
        return Reply.of_text(self.config.failure_text)

    # ------------------------------------------------------------------ internals
    def _opts(self, signal: AbortSignal | None) -> StreamOptions:
        opts = replace(self.options) if self.options is not None else StreamOptions()
        opts.signal = signal
        opts.output_schema, opts.tool_choice = None, None
        return opts

    def _correction_request(self, tier: Tier, raw: str, error: str) -> tuple[Context, StreamOptions]:
        body = (
            f"Validation error: {error}\n\n"
            f"Invalid reply ({len(raw)} characters, complete, do not shorten it):\n{raw}"
        )
        ctx = Context(system_prompt=self.correction_prompt, messages=[UserMessage(content=body)], tools=None)
        ctx, opts = prepare_request(ctx, self._opts(None), tier, self.schema, self.tool_name)
        # never truncate: raise the output budget to fit the whole reply (≈ 1 token per char at
        # worst), within the model's declared output ceiling (compat "max_output_tokens") if any;
        # a correction cut off by the budget is treated as invalid, never sent.
        budget = max(opts.max_tokens or self.model.max_tokens, len(raw) + 512)
        ceiling = self.model.compat.get("max_output_tokens")
        opts.max_tokens = min(budget, ceiling) if isinstance(ceiling, int) and ceiling > 0 else budget
        return ctx, opts

    async def _correct(
        self,
        tier: Tier,
        raw: str,
        error: str,
        identity: MentionIdentity,
        signal: AbortSignal | None,
        *,
        calls: int,
    ) -> ReplyOutcome:
        """Seed 000: at most one format-correction call, then the fixed failure message."""
        ctx, opts = self._correction_request(tier, raw, error)
        opts.signal = signal
        msg = await bounded_call(
            self.model,
            ctx,
            opts,
            timeout=self.config.correction_timeout_s,
            sleep=self.config.sleep,
            stream_fn=self.base_stream_fn,
            reason="correction",  # docs/decisions.md#spend-ledger
        )
        calls += 1
        if msg.stop_reason == "aborted" or (signal is not None and signal.aborted):
            record_outcome(
                tier,
                "failed",
                raw=raw,
                reason=f"{error}; correction aborted",
                output_type=self.output_type.__name__,
                calls=calls,
            )
            return self._aborted(tier, raw, calls)
        if msg.stop_reason == "error":
            return self._fixed(
                tier, "failed", raw, f"{error}; correction failed: {msg.error_message}", calls=calls
            )
        raw2, problem = extract_raw(msg, tier, self.tool_name)
        reply, error2 = (None, problem) if problem else self._validate(raw2, identity)
        if reply is not None and msg.stop_reason != "length":
            return self._done(tier, "corrected", reply, raw2, error, calls)
        why = error2 or ("the correction was cut off" if msg.stop_reason == "length" else "invalid")
        return self._fixed(tier, "failed", raw2, f"{error}; correction still invalid: {why}", calls=calls)

    async def _downgrade(self, tier: Tier, reason: str) -> None:
        # stored, logged and counted by the cache; a contract that lives across turns follows at once
        self.tier = await self.cache.downgrade(self.model, tier, reason)

    def _done(
        self, tier: Tier, outcome: Outcome, value: Any, raw: str, reason: str | None, calls: int
    ) -> ReplyOutcome:
        record_outcome(
            tier, outcome, raw=raw, reason=reason, output_type=self.output_type.__name__, calls=calls
        )
        return self._outcome(tier, outcome, value, raw, reason, calls)

    def _fixed(
        self,
        tier: Tier | Literal["plain"],
        outcome: Outcome | Literal["plain"],
        raw: str,
        reason: str,
        *,
        calls: int = 0,
        count: bool = True,
    ) -> ReplyOutcome:
        if count and tier != "plain":
            record_outcome(
                tier, "failed", raw=raw, reason=reason, output_type=self.output_type.__name__, calls=calls
            )
        else:
            log.warning("IM reply failed (%s): %s", tier, reason)
        return ReplyOutcome(self._failure_reply(), tier, outcome, raw, reason, calls)

    def _aborted(self, tier: Tier, raw: str, calls: int = 0) -> ReplyOutcome:
        log.info("IM reply: turn cancelled; nothing is sent (tier %s)", tier)
        return ReplyOutcome(Reply(segments=[]), tier, "aborted", raw, "aborted", calls)


def _join(base: str, extra: str) -> str:
    return f"{base}\n\n{extra}" if base else extra

"""The agent part of one IM turn, without Ray (docs/decisions.md#session-turn-records).

:func:`run_agent` runs the agent loop for a turn whose user message is already recorded, records
every message the loop ends through the session's single writer, and turns the final answer into
a validated :class:`~runtime.reply.segments.Reply` with the IM reply contract
(:mod:`runtime.reply.im_reply`). :class:`TurnControl` is what ``steer`` / ``follow_up`` / ``abort``
reach while the turn runs. The bookkeeping around it (inbox, records, handoff) is in
:mod:`runtime.session.turn` and :mod:`runtime.session.core`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypeAlias

from runtime import tracing
from runtime.agent.agent import Agent, QueueMode
from runtime.agent.config import AgentLoopConfig
from runtime.agent.events import AgentEndEvent, AgentEvent, MessageEndEvent
from runtime.llm.abort import AbortController, AbortSignal
from runtime.llm.limits import is_busy_error
from runtime.llm.types import AgentMessage, AssistantMessage, CustomMessage, UserMessage
from runtime.reply.custom_output import CustomOutputContract, OutputSpec
from runtime.reply.im_reply import ImReplyConfig, ImReplyContract
from runtime.reply.provenance import IdentityFold
from runtime.reply.segments import Reply
from runtime.reply.sender import convert_for_llm
from runtime.session.output_sink import STRUCTURED_OUTPUT_MARKER, OutputSink
from runtime.session.turn import (
    DEFERRED_MARKER,
    PRE_TOOLS_MARKER,
    PreTool,
    SessionSetup,
    TurnInput,
    close_orphan_tool_calls,
    find_marker,
)

__all__ = [
    "RecordFn",
    "TurnControl",
    "abort_notice",
    "busy_reply",
    "control_message",
    "convert_for_session",
    "deliver_output",
    "emit_event",
    "finalize_reply",
    "reply_contract",
    "resolve_capability",
    "resume_turn",
    "run_agent",
    "run_pre_tools",
]

log = logging.getLogger("sessionray.turn")


def emit_event(setup: SessionSetup, event: Any) -> None:
    """Hand ``event`` to ``setup.on_event`` when set; an exception it raises is logged at debug
    level and dropped (live events never break a turn:
    docs/decisions.md#live-events-never-break-turns)."""
    if setup.on_event is None:
        return
    try:
        setup.on_event(event)
    except Exception as exc:
        log.debug("on_event hook failed on %s: %r", getattr(event, "type", type(event).__name__), exc)


# --------------------------------------------------------------------------- the agent part of a turn


class TurnControl:
    """The control side of one running turn: its :class:`~runtime.agent.agent.Agent` (whose
    steering and follow-up queues ``steer`` / ``follow_up`` reach) and its abort switch.

    A session's latest active turn receives ``steer`` and ``follow_up`` (modes ``one-at-a-time``
    | ``all``, read by the agent). Steering is taken by the agent loop before its next LLM call.
    Follow-ups are not drained by the loop: they wait for the turn to end and then run as turns
    of their own, so each gets its own IM reply (an IM turn has exactly one reply; joining the
    loop would swallow the first answer). Steering that arrived after the last LLM call is
    returned by :meth:`leftovers` and also runs as a turn: nothing is lost
    (`docs/decisions.md#steer-latest-turn`).

    The abort switch covers the whole turn (pre-tools, the agent run, the reply's validation);
    the agent's run is linked to it.
    """

    def __init__(self, turn: TurnInput, steering_mode: QueueMode, follow_up_mode: QueueMode) -> None:
        self.turn = turn
        self.agent = Agent(steering_mode=steering_mode, follow_up_mode=follow_up_mode, drain_follow_ups=False)
        self.abort_controller = AbortController()
        self.closed = False
        self.unrecorded: list[AgentMessage] = []
        """The loop's last assistant message (no tool calls), not yet recorded: it goes to SQL in
        the transaction that records the reply (docs/decisions.md#session-turn-records)."""
        self.identity_fold: IdentityFold | None = None
        """The session's reply identity kept across turns (docs/decisions.md#agent-incremental-convert);
        None: read from the whole context."""
        self.llm_view: Callable[[list[AgentMessage]], list[Any]] | None = None
        """The session's ``convert_to_llm`` kept across turns (set by the session when the turn
        has no ``transform_context``: docs/decisions.md#agent-incremental-convert); None: the
        turn converts with :func:`convert_for_session` afresh."""

    async def record_unrecorded(self, record: RecordFn) -> None:
        """Record the held final answer (:attr:`unrecorded`), if any, through ``record`` on its
        own and forget it; a ``record`` that raises leaves it held.

        Raises:
            Whatever ``record`` raises.
        """
        if self.unrecorded:
            await record(list(self.unrecorded))
            self.unrecorded = []

    def steer(self, message: UserMessage) -> None:
        """Queue ``message`` for the running turn's next LLM call."""
        self.agent.steer(message)

    def follow_up(self, message: UserMessage) -> None:
        """Queue ``message`` to run as a turn of its own once this turn ends."""
        self.agent.follow_up(message)

    def leftovers(self) -> list[tuple[Literal["steer", "follow_up"], UserMessage]]:
        """Close the turn and return what must run as turns of their own, in order: steering that
        arrived too late for an LLM call, then the queued follow-ups — one turn each
        (``one-at-a-time``) or joined into one (``all``)."""
        self.closed = True
        steering, follow_ups = self.agent.take_queued()
        users = [m for m in follow_ups if isinstance(m, UserMessage)]
        out: list[tuple[Literal["steer", "follow_up"], UserMessage]] = [
            ("steer", m) for m in steering if isinstance(m, UserMessage)
        ]
        if users and self.agent.follow_up_mode == "all":
            joined = "\n".join(m.content if isinstance(m.content, str) else "" for m in users)
            out.append(("follow_up", users[0].model_copy(update={"content": joined})))
        else:
            out += [("follow_up", m) for m in users]
        return out


def control_message(text: str, sender_id: str) -> UserMessage:
    """The user message a master's steer / follow-up text becomes."""
    return UserMessage(content=text, sender={"id": sender_id, "name": "", "roles": ["master"]})


def convert_for_session(scope: str) -> Callable[[list[AgentMessage]], list[Any]]:
    """``convert_to_llm`` of an IM session: pre-tool results become a user message, then the
    memory layer's conversion (sender prefix in groups, summary, custom messages dropped)."""

    def convert(messages: list[AgentMessage]) -> list[Any]:
        mapped: list[AgentMessage] = []
        for m in messages:
            if isinstance(m, CustomMessage) and m.custom_type == DEFERRED_MARKER:
                d = m.data
                mapped.append(
                    UserMessage(
                        content=f"[deferred task {d.get('task')} finished] {d.get('result')}",
                        timestamp=m.timestamp,
                    )
                )
            elif isinstance(m, CustomMessage) and m.custom_type == PRE_TOOLS_MARKER:
                lines = [f"[{name}] {text}" for name, text in m.data.get("results", {}).items()]
                mapped.append(
                    UserMessage(
                        content="Context gathered before this turn:\n" + "\n".join(lines),
                        timestamp=m.timestamp,
                    )
                )
            else:
                mapped.append(m)
        return convert_for_llm(mapped, scope)

    return convert


async def run_pre_tools(pre_tools: Sequence[PreTool], turn: TurnInput) -> CustomMessage | None:
    """Run the pre-executable tools in parallel; return their ``pre_tool_results`` record, or
    ``None`` when none produced anything. Failures are recorded as ``error: …`` text."""
    import asyncio

    if not pre_tools:
        return None

    async def one(p: PreTool) -> tuple[str, str | None]:
        try:
            return p.name, await p.run(turn)
        except Exception as exc:  # a pre-tool never fails the turn
            return p.name, f"error: {exc}"

    pairs = await asyncio.gather(*(one(p) for p in pre_tools))
    results = {name: text for name, text in pairs if text is not None}
    if not results:
        return None
    return CustomMessage(custom_type=PRE_TOOLS_MARKER, data={"results": results})


RecordFn: TypeAlias = Callable[[Sequence[AgentMessage]], Awaitable[Any]]
"""Appends messages through the session's single writer."""


def reply_contract(setup: SessionSetup) -> Any:
    """The :class:`runtime.reply.im_reply.ImReplyContract` of a session's turns
    (docs/decisions.md#reply-segments) — a :class:`~runtime.reply.custom_output.CustomOutputContract`
    with a custom ``output_schema`` — on ``setup.capabilities`` when set."""
    if isinstance(setup.output_schema, OutputSpec):
        return CustomOutputContract(setup.model, setup.output_schema, cache=setup.capabilities)
    return ImReplyContract(
        setup.model,
        setup.output_schema,
        config=ImReplyConfig(failure_text=setup.failure_text),
        cache=setup.capabilities,
    )


async def resolve_capability(setup: SessionSetup) -> None:
    """Read the model's structured-output tier from ``setup.capabilities`` (the shared store),
    probing it at first use or after its TTL (docs/decisions.md#structured-capability-cache). A
    failing store or probe is logged; the turn then runs at the tier known so far."""
    if setup.capabilities is None or setup.output_schema is False:
        return
    try:
        await setup.capabilities.resolve(setup.model, setup.probe)
    except Exception:
        log.warning("capability resolution of %s failed", setup.model.ref(), exc_info=True)


async def finalize_reply(
    setup: SessionSetup,
    final: AssistantMessage | None,
    messages: Sequence[AgentMessage],
    sender_id: str | None,
    ctl: TurnControl,
    *,
    contract: Any = None,
    budget_spent: bool = False,
    scope: str | None = None,
    record: RecordFn | None = None,
) -> Reply:
    """Validate the turn's final answer into a :class:`Reply` (strict validation, at most
    one format-correction call (docs/decisions.md#reply-one-correction), then the fixed failure
    message; mention targets must be known ids). ``budget_spent``: the loop stopped on
    ``max_iterations`` — ask once more for a summary in the same schema, with the history converted
    by the session's own converter (:func:`convert_for_session` of ``scope``, default the turn's
    scene type: sender prefixes, forged-prefix stripping, pre-tool and deferred records), as the
    loop's calls were. A cancelled turn gives an empty reply (nothing is sent).

    With a custom ``output_schema`` the reply is always empty: a validated answer goes to
    ``setup.output_sink`` (``record`` appends its transcript record), a failed one nowhere
    (docs/decisions.md#structured-custom-schema)."""
    busy = busy_reply(setup, final)
    if busy is not None:  # the provider's limits were taken for max_wait_s
        return busy
    contract = contract or reply_contract(setup)
    fold = ctl.identity_fold or IdentityFold()
    identity = (
        setup.features.identity(sender_id, messages, fold)  # + media provenance
        if setup.features is not None
        else fold.mentions(sender_id, messages)
    )
    signal = ctl.abort_controller.signal
    if budget_spent and not signal.aborted:
        outcome = await contract.summarize(
            messages,
            identity,
            system_prompt=setup.system_prompt,
            signal=signal,
            convert_to_llm=convert_for_session(scope or ctl.turn.scene_type),
        )
    else:
        outcome = await contract.finalize(final, identity, signal=signal)
    emit_event(setup, outcome)
    if isinstance(setup.output_schema, OutputSpec):
        await deliver_output(setup, setup.output_schema, outcome, ctl.turn, messages, record)
    reply: Reply = outcome.reply
    return reply


async def deliver_output(
    setup: SessionSetup,
    spec: OutputSpec,
    outcome: Any,
    turn: TurnInput,
    messages: Sequence[AgentMessage],
    record: RecordFn | None,
) -> None:
    """Hand a custom schema's validated answer to the session's sink; a failed (or cancelled)
    answer delivers nothing — its failure was logged and counted by the contract."""
    if outcome.value is None:
        if outcome.outcome != "aborted":
            log.warning(
                "custom output %s of %s failed at tier %s; nothing is delivered: %s",
                spec.name,
                turn.message_id,
                outcome.tier,
                outcome.reason,
            )
        return
    sink = setup.output_sink or OutputSink()
    await sink.deliver(
        spec,
        outcome.value,
        key=f"{turn.session_key}/{turn.message_id}",
        message_id=turn.message_id,
        session_key=turn.session_key,
        tier=str(outcome.tier),
        outcome=str(outcome.outcome),
        record=record,
        recorded=find_marker(messages, STRUCTURED_OUTPUT_MARKER, turn.message_id) is not None,
    )


async def run_agent(
    setup: SessionSetup, messages: list[AgentMessage], scope: str, ctl: TurnControl, record: RecordFn
) -> Reply:
    """Run the turn's :class:`~runtime.agent.agent.Agent` from ``messages`` (whose tail is the
    turn's user message, or a resumed turn's tool results) and return the validated reply.

    Every message the loop ends — assistant messages, tool results, steering user messages — is
    recorded through ``record`` as soon as it ends (the agent awaits its listeners), so an
    executed tool's result is in SQL before the next LLM call
    (`docs/decisions.md#session-turn-records`) — except an assistant message without tool calls
    that is the loop's last: it is left in ``ctl.unrecorded`` for the caller to record together
    with the reply (a custom output schema's answer: recorded here, before its sink runs).
    LLM/tool failures travel as stop reasons and end in the fixed failure message
    (`docs/decisions.md#reply-fixed-failure`), never as exceptions.

    Raises:
        Exception: whatever ``record`` (or an event hook) raised; the turn then ends in error.
    """
    tools = list(setup.tools)
    if setup.features is not None:  # vision routing + MCP tools
        setup, tools = await setup.features.prepare_turn(setup, ctl.turn)
    await resolve_capability(setup)
    contract = reply_contract(setup)
    features = setup.features

    def configure(config: AgentLoopConfig) -> AgentLoopConfig:
        if features is not None:  # fallback chain + tool permissions
            config = features.configure(config, tools, ctl.turn)
        configured: AgentLoopConfig = contract.configure(config)
        return configured

    agent = ctl.agent
    agent.state.model, agent.state.system_prompt = setup.model, setup.system_prompt
    agent.state.tools, agent.state.messages = tools, list(messages)
    agent.convert_to_llm = ctl.llm_view or convert_for_session(scope)
    agent.max_iterations = setup.max_iterations
    agent.configure_loop = configure
    final: AssistantMessage | None = None
    seen: list[AgentMessage] = list(messages)
    budget_spent = False

    async def on_event(event: AgentEvent, signal: AbortSignal) -> None:
        nonlocal final, budget_spent
        emit_event(setup, event)
        if isinstance(event, MessageEndEvent):
            message = event.message
            await ctl.record_unrecorded(record)  # the loop went on (steering): the held answer first
            if isinstance(message, AssistantMessage) and not message.tool_calls():
                ctl.unrecorded.append(message)  # maybe the final answer: recorded with the reply
            else:
                await record([message])
            seen.append(message)
            if isinstance(message, AssistantMessage):
                final = message
        elif isinstance(event, AgentEndEvent):
            budget_spent = event.reason == "max_iterations"

    unsubscribe = agent.subscribe(on_event)
    try:
        await agent.continue_(signal=ctl.abort_controller.signal)
    finally:
        unsubscribe()
    if agent.failure is not None:
        raise agent.failure
    if isinstance(setup.output_schema, OutputSpec):  # its sink records after the answer
        await ctl.record_unrecorded(record)
    sender = ctl.turn.sender.get("id")
    with tracing.span("reply.validate"):  # docs/decisions.md#ops-traces
        return await finalize_reply(
            setup,
            final,
            seen,
            str(sender) if sender else None,
            ctl,
            contract=contract,
            budget_spent=budget_spent,
            scope=scope,
            record=record,
        )


def busy_reply(setup: SessionSetup, final: AssistantMessage | None) -> Reply | None:
    """The polite busy reply (``setup.busy_text``) when the turn's last model call was refused by
    the provider gate after ``max_wait_s`` (docs/decisions.md#spend-provider-limits; the refusal
    is counted by ``sessionray_provider_refusals_total``), else ``None``. A custom output schema's
    answers go to a sink, never the chat: ``None`` then too."""
    if final is None or final.stop_reason != "error" or isinstance(setup.output_schema, OutputSpec):
        return None
    return Reply.of_text(setup.busy_text) if is_busy_error(final.error_message) else None


async def resume_turn(
    setup: SessionSetup, ctl: TurnControl, messages: list[AgentMessage], record: RecordFn
) -> tuple[Reply | None, list[AgentMessage]]:
    """The start of a crash retry whose entry was recorded before the crash
    (docs/decisions.md#session-crash-recovery): close the tool calls cut off (never re-run them);
    when the answer was produced, only validate it (the hand-over is what is missing).

    Returns:
        ``(reply, context)`` — ``reply`` is ``None`` when the agent must run on ``context``.
    """
    messages = list(await record(close_orphan_tool_calls(messages)))
    final = messages[-1]
    if not isinstance(final, AssistantMessage):
        return None, messages
    sender = ctl.turn.sender.get("id")
    reply = await finalize_reply(setup, final, messages, str(sender) if sender else None, ctl, record=record)
    return reply, messages


def abort_notice(setup: SessionSetup) -> Reply | None:
    """The reply of a turn a master aborted: the host's fixed ``setup.abort_text`` — never a part
    of the cut-off answer (docs/decisions.md#agent-abort-valid-context) — or None when the text is
    off or the answers go to a custom output sink instead of the chat."""
    if not setup.abort_text or isinstance(setup.output_schema, OutputSpec):
        return None
    return Reply.of_text(setup.abort_text)

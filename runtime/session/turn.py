"""One IM turn, without Ray (docs/decisions.md#session-turn-records).

A turn is: record the inbound message → agent loop with the session's tools (sender prefix when
converting for the LLM) → validated :class:`~runtime.reply.segments.Reply` → hand it to delivery →
record that it was handed. Everything here is plain asyncio so it is unit-testable without Ray;
``actors/placement/hosts/host.py`` hosts many :class:`~runtime.session.core.SessionCore` s built from
these pieces.

Records a turn leaves in ``agent_messages`` (all through the session's single writer,
:class:`SessionWriter`), which is what makes crash recovery possible:

* ``CustomMessage(custom_type="im_inbound", data={"message_id", "seq", "reply_id"})`` — written
  together with the user message, before any LLM call;
* every message the agent loop produces (assistant messages, tool results, steering messages) as
  soon as it ends — so an executed tool's result is in SQL before the next LLM call;
* ``CustomMessage(custom_type="im_reply", data={"message_id", "reply_id", "preview"})`` — written
  in one transaction with the reply's ``queued`` row in the delivery ledger (the inbox entry is
  then *done*; the platform's answer is not awaited: docs/decisions.md#delivery-outbox).

``convert_to_llm`` drops both markers (custom messages never reach the model:
docs/decisions.md#llm-context-shape).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, Field

from runtime.agent.agent import QueueMode
from runtime.agent.context_budget import BudgetPolicy
from runtime.agent.tools import AgentTool
from runtime.config.ai import CoalesceConfig
from runtime.delivery.job import DeliveryJob
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    CustomMessage,
    Model,
    TextContent,
    ToolResultMessage,
    UserMessage,
)
from runtime.platforms.placeholders import model_text
from runtime.reply.capability import CapabilityCache, ProbeFn
from runtime.reply.custom_output import OutputSpec
from runtime.session.output_sink import OutputSink

__all__ = [
    "ABORT_TEXT",
    "BUSY_TEXT",
    "DEFERRED_MARKER",
    "INBOUND_MARKER",
    "INTERRUPTED_TEXT",
    "PRE_TOOLS_MARKER",
    "REPLY_MARKER",
    "DeliverFn",
    "PreTool",
    "SessionSetup",
    "SessionWriter",
    "SetupFactory",
    "TurnInput",
    "TurnOutcome",
    "TurnResult",
    "close_orphan_tool_calls",
    "find_marker",
]

ABORT_TEXT = "(Stopped: this answer was cancelled.)"
"""The built-in notice a chat gets for a turn a master aborted."""
BUSY_TEXT = "Sorry, I'm getting a lot of questions right now. Please ask again in a minute."
"""The built-in reply of a turn whose model call waited past its provider's ``max_wait_s``
(docs/decisions.md#spend-provider-limits)."""
INBOUND_MARKER = "im_inbound"
"""``CustomMessage.custom_type`` recorded with each inbound turn (before the user message)."""
REPLY_MARKER = "im_reply"
"""``CustomMessage.custom_type`` recorded once a turn's reply was accepted by delivery."""
DEFERRED_MARKER = "deferred_result"
"""``CustomMessage.custom_type`` recording a finished deferred task (shown to the LLM later)."""
PRE_TOOLS_MARKER = "pre_tool_results"
"""``CustomMessage.custom_type`` holding the results of pre-executable tools (shown to the LLM)."""
INTERRUPTED_TEXT = "interrupted: the session restarted while this tool call was running; it was not re-run"
"""Text of the synthetic error result that closes a tool call cut off by a crash
(docs/decisions.md#session-crash-recovery)."""


class TurnInput(BaseModel):
    """One entry of a session's inbox: an inbound message stamped by the router.

    ``seq`` is the per-session sequence number (router-assigned, 1-based, contiguous), which the
    session's single inbox consumer uses to start turns in order (Ray does not order calls to an
    async actor). ``attempt`` is 0 for the first delivery and 1 for the one retry after a crash.
    Times are Unix ms.
    """

    seq: int
    session_key: str
    platform: str
    bot_id: str
    message_id: str
    scene_type: str
    scene_id: str
    sender: dict[str, Any] = Field(default_factory=dict)
    """``{"id": str, "name": str, "roles": list[str]}``."""
    text: str = ""
    segments: list[dict[str, Any]] = Field(default_factory=list)
    reply_to: str | None = None
    time_ms: int = 0
    kind: Literal["inbound", "follow_up", "steer"] = "inbound"
    """``inbound``: a platform message; ``follow_up``/``steer``: a master's control text that
    found no active turn to join, so it runs as a turn of its own."""
    attempt: int = 0
    traceparent: str | None = None
    """W3C ``traceparent`` of the host's ``activation`` span: the turn's span is its child
    (docs/decisions.md#ops-traces)."""

    @classmethod
    def from_inbound(cls, inbound: Any, seq: int) -> TurnInput:
        """Build from a :class:`runtime.platforms.base.InboundMessage` (duck-typed)."""
        return cls(
            seq=seq,
            session_key=inbound.session_key,
            platform=inbound.platform,
            bot_id=inbound.bot_id,
            message_id=inbound.message_id,
            scene_type=inbound.scene_type,
            scene_id=inbound.scene_id,
            sender={
                "id": inbound.sender.id,
                "name": inbound.sender.name,
                "roles": list(inbound.sender.roles),
            },
            text=inbound.text,
            segments=list(inbound.segments),
            reply_to=inbound.reply_to,
            time_ms=inbound.time_ms,
            traceparent=getattr(inbound, "traceparent", None),
        )

    def reply_id(self, session_id: str) -> str:
        """The delivery idempotency key of this turn's reply: stable across the crash retry, so
        the delivery ledger drops a second send (``{session_id}/{message_id}``)."""
        return f"{session_id}/{self.message_id}"

    def user_message(self) -> UserMessage:
        """The user message stored for this inbound: clean text, then one line per non-text
        segment (``[face 14]``, ``[image url=…]``…), never empty (docs/decisions.md#platform-placeholders);
        the sender prefix is rendered at LLM conversion time (docs/decisions.md#security-sender-prefix)."""
        return UserMessage(
            content=model_text(self.text, self.segments),
            sender=dict(self.sender) or None,
            timestamp=self.time_ms or _now(),
        )


def _now() -> int:
    from runtime.llm.types import now_ms

    return now_ms()


TurnOutcome: TypeAlias = Literal["ok", "empty", "already_done", "aborted", "error", "busy"]
"""How a turn (or an entry answered without one) ended: see :class:`TurnResult`."""


class TurnResult(BaseModel):
    """What one turn ended with (returned to the router, which then marks the entry done).

    ``outcome``: ``ok`` (a reply was handed to delivery), ``empty`` (the model chose not to reply,
    ``{"segments": []}``), ``already_done`` (a retried entry whose reply had been handed before the
    crash), ``aborted``, ``error``, ``busy`` (the chat's queue was full: the message was recorded as
    history and answered only by the rate-limited busy notice;
    docs/decisions.md#session-hot-chat-coalescing). Each member of a coalesced batch gets the batch
    turn's result with its own ``seq`` and ``message_id`` and the batch's ``reply_id``.
    """

    seq: int
    message_id: str
    outcome: TurnOutcome
    reply_id: str = ""
    preview: str = ""
    error: str = ""
    latency_ms: float = 0.0


@dataclass
class PreTool:
    """A pre-executable tool (docs/decisions.md#agent-one-engine): run in parallel before the turn's
    first LLM call; its text result is recorded and shown to the model as context. Must be
    side-effect free (a crash retry may run it again).

    Attributes:
        name: Label shown to the model.
        run: ``async (turn) -> str | None``; ``None`` means "nothing to add". An exception is
            recorded as ``error: <text>`` and never fails the turn.
    """

    name: str
    run: Callable[[TurnInput], Awaitable[str | None]]


@dataclass
class SessionSetup:
    """What a session's turns run with. Built inside the session host by a :data:`SetupFactory`
    (models, tools and faux scripts are process-local, so each actor builds its own).

    Attributes:
        model: The chat model.
        tools: Business tools the agent may call.
        system_prompt: System prompt (the IM preset for IM sessions).
        output_schema: ``"segments"`` (the structured reply, default:
        docs/decisions.md#reply-segments), ``False`` (plain text:
            the final text becomes one text segment; ``@name`` never becomes a mention) or a custom
            :class:`~runtime.reply.custom_output.OutputSpec` (the validated answer goes to
            ``output_sink``, nothing to the chat: docs/decisions.md#structured-custom-schema).
        output_sink: Where a custom schema's validated answers go (``None`` with a custom schema:
            the transcript only).
        steering_mode / follow_up_mode: how queued steer / follow-up messages are drained
            (config ``ai.agent.steering_mode`` / ``follow_up_mode``; docs/decisions.md#queue-modes).
        pre_tools: Pre-executable tools.
        max_iterations: LLM-call budget per turn (``None`` = the loop's default).
        failure_text: The host's fixed failure message sent when a turn errors
            (docs/decisions.md#reply-fixed-failure).
        busy_text: The polite reply sent when the turn's model call got no provider lease within
            ``max_wait_s`` (config ``ai.agent.busy_text``; docs/decisions.md#spend-provider-limits).
        abort_text: The host's fixed notice sent when a master aborts a turn (``None``: nothing
            is sent; docs/decisions.md#agent-abort-valid-context).
        deferred_tasks: Named work the model may hand off with the ``run_deferred_task`` tool:
            ``name -> fn(args: dict) -> str`` (sync, picklable: the session host runs it as a Ray
            task); its result is delivered as a separate outbound message.
        features: :class:`runtime.session.features.AgentFeatures` (chat commands, vision
            routing, fallback chain, MCP tools, tool permissions, media provenance) or ``None``.
        on_event: ``(event) -> None`` called with every agent-loop event of a turn and with its
            :class:`runtime.reply.im_reply.ReplyOutcome`; must return at once (fire-and-forget). An
            exception it raises is logged at debug level and ignored. ``None``: no hook
            (docs/decisions.md#live-events-never-break-turns; console sessions get
            :class:`runtime.session.console_events.ConsoleEventSink`).
        compaction_threshold: Share of ``model.context_window`` above which the turn's
            ``transform_context`` compacts older messages into a summary
            (docs/decisions.md#memory-compaction,
            :func:`runtime.memory.compaction.make_compaction_hook`); ``None``: no compaction.
        context_budget: The per-turn history window in tokens, after compaction
            (docs/decisions.md#agent-context-budget, :mod:`runtime.agent.context_budget`);
            ``None``: every message of the context is sent.
        capabilities: The structured-output capability cache of the turns' reply contract and of
            ``/models`` (``None``: the process-wide in-memory one, no probe;
            docs/decisions.md#structured-capability-cache). The config setup injects one on the
            SQL ``model_capabilities`` store.
        probe: ``(model) -> ProbeResult`` run at a turn's start when ``capabilities`` knows no
            unexpired tier for ``model`` (``None``: no probe; the contract starts at ``native``).
        coalesce: Hot-chat coalescing (``ai.agent.coalesce``, capped to the host's mailbox by
            the config setup; docs/decisions.md#session-hot-chat-coalescing); ``None``: off,
            every message is its own turn.
    """

    model: Model
    tools: list[AgentTool[Any]] = field(default_factory=list)
    system_prompt: str = ""
    output_schema: Literal["segments"] | Literal[False] | OutputSpec = "segments"
    output_sink: OutputSink | None = None
    steering_mode: QueueMode = "one-at-a-time"
    follow_up_mode: QueueMode = "one-at-a-time"
    pre_tools: list[PreTool] = field(default_factory=list)
    max_iterations: int | None = None
    failure_text: str = "Sorry, something went wrong while answering. Please try again."
    busy_text: str = BUSY_TEXT
    abort_text: str | None = ABORT_TEXT
    deferred_tasks: dict[str, Callable[[dict[str, Any]], str]] = field(default_factory=dict)
    features: Any = None
    on_event: Callable[[Any], None] | None = None
    compaction_threshold: float | None = None
    context_budget: BudgetPolicy | None = None
    capabilities: CapabilityCache | None = None
    probe: ProbeFn | None = None
    coalesce: CoalesceConfig | None = None


SetupFactory: TypeAlias = Callable[[str], "SessionSetup | Awaitable[SessionSetup]"]
"""``(session_key) -> SessionSetup``, called in the session host's process at activation. Must be
picklable (it travels by value to the host supervisor and every session host)."""


DeliverFn: TypeAlias = Callable[[DeliveryJob], Awaitable[None]]
"""Tells delivery that a reply (a :class:`runtime.delivery.DeliveryJob`, the one type a reply
crosses the session/delivery boundary in) was just recorded in the delivery ledger as ``queued``
(docs/decisions.md#delivery-outbox). It must return at once, never waiting for the platform: the
reply is already durable, a lost notification only delays it until the delivery actor's sweep.
An exception it raises is logged and ignored."""


class SessionWriter:
    """The single writer of one session epoch (docs/decisions.md#memory-single-writer).

    Every append of every (possibly overlapping) turn goes through :meth:`append`, which holds
    one ``asyncio.Lock`` around the SQL append and the in-memory mirror, so the in-memory message
    list is always exactly the SQL order. Create and use on one event loop.

    Args:
        store: A ``ContextRepository`` (or anything with ``append_messages`` and
            ``check_storable``).
        session_id: ``{session_key}#{epoch}``.
        messages: The context loaded at activation (not copied; the writer owns it from now on).
    """

    def __init__(self, store: Any, session_id: str, messages: list[AgentMessage]) -> None:
        import asyncio

        self.store = store
        self.session_id = session_id
        self._messages = messages
        self._markers: dict[tuple[str, str], int] = {}
        """``(custom_type, message_id) -> index`` of the last such marker: :meth:`marker` in O(1)
        (a new message's duplicate check ran over the whole context before)."""
        self._index(0)
        self._lock = asyncio.Lock()
        self._staged: list[AgentMessage] = []
        """Messages in the mirror that SQL does not hold yet (:meth:`stage`): the first ones the
        next append writes."""
        self._staged_writes: list[Callable[[Any], None]] = []
        """Statements for the next append's transaction (:meth:`stage_write`), in staging order."""
        self.appended = 0
        """Messages appended (or staged) since activation."""

    def _index(self, start: int) -> None:
        for i in range(start, len(self._messages)):
            m = self._messages[i]
            if isinstance(m, CustomMessage) and isinstance(mid := m.data.get("message_id"), str):
                self._markers[(m.custom_type, mid)] = i

    def _add(self, messages: Sequence[AgentMessage]) -> None:
        start = len(self._messages)
        self._messages.extend(messages)
        self._index(start)
        self.appended += len(messages)

    def marker(self, custom_type: str, message_id: str) -> int | None:
        """Index of the last ``CustomMessage`` of ``custom_type`` for ``message_id`` in the
        context, or ``None``: :func:`find_marker` of :meth:`snapshot` without the scan."""
        return self._markers.get((custom_type, message_id))

    async def append(self, messages: Sequence[AgentMessage], *, also: Any = None) -> list[AgentMessage]:
        """Append ``messages`` to SQL and the mirror; return a snapshot of the whole context after
        the append (a new list). The staged messages (:meth:`stage`) go first, in the same
        transaction. ``also`` (``(conn) -> None``) is written in that transaction too
        (``ContextRepository.append_messages``: a reply's ledger row with its ``im_reply`` record).

        Raises:
            Whatever ``store.append_messages`` raises (then nothing was added to the mirror, and
            the staged messages stay staged).
        """
        async with self._lock:
            batch = [*self._staged, *messages]
            staged, self._staged_writes = self._staged_writes, []
            writes = staged if also is None else [*staged, also]
            if batch or writes:
                try:
                    extra = {"also": _in_order(writes)} if writes else {}
                    await self.store.append_messages(self.session_id, batch, **extra)
                except Exception:  # not on cancellation: that write may still commit
                    self._staged_writes[:0] = staged
                    raise
                self._staged.clear()
                self._add(messages)
            return list(self._messages)

    async def stage(self, messages: Sequence[AgentMessage]) -> list[AgentMessage]:
        """Add ``messages`` to the mirror now and to SQL with the next :meth:`append` (or
        :meth:`flush`), in its transaction and before its own messages; return a snapshot as
        :meth:`append` does. A turn's ``im_inbound`` record and user message are staged: the
        turn's next write carries them — for a turn without tools, its hand-over — one write
        transaction less a turn, and a crash before that write loses only what a crash before the
        hand-over loses anyway (docs/decisions.md#session-turn-records).

        Raises:
            TypeError / ValueError: a message that could not be stored (``store.check_storable``):
                refused here, so that it never fails the writes of other turns.
        """
        self.store.check_storable(messages)
        async with self._lock:  # after an append in flight: the mirror keeps SQL's order
            self._add(messages)
            self._staged.extend(messages)
            return list(self._messages)

    def stage_write(self, write: Callable[[Any], None]) -> None:
        """Run ``write(conn)`` in the transaction of the next :meth:`append` (or :meth:`flush`),
        before that append's own ``also``: a turn's usage row goes with the turn's next write, one
        write transaction less per LLM call (docs/decisions.md#spend-ledger). A write staged while
        an append is in flight goes with the one after it."""
        self._staged_writes.append(write)

    async def flush(self) -> None:
        """Write the staged messages and writes now, if any (an append without messages of its
        own).

        Raises:
            Whatever ``store.append_messages`` raises (they stay staged).
        """
        await self.append([])

    @property
    def staged(self) -> int:
        """How many messages of the mirror SQL does not hold yet."""
        return len(self._staged)

    @property
    def staged_writes(self) -> int:
        """How many staged writes (:meth:`stage_write`) wait for the next append."""
        return len(self._staged_writes)

    def snapshot(self) -> list[AgentMessage]:
        """A copy of the current context messages (SQL order)."""
        return list(self._messages)

    def __len__(self) -> int:
        return len(self._messages)


def _in_order(writes: list[Callable[[Any], None]]) -> Callable[[Any], None]:
    """One ``also(conn)`` that runs ``writes`` in their order."""
    if len(writes) == 1:
        return writes[0]

    def run(conn: Any) -> None:
        for write in writes:
            write(conn)

    return run


def find_marker(messages: Sequence[AgentMessage], custom_type: str, message_id: str) -> int | None:
    """Index of the last ``CustomMessage`` of ``custom_type`` whose ``data["message_id"]`` equals
    ``message_id``, or ``None``."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if (
            isinstance(m, CustomMessage)
            and m.custom_type == custom_type
            and m.data.get("message_id") == message_id
        ):
            return i
    return None


def close_orphan_tool_calls(messages: Sequence[AgentMessage]) -> list[ToolResultMessage]:
    """Synthetic ``is_error`` results for every tool call in ``messages`` that has no result
    (docs/decisions.md#session-crash-recovery: a tool cut off by a crash is never re-run; the
    retried turn sees this "interrupted" error result instead). Order: the calls' order in the
    context."""
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolResultMessage)}
    out: list[ToolResultMessage] = []
    for m in messages:
        if isinstance(m, AssistantMessage) and m.stop_reason not in ("error", "aborted"):
            for call in m.tool_calls():
                if call.id not in answered:
                    out.append(
                        ToolResultMessage(
                            tool_call_id=call.id,
                            tool_name=call.name,
                            content=[TextContent(text=INTERRUPTED_TEXT)],
                            is_error=True,
                        )
                    )
                    answered.add(call.id)
    return out


def inbound_marker(turn: TurnInput, session_id: str) -> CustomMessage:
    """The ``im_inbound`` record written with the turn's user message."""
    return CustomMessage(
        custom_type=INBOUND_MARKER,
        data={"message_id": turn.message_id, "seq": turn.seq, "reply_id": turn.reply_id(session_id)},
    )


def reply_marker(message_id: str, reply_id: str, preview: str) -> CustomMessage:
    """The ``im_reply`` record of inbound ``message_id``, written with the reply's ``queued``
    ledger row (the entry is done; a batch writes one per message it answered)."""
    return CustomMessage(
        custom_type=REPLY_MARKER,
        data={"message_id": message_id, "reply_id": reply_id, "preview": preview},
    )


def control_turn(
    session_key: str, kind: Literal["follow_up", "steer"], text: str, sender_id: str
) -> TurnInput:
    """A turn for a master's follow-up/steer text that found no active turn (``seq`` = 0: it is
    started directly, outside the router's sequence). Scene fields come from the session key."""
    from runtime.keys import parse_session_key

    key = parse_session_key(session_key)
    return TurnInput(
        seq=0,
        session_key=session_key,
        platform=key.platform,
        bot_id=key.bot_id,
        message_id=f"{kind}-{uuid.uuid4().hex[:16]}",
        scene_type=key.scope,
        scene_id=key.scene_id,
        sender={"id": sender_id, "name": "", "roles": ["master"]},
        text=text,
        kind=kind,
        time_ms=_now(),
    )

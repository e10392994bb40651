"""Events of the agent loop (pi's ``AgentEvent``).

One loop run emits, in order::

    agent_start
      turn_start
        message_start/message_end            for each prompt / steering / follow-up message
        message_start, message_update*, message_end      the assistant response
        tool_execution_start/update*/end     per tool call (ends in completion order when parallel)
        message_start/message_end            per tool result, in the assistant's source order
      turn_end
      ... more turns ...
    agent_end

Message objects in ``message_start``/``message_update`` are the *live* partial message the
provider is building (copy it if you keep it); ``message_end`` carries the final message.
Frozen dataclasses like :mod:`runtime.llm.events` (created per chunk on the hot path), carried
by an :class:`AgentEventStream`, the one generic event stream of both families.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from runtime.llm.event_stream import EventStream
from runtime.llm.events import AssistantMessageEvent
from runtime.llm.types import AgentMessage, AssistantMessage, ToolResultMessage

__all__ = [
    "AgentEndEvent",
    "AgentEndReason",
    "AgentEvent",
    "AgentEventStream",
    "AgentStartEvent",
    "MessageEndEvent",
    "MessageStartEvent",
    "MessageUpdateEvent",
    "ToolExecutionEndEvent",
    "ToolExecutionStartEvent",
    "ToolExecutionUpdateEvent",
    "TurnEndEvent",
    "TurnStartEvent",
]

AgentEndReason: TypeAlias = Literal["stop", "error", "aborted", "max_iterations"]
"""Why a loop run ended: ``stop`` (nothing left to do), ``error``/``aborted`` (the last
assistant message's stop_reason), ``max_iterations`` (the LLM-call budget was spent)."""


@dataclass(frozen=True, slots=True)
class AgentStartEvent:
    """The loop run started."""

    type: Literal["agent_start"] = "agent_start"


@dataclass(frozen=True, slots=True)
class AgentEndEvent:
    """The loop run ended; ``messages`` are all messages it added to the context, in order."""

    messages: list[AgentMessage] = field(default_factory=list)
    reason: AgentEndReason = "stop"
    type: Literal["agent_end"] = "agent_end"


@dataclass(frozen=True, slots=True)
class TurnStartEvent:
    """A turn (one assistant response plus its tool calls) started."""

    type: Literal["turn_start"] = "turn_start"


@dataclass(frozen=True, slots=True)
class TurnEndEvent:
    """A turn ended: its assistant ``message`` and the ``tool_results`` in source order."""

    message: AssistantMessage
    tool_results: list[ToolResultMessage] = field(default_factory=list)
    type: Literal["turn_end"] = "turn_end"


@dataclass(frozen=True, slots=True)
class MessageStartEvent:
    """A message entered the context (for the assistant: the response began streaming)."""

    message: AgentMessage
    type: Literal["message_start"] = "message_start"


@dataclass(frozen=True, slots=True)
class MessageUpdateEvent:
    """The streaming assistant message changed; ``assistant_message_event`` is the raw event."""

    message: AssistantMessage
    assistant_message_event: AssistantMessageEvent
    type: Literal["message_update"] = "message_update"


@dataclass(frozen=True, slots=True)
class MessageEndEvent:
    """The message is final."""

    message: AgentMessage
    type: Literal["message_end"] = "message_end"


@dataclass(frozen=True, slots=True)
class ToolExecutionStartEvent:
    """A tool call is about to run (after validation; blocked/invalid calls also get one)."""

    tool_call_id: str
    tool_name: str
    args: dict[str, Any]
    type: Literal["tool_execution_start"] = "tool_execution_start"


@dataclass(frozen=True, slots=True)
class ToolExecutionUpdateEvent:
    """A running tool reported progress via ``on_update``."""

    tool_call_id: str
    tool_name: str
    args: dict[str, Any]
    partial_result: Any
    type: Literal["tool_execution_update"] = "tool_execution_update"


@dataclass(frozen=True, slots=True)
class ToolExecutionEndEvent:
    """A tool call finished; ``result`` is its :class:`ToolResultMessage` (emitted as each finishes)."""

    tool_call_id: str
    tool_name: str
    result: ToolResultMessage
    is_error: bool
    type: Literal["tool_execution_end"] = "tool_execution_end"


AgentEvent: TypeAlias = (
    AgentStartEvent
    | AgentEndEvent
    | TurnStartEvent
    | TurnEndEvent
    | MessageStartEvent
    | MessageUpdateEvent
    | MessageEndEvent
    | ToolExecutionStartEvent
    | ToolExecutionUpdateEvent
    | ToolExecutionEndEvent
)


class AgentEventStream(EventStream[AgentEvent, list[AgentMessage]]):
    """The events of one agent loop run (:func:`runtime.agent.loop.agent_loop`) in the generic
    :class:`runtime.llm.event_stream.EventStream`: sent in lockstep, ended by the run itself with
    the messages it added (the ``agent_end`` event's ``messages``) as the result."""

"""Assistant message events and the async stream that carries them
(docs/decisions.md#llm-errors-as-events).

A provider's ``stream`` returns an :class:`AssistantMessageEventStream` (the generic
:class:`runtime.llm.event_stream.EventStream` of this family) at once and fills it from a
background task. Consumers ``async for event in s`` and/or ``await s.result()``.

Guarantees (tested in ``tests/test_stream.py``):

* exactly one terminal event, ``done`` or ``error``, and it is the last one;
* a failure after the stream is returned is an ``error`` event whose ``error`` message has
  ``stop_reason`` ``error`` or ``aborted``; iteration never raises for provider failures;
* every non-terminal event carries ``partial``, the live :class:`AssistantMessage` being built,
  and content events carry ``content_index`` into ``partial.content``.

Events are frozen dataclasses (not pydantic) because they are created per chunk on the hot path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

from runtime.llm.event_stream import EventStream
from runtime.llm.types import AssistantMessage, ToolCall

__all__ = [
    "AssistantMessageEvent",
    "AssistantMessageEventStream",
    "DoneEvent",
    "ErrorEvent",
    "StartEvent",
    "TextDeltaEvent",
    "TextEndEvent",
    "TextStartEvent",
    "ThinkingDeltaEvent",
    "ThinkingEndEvent",
    "ThinkingStartEvent",
    "ToolCallDeltaEvent",
    "ToolCallEndEvent",
    "ToolCallStartEvent",
    "run_stream",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StartEvent:
    """The response began; ``partial`` has no content yet."""

    partial: AssistantMessage
    type: Literal["start"] = "start"


@dataclass(frozen=True, slots=True)
class TextStartEvent:
    """A text block opened at ``partial.content[content_index]``."""

    content_index: int
    partial: AssistantMessage
    type: Literal["text_start"] = "text_start"


@dataclass(frozen=True, slots=True)
class TextDeltaEvent:
    """``delta`` was appended to the text block at ``content_index``."""

    content_index: int
    delta: str
    partial: AssistantMessage
    type: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True, slots=True)
class TextEndEvent:
    """The text block at ``content_index`` is complete; ``content`` is its whole text."""

    content_index: int
    content: str
    partial: AssistantMessage
    type: Literal["text_end"] = "text_end"


@dataclass(frozen=True, slots=True)
class ThinkingStartEvent:
    """A thinking block opened."""

    content_index: int
    partial: AssistantMessage
    type: Literal["thinking_start"] = "thinking_start"


@dataclass(frozen=True, slots=True)
class ThinkingDeltaEvent:
    """``delta`` was appended to the thinking block at ``content_index``."""

    content_index: int
    delta: str
    partial: AssistantMessage
    type: Literal["thinking_delta"] = "thinking_delta"


@dataclass(frozen=True, slots=True)
class ThinkingEndEvent:
    """The thinking block is complete; ``content`` is its whole text."""

    content_index: int
    content: str
    partial: AssistantMessage
    type: Literal["thinking_end"] = "thinking_end"


@dataclass(frozen=True, slots=True)
class ToolCallStartEvent:
    """A tool-call block opened (id and name known, arguments ``{}`` so far)."""

    content_index: int
    partial: AssistantMessage
    type: Literal["toolcall_start"] = "toolcall_start"


@dataclass(frozen=True, slots=True)
class ToolCallDeltaEvent:
    """More argument JSON arrived; the block's ``arguments`` hold a best-effort partial parse."""

    content_index: int
    delta: str
    partial: AssistantMessage
    type: Literal["toolcall_delta"] = "toolcall_delta"


@dataclass(frozen=True, slots=True)
class ToolCallEndEvent:
    """The tool call is complete; ``tool_call`` has its final parsed arguments."""

    content_index: int
    tool_call: ToolCall
    partial: AssistantMessage
    type: Literal["toolcall_end"] = "toolcall_end"


@dataclass(frozen=True, slots=True)
class DoneEvent:
    """Terminal success: ``message`` is final; ``reason`` is its stop_reason (stop/length/toolUse)."""

    reason: Literal["stop", "length", "toolUse"]
    message: AssistantMessage
    type: Literal["done"] = "done"


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """Terminal failure: ``error`` is the final message with ``stop_reason`` error or aborted."""

    reason: Literal["error", "aborted"]
    error: AssistantMessage
    type: Literal["error"] = "error"


AssistantMessageEvent: TypeAlias = (
    StartEvent
    | TextStartEvent
    | TextDeltaEvent
    | TextEndEvent
    | ThinkingStartEvent
    | ThinkingDeltaEvent
    | ThinkingEndEvent
    | ToolCallStartEvent
    | ToolCallDeltaEvent
    | ToolCallEndEvent
    | DoneEvent
    | ErrorEvent
)


def _terminal(event: AssistantMessageEvent) -> bool:
    return event.type in ("done", "error")


def _final_message(event: AssistantMessageEvent) -> AssistantMessage:
    if event.type == "done":
        return event.message
    if event.type == "error":
        return event.error
    raise ValueError(f"{event.type} is not a terminal event")


class AssistantMessageEventStream(EventStream[AssistantMessageEvent, AssistantMessage]):
    """Single-consumer async stream of :data:`AssistantMessageEvent` with an awaitable result
    (:class:`runtime.llm.event_stream.EventStream`).

    Producers call :meth:`push`; the stream ends itself on the first ``done``/``error`` event and
    ignores anything pushed after it. ``await stream.result()`` returns the final
    :class:`AssistantMessage` (from ``done.message`` or ``error.error``) whether or not the events
    were iterated. Must be created with a running event loop.
    """

    def __init__(self) -> None:
        super().__init__(_terminal, _final_message)


def run_stream(
    producer: Callable[[AssistantMessageEventStream], Awaitable[None]],
    on_crash: Callable[[BaseException], AssistantMessage],
) -> AssistantMessageEventStream:
    """Start ``producer(stream)`` as a task and return the stream immediately.

    The producer pushes events and must end with ``done`` or ``error``. If it raises, or returns
    without a terminal event, ``on_crash(exc)`` builds the final message (``stop_reason`` error,
    or aborted for ``asyncio.CancelledError``) and an ``error`` event is pushed, so a consumer
    always sees exactly one terminal event. Must be called with a running event loop.
    """
    stream = AssistantMessageEventStream()

    async def runner() -> None:
        try:
            await producer(stream)
            if not stream.ended:
                raise RuntimeError("provider stream ended without a done or error event")
        except asyncio.CancelledError as exc:
            if not stream.ended:
                msg = on_crash(exc)
                msg.stop_reason = "aborted"
                stream.push(ErrorEvent(reason="aborted", error=msg))
        except Exception as exc:  # errors travel inside the stream (pi rule)
            if not stream.ended:
                log.debug("provider stream failed", exc_info=True)
                msg = on_crash(exc)
                reason: Literal["error", "aborted"] = "aborted" if msg.stop_reason == "aborted" else "error"
                stream.push(ErrorEvent(reason=reason, error=msg))

    stream.attach(asyncio.get_running_loop().create_task(runner()))
    return stream

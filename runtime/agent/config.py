"""Configuration of the agent loop: :class:`AgentContext`, :class:`AgentLoopConfig` and the hook types.

The loop is a plain function parameterized entirely by these hooks (pi's
``AgentLoopConfig``; docs/decisions.md#agent-loop-hooks). Every hook may be a plain function or a
coroutine function.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, TypeVar

from pydantic import BaseModel

from runtime.agent.tools import AgentTool, AgentToolResult
from runtime.llm.abort import AbortSignal
from runtime.llm.events import AssistantMessageEventStream
from runtime.llm.options import StreamOptions
from runtime.llm.stream import stream as default_stream
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Context,
    ImageContent,
    Message,
    Model,
    TextContent,
    ToolCall,
)

__all__ = [
    "AfterToolCallContext",
    "AfterToolCallResult",
    "AgentContext",
    "AgentLoopConfig",
    "BeforeToolCallContext",
    "BeforeToolCallResult",
    "MaybeAwaitable",
    "ToolExecutionMode",
    "resolve",
]

T = TypeVar("T")
MaybeAwaitable: TypeAlias = T | Awaitable[T]
ToolExecutionMode: TypeAlias = Literal["parallel", "sequential"]


async def resolve(value: MaybeAwaitable[T]) -> T:
    """Await ``value`` if it is awaitable (hooks may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value


@dataclass
class AgentContext:
    """What the loop works on: system prompt, messages and *executable* tools.

    The loop copies it (the caller's lists are not mutated); the model sees ``tools`` through
    :meth:`AgentTool.to_tool`.
    """

    system_prompt: str = ""
    messages: list[AgentMessage] = field(default_factory=list)
    tools: list[AgentTool[Any]] = field(default_factory=list)

    def to_context(self) -> Context:
        """Return the serializable :class:`Context` (tools as JSON Schemas; ``None`` when empty)."""
        return Context(
            system_prompt=self.system_prompt,
            messages=list(self.messages),
            tools=[t.to_tool() for t in self.tools] or None,
        )

    @classmethod
    def from_context(cls, context: Context, tools: Sequence[AgentTool[Any]] = ()) -> AgentContext:
        """Build from a stored :class:`Context` plus the executable ``tools`` (its ``tools`` are ignored)."""
        return cls(system_prompt=context.system_prompt, messages=list(context.messages), tools=list(tools))


@dataclass
class BeforeToolCallContext:
    """Input of ``before_tool_call``: the call, its validated ``args`` and the loop's context."""

    assistant_message: AssistantMessage
    tool_call: ToolCall
    args: BaseModel
    context: AgentContext


@dataclass
class BeforeToolCallResult:
    """``block=True`` stops the call; ``reason`` becomes the error result's text."""

    block: bool = False
    reason: str | None = None


@dataclass
class AfterToolCallContext:
    """Input of ``after_tool_call``: the call, its args, the tool's result and whether it failed."""

    assistant_message: AssistantMessage
    tool_call: ToolCall
    args: BaseModel
    result: AgentToolResult
    is_error: bool
    context: AgentContext


@dataclass
class AfterToolCallResult:
    """Overrides of a tool result; a ``None`` field keeps the original value."""

    content: list[TextContent | ImageContent] | None = None
    details: Any = None
    is_error: bool | None = None


StreamFnT: TypeAlias = Callable[[Model, Context, StreamOptions | None], AssistantMessageEventStream]


@dataclass
class AgentLoopConfig:
    """Everything that parameterizes :func:`runtime.agent.loop.agent_loop`.

    Raises:
        ValueError: ``max_iterations`` below 1, or an unknown ``tool_execution`` mode.

    Attributes:
        model: The model called every turn.
        convert_to_llm: ``(messages) -> list[Message]``; default drops custom messages. The loop
            then applies :func:`runtime.agent.replay.prepare_replay` (errored/aborted responses
            dropped), unless the hook returned :class:`runtime.agent.replay.Prepared`.
        transform_context: ``(messages, signal) -> messages`` before every LLM call (compaction,
            pruning); the result is used for that call only, the loop's context is unchanged.
        get_api_key: ``(provider) -> key | None``, resolved before every LLM call (short-lived
            tokens); a key overrides ``stream_options.api_key``.
        before_tool_call: ``(BeforeToolCallContext, signal) -> BeforeToolCallResult | None``;
            ``block=True`` turns the call into an error result with ``reason``.
        after_tool_call: ``(AfterToolCallContext, signal) -> AfterToolCallResult | None``;
            overrides content/details/is_error.
        tool_execution: ``parallel`` (default): calls run concurrently, ``tool_execution_end`` as
            each finishes, results appended in source order; ``sequential``: one after another.
        get_steering_messages: ``() -> messages`` polled at loop start and after each whole tool
            batch; they enter the context before the next LLM call.
        get_follow_up_messages: ``() -> messages`` polled only when the loop would otherwise stop.
        max_iterations: Most LLM calls in one run (``None``: unbounded; else ≥ 1). When the budget is
            spent the run ends after the current turn (its tool calls still run, so the context
            stays valid) with ``agent_end.reason == "max_iterations"``; queued steering and
            follow-up messages are then not polled.
        stream_options: Template copied for every LLM call (``dataclasses.replace``) with the
            loop's ``signal`` and the resolved api key filled in; the structured-reply layer sets
            ``output_schema``/``tool_choice`` here.
        stream_fn: ``(model, context, options) -> AssistantMessageEventStream``; default
            :func:`runtime.llm.stream.stream` (wrap it for fallbacks or metrics).
    """

    model: Model
    convert_to_llm: Callable[[list[AgentMessage]], MaybeAwaitable[list[Message]]] | None = None
    transform_context: (
        Callable[[list[AgentMessage], AbortSignal | None], MaybeAwaitable[list[AgentMessage]]] | None
    ) = None
    get_api_key: Callable[[str], MaybeAwaitable[str | None]] | None = None
    before_tool_call: (
        Callable[[BeforeToolCallContext, AbortSignal | None], MaybeAwaitable[BeforeToolCallResult | None]]
        | None
    ) = None
    after_tool_call: (
        Callable[[AfterToolCallContext, AbortSignal | None], MaybeAwaitable[AfterToolCallResult | None]]
        | None
    ) = None
    tool_execution: ToolExecutionMode = "parallel"
    get_steering_messages: Callable[[], MaybeAwaitable[list[AgentMessage]]] | None = None
    get_follow_up_messages: Callable[[], MaybeAwaitable[list[AgentMessage]]] | None = None
    max_iterations: int | None = None
    stream_options: StreamOptions | None = None
    stream_fn: StreamFnT = default_stream

    def __post_init__(self) -> None:
        if self.max_iterations is not None and self.max_iterations < 1:
            raise ValueError(f"max_iterations must be >= 1 or None, got {self.max_iterations}")
        if self.tool_execution not in ("parallel", "sequential"):
            raise ValueError(
                f"tool_execution must be 'parallel' or 'sequential', got {self.tool_execution!r}"
            )

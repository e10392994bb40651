"""The stateless agent loop: ``agent_loop`` and ``agent_loop_continue``
(docs/decisions.md#agent-loop-hooks).

One run alternates LLM calls and tool batches until the model stops asking for tools, then
drains follow-up messages; see :mod:`runtime.agent.events` for the event order. Rules:

* Steering is polled at loop start and after each whole tool batch (never in the middle of a
  batch: its tools always all run); steering messages enter the context before the next LLM call.
* Follow-ups are polled only when the loop would otherwise stop
  (docs/decisions.md#steer-between-batches).
* Before every LLM call: ``transform_context`` (result used for that call only), then
  ``convert_to_llm``, then :func:`runtime.agent.replay.prepare_replay` (unless the hook returned
  :class:`runtime.agent.replay.Prepared`), then ``get_api_key``.
* A response with stop_reason ``error`` or ``aborted`` ends the run. Abort during a tool batch
  gives the unfinished calls "interrupted" results, then the run ends with an assistant message
  of stop_reason ``aborted`` synthesized without calling the provider, so the context stays
  valid for the next prompt.
* A steering/follow-up hook must return a list (or tuple) of agent messages, or ``None``; anything
  else raises ``TypeError`` out of the run rather than being dropped silently.
* Errors travel as events (pi rule): a failing ``stream_fn``, ``transform_context`` or
  ``convert_to_llm`` yields an assistant message with stop_reason ``error``; callers need no
  ``try`` around iteration.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from runtime import tracing
from runtime.agent.config import AgentContext, AgentLoopConfig, resolve
from runtime.agent.events import (
    AgentEndEvent,
    AgentEndReason,
    AgentEvent,
    AgentEventStream,
    AgentStartEvent,
    MessageEndEvent,
    MessageStartEvent,
    MessageUpdateEvent,
    TurnEndEvent,
    TurnStartEvent,
)
from runtime.agent.replay import Prepared, default_convert_to_llm, prepare_replay
from runtime.agent.tool_executor import execute_tool_calls
from runtime.llm.abort import AbortSignal
from runtime.llm.options import StreamOptions
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Context,
    CustomMessage,
    ToolResultMessage,
    UserMessage,
)

__all__ = [
    "AgentContext",
    "AgentLoopConfig",
    "Emit",
    "agent_loop",
    "agent_loop_continue",
    "run_agent_loop",
    "run_agent_loop_continue",
]

Emit = Callable[[AgentEvent], Awaitable[None]]
"""Receives every event; awaited, so a slow listener slows the loop (the Agent relies on this)."""


class _Run:
    def __init__(
        self, context: AgentContext, config: AgentLoopConfig, emit: Emit, signal: AbortSignal | None
    ) -> None:
        self.ctx = AgentContext(context.system_prompt, list(context.messages), list(context.tools))
        self.config = config
        self.emit = emit
        self.signal = signal
        self.new_messages: list[AgentMessage] = []
        self.llm_calls = 0

    def aborted(self) -> bool:
        return self.signal is not None and self.signal.aborted

    async def add(self, message: AgentMessage) -> None:
        self.ctx.messages.append(message)
        self.new_messages.append(message)
        await self.emit(MessageStartEvent(message))
        await self.emit(MessageEndEvent(message))

    async def poll(self, hook: Callable[[], object] | None) -> list[AgentMessage]:
        if hook is None:
            return []
        got = await resolve(hook())
        if got is None:
            return []
        if not isinstance(got, list | tuple):
            raise TypeError(
                f"steering/follow-up hook returned {type(got).__name__}; expected a list of messages"
            )
        for m in got:
            if not isinstance(m, UserMessage | AssistantMessage | ToolResultMessage | CustomMessage):
                raise TypeError(
                    f"steering/follow-up hook returned a {type(m).__name__} item; expected agent messages"
                )
        return list(got)

    def _bare(self, stop_reason: str, error: str) -> AssistantMessage:
        return AssistantMessage.error_for(self.config.model, error, aborted=stop_reason == "aborted")

    async def _llm_context(self) -> Context:
        messages: list[AgentMessage] = list(self.ctx.messages)
        if self.config.transform_context is not None:
            messages = list(await resolve(self.config.transform_context(messages, self.signal)))
        convert = self.config.convert_to_llm
        llm = await resolve(convert(messages)) if convert is not None else default_convert_to_llm(messages)
        tools = [t.to_tool() for t in self.ctx.tools] or None
        if isinstance(llm, Prepared):  # replayed and typed already: not validated again (O(context))
            return Context.model_construct(
                system_prompt=self.ctx.system_prompt, messages=list(llm), tools=tools
            )
        return Context(system_prompt=self.ctx.system_prompt, messages=list(prepare_replay(llm)), tools=tools)

    async def _options(self) -> StreamOptions:
        template = self.config.stream_options
        opts = dataclasses.replace(template) if template is not None else StreamOptions()
        opts.signal = self.signal
        if self.config.get_api_key is not None:
            key = await resolve(self.config.get_api_key(self.config.model.provider))
            if key:
                opts.api_key = key
        return opts

    async def respond(self) -> AssistantMessage:
        """One LLM call, streamed into the context; always returns the final message."""
        if self.aborted():
            msg = self._bare("aborted", (self.signal.reason if self.signal else None) or "aborted")
            await self.add(msg)
            return msg
        self.llm_calls += 1
        try:
            llm_ctx = await self._llm_context()
            s = self.config.stream_fn(self.config.model, llm_ctx, await self._options())
        except Exception as exc:
            msg = self._bare("error", f"{type(exc).__name__}: {exc}")
            await self.add(msg)
            return msg
        partial: AssistantMessage | None = None
        first_token = True
        async for ev in s:
            if ev.type == "start":
                partial = ev.partial
                self.ctx.messages.append(partial)
                await self.emit(MessageStartEvent(partial))
            elif ev.type == "done" or ev.type == "error":
                final = ev.message if ev.type == "done" else ev.error
                if partial is None:
                    self.ctx.messages.append(final)
                    await self.emit(MessageStartEvent(final))
                else:
                    self.ctx.messages[-1] = final
                self.new_messages.append(final)
                await self.emit(MessageEndEvent(final))
                return final
            elif partial is not None:
                if first_token:  # time to first token (docs/decisions.md#ops-traces)
                    tracing.event("first_token")
                    first_token = False
                await self.emit(MessageUpdateEvent(partial, ev))
        final = await s.result()  # iteration ended without a terminal event: defensive
        self.new_messages.append(final)
        await self.emit(MessageEndEvent(final))
        return final

    def budget_spent(self) -> bool:
        limit = self.config.max_iterations
        return limit is not None and self.llm_calls >= limit

    async def loop(self, pending: list[AgentMessage]) -> AgentEndReason:
        first = True
        while True:
            more_tools = True
            while more_tools or pending:
                if not first:
                    await self.emit(TurnStartEvent())
                first = False
                for m in pending:
                    await self.add(m)
                pending = []
                with tracing.span("llm.call", model=self.config.model.id) as step:
                    message = await self.respond()
                    u = message.usage
                    step.set(stop_reason=message.stop_reason, input_tokens=u.input, output_tokens=u.output)
                if message.stop_reason == "error" or message.stop_reason == "aborted":
                    await self.emit(TurnEndEvent(message, []))
                    return message.stop_reason
                more_tools = bool(message.tool_calls())
                results = []
                if more_tools:
                    results = await execute_tool_calls(self.ctx, message, self.config, self.signal, self.emit)
                    for r in results:
                        await self.add(r)
                await self.emit(TurnEndEvent(message, results))
                if self.aborted() and more_tools:
                    await self.emit(TurnStartEvent())
                    reason = (self.signal.reason if self.signal else None) or "aborted"
                    msg = self._bare("aborted", reason)
                    await self.add(msg)
                    await self.emit(TurnEndEvent(msg, []))
                    return "aborted"
                if self.budget_spent():
                    return "max_iterations" if more_tools else "stop"
                pending = await self.poll(self.config.get_steering_messages)
            if self.aborted():
                return "stop"
            follow = await self.poll(self.config.get_follow_up_messages)
            if not follow:
                return "stop"
            pending = follow

    async def run(self, prompts: Sequence[AgentMessage] | None) -> list[AgentMessage]:
        await self.emit(AgentStartEvent())
        await self.emit(TurnStartEvent())
        for p in prompts or ():
            await self.add(p)
        pending = await self.poll(self.config.get_steering_messages)
        reason = await self.loop(pending)
        await self.emit(AgentEndEvent(list(self.new_messages), reason))
        return self.new_messages


def _check_continuable(context: AgentContext) -> None:
    if not context.messages:
        raise ValueError("cannot continue: the context has no messages")
    last = context.messages[-1]
    if isinstance(last, AssistantMessage):
        raise ValueError("cannot continue from an assistant message: add a user message or tool result first")


async def run_agent_loop(
    prompts: Sequence[AgentMessage],
    context: AgentContext,
    config: AgentLoopConfig,
    emit: Emit,
    signal: AbortSignal | None = None,
) -> list[AgentMessage]:
    """Callback form of :func:`agent_loop`: awaits ``emit(event)`` for every event.

    Returns:
        The messages the run added (prompts included), the same list as ``agent_end.messages``.
    """
    return await _Run(context, config, emit, signal).run(list(prompts))


async def run_agent_loop_continue(
    context: AgentContext, config: AgentLoopConfig, emit: Emit, signal: AbortSignal | None = None
) -> list[AgentMessage]:
    """Callback form of :func:`agent_loop_continue`.

    Raises:
        ValueError: the context is empty or ends with an assistant message.
    """
    _check_continuable(context)
    return await _Run(context, config, emit, signal).run(None)


def _iterate(start: Callable[[Emit], Coroutine[Any, Any, list[AgentMessage]]]) -> AgentEventStream:
    """Bridge the callback form to an :class:`AgentEventStream` in lockstep: ``emit`` returns only
    when the consumer asks for the next event, so a consumer that reacts to an event (e.g. aborts)
    sees the loop exactly where that event left it. The run's messages are the stream's result;
    a bug in a hook (steering/follow-up polling) is raised to the consumer; closing the iteration
    early cancels the run."""
    stream = AgentEventStream(cancel_on_close=True)

    async def produce() -> None:
        try:
            stream.end(await start(stream.send))
        except BaseException as exc:
            stream.fail(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise

    stream.attach(asyncio.get_running_loop().create_task(produce()))
    return stream


def agent_loop(
    prompts: Sequence[AgentMessage],
    context: AgentContext,
    config: AgentLoopConfig,
    signal: AbortSignal | None = None,
) -> AgentEventStream:
    """Run the agent on new ``prompts`` and yield its events.

    Args:
        prompts: Messages added to the context first (usually one :class:`UserMessage`).
        context: System prompt, prior messages and executable tools; not mutated.
        config: Model and hooks (:class:`AgentLoopConfig`).
        signal: Abort for the whole run (streams and tools).

    Returns:
        An :class:`AgentEventStream` of :data:`AgentEvent` (the run starts at once; must be called
        with a running event loop); the last event is ``agent_end`` whose ``messages`` are
        everything the run added, also the stream's ``result()``. LLM and tool failures are
        events, not exceptions; only a hook that polls steering/follow-ups can raise out of the
        iteration. Stopping the iteration early (or ``aclose()``) cancels the run.
    """
    return _iterate(lambda emit: run_agent_loop(prompts, context, config, emit, signal))


def agent_loop_continue(
    context: AgentContext, config: AgentLoopConfig, signal: AbortSignal | None = None
) -> AgentEventStream:
    """Resume from ``context`` without a new prompt (e.g. after tool results or a failed call).

    Raises:
        ValueError: at once, if the context is empty or ends with an assistant message.
    """
    _check_continuable(context)
    return _iterate(lambda emit: run_agent_loop_continue(context, config, emit, signal))

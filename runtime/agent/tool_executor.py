"""Runs one assistant message's tool calls for the agent loop
(docs/decisions.md#agent-tool-errors-contained).

Rules:

* ``stop_reason == "length"``: no call runs; each gets an error result asking the model to
  re-issue it (its arguments may be truncated). No ``tool_execution_*`` events for them.
* Otherwise each call is *prepared* in source order: ``tool_execution_start``, validation
  (:func:`~runtime.agent.tools.validate_tool_call`), then ``before_tool_call``. An unknown tool, invalid
  arguments or a block become an error result at once (``tool_execution_end`` right away).
* ``parallel``: every prepared call runs concurrently; ``tool_execution_end`` is emitted as each
  finishes (after ``after_tool_call``). ``sequential``: prepare → run → end, one call at a time.
* Results are returned in the assistant's source order whatever the completion order.
* Abort (the signal fires) cancels the calls still running; they, and calls not started yet,
  get a synthetic "interrupted" error result, so every call has exactly one result.
* Exceptions from a tool or a hook never escape: they become error results naming the tool. So
  do wrong return types (a tool returning neither ``AgentToolResult`` nor ``str``, content that is
  not text/image blocks, a hook returning something other than its result class or ``None``).
  ``execute`` may be a coroutine function or a plain function; a plain function runs in a worker
  thread (``asyncio.to_thread``), so blocking work in a tool never stalls the event loop that
  every other session on the same host shares (docs/decisions.md#session-hosts). Its ``on_update``
  calls are handed back to the loop thread-safely.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from runtime import tracing
from runtime.agent.config import (
    AfterToolCallContext,
    AfterToolCallResult,
    AgentContext,
    AgentLoopConfig,
    BeforeToolCallContext,
    BeforeToolCallResult,
    resolve,
)
from runtime.agent.events import (
    AgentEvent,
    ToolExecutionEndEvent,
    ToolExecutionStartEvent,
    ToolExecutionUpdateEvent,
)
from runtime.agent.replay import interrupted_result
from runtime.agent.tools import (
    AgentTool,
    AgentToolResult,
    ToolNotFoundError,
    ToolValidationError,
    validate_tool_call,
)
from runtime.llm.abort import AbortSignal
from runtime.llm.types import AssistantMessage, TextContent, ToolCall, ToolResultMessage
from runtime.metrics import TOOL_CALLS

__all__ = ["execute_tool_calls", "length_result"]

Emit = Callable[[AgentEvent], Awaitable[None]]


def _is_async(fn: Any) -> bool:
    """Whether calling ``fn`` gives an awaitable to run on the loop: a coroutine function, or an
    object whose ``__call__`` is one (a ``functools.partial`` of one counts too)."""
    target = getattr(fn, "func", fn)
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004
    )


def length_result(call: ToolCall) -> ToolResultMessage:
    """Error result for a call cut off by the output limit (stop_reason ``length``)."""
    text = (
        f"Tool call {call.name!r} was not executed: the response hit the output token limit "
        "(stop_reason 'length'), so its arguments may be truncated. Re-issue the call in a new response."
    )
    return ToolResultMessage(
        tool_call_id=call.id, tool_name=call.name, content=[TextContent(text=text)], is_error=True
    )


def _error_result(call: ToolCall, text: str) -> ToolResultMessage:
    return ToolResultMessage(
        tool_call_id=call.id, tool_name=call.name, content=[TextContent(text=text)], is_error=True
    )


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']} ({exc.error_count()} error(s))"


@dataclass
class _Prepared:
    index: int
    call: ToolCall
    tool: AgentTool[Any]
    args: BaseModel


class _Batch:
    """State of one batch: results by source index plus the shared event queue of running tools."""

    def __init__(
        self,
        context: AgentContext,
        assistant: AssistantMessage,
        config: AgentLoopConfig,
        signal: AbortSignal | None,
        emit: Emit,
    ) -> None:
        self.context = context
        self.assistant = assistant
        self.config = config
        self.signal = signal
        self.emit = emit
        self.calls = assistant.tool_calls()
        self.results: dict[int, ToolResultMessage] = {}
        self.queue: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()
        self.running: dict[int, tuple[_Prepared, asyncio.Task[None]]] = {}
        self.announced: set[int] = set()
        """Indexes whose ``tool_execution_start`` was emitted."""

    # ------------------------------------------------------------------ helpers
    def aborted(self) -> bool:
        return self.signal is not None and self.signal.aborted

    async def finish(self, index: int, result: ToolResultMessage, outcome: str) -> None:
        self.results[index] = result
        TOOL_CALLS.inc(outcome=outcome)
        await self.emit(
            ToolExecutionEndEvent(
                tool_call_id=result.tool_call_id,
                tool_name=result.tool_name,
                result=result,
                is_error=result.is_error,
            )
        )

    async def prepare(self, index: int) -> _Prepared | None:
        call = self.calls[index]
        self.announced.add(index)
        await self.emit(
            ToolExecutionStartEvent(
                tool_call_id=call.id, tool_name=call.name, args=dict(call.arguments or {})
            )
        )
        try:
            args = validate_tool_call(self.context.tools, call)
        except (ToolNotFoundError, ToolValidationError) as exc:
            await self.finish(index, _error_result(call, str(exc)), "error")
            return None
        tool = next(t for t in self.context.tools if t.name == call.name)
        hook = self.config.before_tool_call
        if hook is not None:
            try:
                verdict = await resolve(
                    hook(BeforeToolCallContext(self.assistant, call, args, self.context), self.signal)
                )
            except Exception as exc:
                await self.finish(
                    index, _error_result(call, f"before_tool_call failed for {call.name!r}: {exc}"), "error"
                )
                return None
            if verdict is not None and not isinstance(verdict, BeforeToolCallResult):
                text = (
                    f"before_tool_call returned {type(verdict).__name__} for {call.name!r}; "
                    "expected BeforeToolCallResult or None"
                )
                await self.finish(index, _error_result(call, text), "error")
                return None
            if verdict is not None and verdict.block:
                reason = verdict.reason or f"Tool call {call.name!r} was blocked."
                await self.finish(index, _error_result(call, reason), "blocked")
                return None
        return _Prepared(index, call, tool, args)

    def start(self, p: _Prepared) -> None:
        loop = asyncio.get_running_loop()

        def on_update(partial: AgentToolResult) -> None:
            self.queue.put_nowait(("update", p.index, partial))

        def on_update_from_thread(partial: AgentToolResult) -> None:
            loop.call_soon_threadsafe(on_update, partial)

        async def invoke() -> None:
            try:
                execute = p.tool.execute
                if _is_async(execute):
                    out: object = await resolve(execute(p.call.id, p.args, self.signal, on_update))
                else:  # blocking work off the loop (docs/decisions.md#session-hosts)
                    out = await resolve(
                        await asyncio.to_thread(
                            execute, p.call.id, p.args, self.signal, on_update_from_thread
                        )
                    )
                if isinstance(out, str):
                    result, failed = AgentToolResult.text(out), False
                elif isinstance(out, AgentToolResult):
                    result, failed = out, False
                else:
                    text = (
                        f"Tool {p.call.name!r} returned {type(out).__name__}; expected AgentToolResult or str"
                    )
                    result, failed = AgentToolResult.text(text), True
                self.queue.put_nowait(("done", p.index, (result, failed)))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                text = f"Tool {p.call.name!r} failed: {type(exc).__name__}: {exc}"
                self.queue.put_nowait(("done", p.index, (AgentToolResult.text(text), True)))

        async def traced() -> None:  # the tool as a span of the turn (docs/decisions.md#ops-traces)
            with tracing.span("tool", tool=p.call.name):
                await invoke()

        task = asyncio.get_running_loop().create_task(traced() if tracing.enabled() else invoke())
        self.running[p.index] = (p, task)

    async def completed(self, p: _Prepared, result: AgentToolResult, is_error: bool) -> None:
        content, details = list(result.content), result.details
        hook = self.config.after_tool_call
        if hook is not None:
            try:
                over = await resolve(
                    hook(
                        AfterToolCallContext(self.assistant, p.call, p.args, result, is_error, self.context),
                        self.signal,
                    )
                )
            except Exception as exc:
                over = None
                content, is_error = (
                    [TextContent(text=f"after_tool_call failed for {p.call.name!r}: {exc}")],
                    True,
                )
            if over is not None and not isinstance(over, AfterToolCallResult):
                content, is_error = (
                    [
                        TextContent(
                            text=f"after_tool_call returned {type(over).__name__} for {p.call.name!r}; "
                            "expected AfterToolCallResult or None"
                        )
                    ],
                    True,
                )
            elif over is not None:
                content = list(over.content) if over.content is not None else content
                details = over.details if over.details is not None else details
                is_error = over.is_error if over.is_error is not None else is_error
        try:
            msg = ToolResultMessage(
                tool_call_id=p.call.id,
                tool_name=p.call.name,
                content=content,
                details=details,
                is_error=is_error,
            )
        except ValidationError as exc:  # content that is not text/image blocks
            text = f"Tool {p.call.name!r} returned invalid content: {_first_error(exc)}"
            msg = _error_result(p.call, text)
        await self.finish(p.index, msg, "error" if msg.is_error else "ok")

    async def drain(self) -> bool:
        """Process queue items until no call is running; False if the signal fired first."""
        abort_wait: asyncio.Task[None] | None = None
        if self.signal is not None:
            abort_wait = asyncio.get_running_loop().create_task(self.signal.wait())
        try:
            while self.running:
                getter = asyncio.get_running_loop().create_task(self.queue.get())
                waits: set[asyncio.Future[Any]] = {getter}
                if abort_wait is not None:
                    waits.add(abort_wait)
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    return False
                kind, index, payload = getter.result()
                entry = self.running.get(index)
                if entry is None:
                    continue
                p = entry[0]
                if kind == "update":
                    await self.emit(
                        ToolExecutionUpdateEvent(
                            tool_call_id=p.call.id,
                            tool_name=p.call.name,
                            args=dict(p.call.arguments),
                            partial_result=payload,
                        )
                    )
                else:
                    del self.running[index]
                    await self.completed(p, *payload)
            return True
        finally:
            if abort_wait is not None and not abort_wait.done():
                abort_wait.cancel()

    async def interrupt_rest(self) -> None:
        """Cancel running calls and give every call without a result an interrupted result."""
        tasks = [t for _, t in self.running.values()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.running = {}
        reason = (self.signal.reason if self.signal is not None else None) or "aborted"
        for index, call in enumerate(self.calls):
            if index in self.results:
                continue
            if index not in self.announced:
                await self.emit(
                    ToolExecutionStartEvent(
                        tool_call_id=call.id, tool_name=call.name, args=dict(call.arguments or {})
                    )
                )
            await self.finish(index, interrupted_result(call, reason), "error")

    # ------------------------------------------------------------------ modes
    async def run(self) -> list[ToolResultMessage]:
        try:
            if self.config.tool_execution == "sequential":
                for index in range(len(self.calls)):
                    if self.aborted():
                        break
                    p = await self.prepare(index)
                    if p is not None and not self.aborted():
                        self.start(p)
                        if not await self.drain():
                            break
            else:
                for index in range(len(self.calls)):
                    if self.aborted():
                        break
                    p = await self.prepare(index)
                    if p is not None and not self.aborted():
                        self.start(p)
                await self.drain()
            if len(self.results) < len(self.calls):
                await self.interrupt_rest()
            return [self.results[i] for i in range(len(self.calls))]
        finally:
            for _, task in self.running.values():  # only left on cancellation or a listener bug
                task.cancel()


async def execute_tool_calls(
    context: AgentContext,
    assistant: AssistantMessage,
    config: AgentLoopConfig,
    signal: AbortSignal | None,
    emit: Emit,
) -> list[ToolResultMessage]:
    """Run ``assistant``'s tool calls and return one result per call, in source order.

    Args:
        context: The loop's context (its ``tools`` are the executable tools).
        assistant: The response holding the calls.
        config: ``tool_execution``, ``before_tool_call``, ``after_tool_call``.
        signal: Abort; see the module docstring.
        emit: Awaited for every ``tool_execution_*`` event.

    Raises:
        Nothing for tool or hook failures (they become error results); only cancellation of the
        calling task propagates.
    """
    calls = assistant.tool_calls()
    if assistant.stop_reason == "length":
        return [length_result(c) for c in calls]
    return await _Batch(context, assistant, config, signal, emit).run()

"""The stateful :class:`Agent`: queues plus a small state reducer over the loop's events.

``prompt`` / ``continue_`` / ``subscribe`` / ``abort`` / ``wait_for_idle`` / ``steer`` /
``follow_up`` / ``clear_*_queue`` (docs/decisions.md#agent-loop-hooks). The loop itself is
:mod:`runtime.agent.loop`; the agent feeds it its own steering and follow-up queues through
``get_steering_messages`` / ``get_follow_up_messages`` and keeps ``state.messages`` in step with
``message_end`` events.

Queue modes (``ai.agent.steering_mode`` / ``follow_up_mode``, `docs/decisions.md#queue-modes`):
``one-at-a-time`` (default) hands the loop one queued message per poll; ``all`` hands over the
whole queue. This is the one queue implementation: ``sessionray chat``, the README tour, sub-agents
and every turn of a live IM session run on :class:`Agent` (`docs/decisions.md#agent-one-engine`).
A live IM turn keeps its follow-ups out of the loop (``drain_follow_ups=False``) because each
follow-up gets its own IM reply; it takes them with :meth:`Agent.take_queued` when the run ends.

Example:
    >>> import asyncio
    >>> from providers.faux import register_faux_provider, faux_assistant_message
    >>> async def demo() -> list[str]:
    ...     handle = register_faux_provider([faux_assistant_message("Hi!")])
    ...     agent = Agent(model=handle.get_model(), system_prompt="Be nice.")
    ...     await agent.prompt("hello")
    ...     return [m.role for m in agent.state.messages]
    >>> asyncio.run(demo())
    ['user', 'assistant']
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from runtime.agent.config import AgentContext, AgentLoopConfig, ToolExecutionMode, resolve
from runtime.agent.events import AgentEndEvent, AgentEvent
from runtime.agent.loop import run_agent_loop, run_agent_loop_continue
from runtime.agent.tools import AgentTool
from runtime.llm.abort import AbortController, AbortSignal
from runtime.llm.options import StreamOptions
from runtime.llm.stream import stream as default_stream
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    CustomMessage,
    ImageContent,
    Model,
    TextContent,
    ToolResultMessage,
    UserMessage,
)

__all__ = ["Agent", "AgentBusyError", "AgentListener", "AgentState", "QueueMode"]

log = logging.getLogger(__name__)

_MESSAGE_TYPES = (UserMessage, AssistantMessage, ToolResultMessage, CustomMessage)


def _as_message(message: object, what: str, *, allow_text: bool = True) -> AgentMessage:
    """``message`` as an agent message (text becomes a :class:`UserMessage` when allowed).

    Raises:
        TypeError: anything else; the text names the method and the type received.
    """
    if isinstance(message, _MESSAGE_TYPES):
        return message
    if allow_text and isinstance(message, str):
        return UserMessage(content=message)
    kinds = "text or an agent message" if allow_text else "agent messages"
    raise TypeError(
        f"{what} takes {kinds} (UserMessage, AssistantMessage, ToolResultMessage, CustomMessage), "
        f"got {type(message).__name__}"
    )


QueueMode: TypeAlias = Literal["one-at-a-time", "all"]
AgentListener: TypeAlias = Callable[[AgentEvent, AbortSignal], Awaitable[None] | None]
"""``listener(event, signal)``; may be async. Listeners are awaited in subscription order."""


class AgentBusyError(RuntimeError):
    """``prompt``/``continue_`` was called while a run is in progress."""


@dataclass
class AgentState:
    """What an :class:`Agent` knows; read it freely, mutate ``model``/``tools``/``system_prompt``
    between runs.

    Attributes:
        system_prompt: Sent with every call.
        model: The model (required before ``prompt``).
        tools: Executable tools.
        messages: The whole conversation (custom messages included), updated on ``message_end``.
        is_streaming: True while a run is in progress.
        streaming_message: The message being streamed (live partial), else ``None``.
        pending_tool_calls: Ids of tool calls started and not yet ended.
        error: ``error_message`` of the last failed/aborted response, else ``None``.
    """

    system_prompt: str = ""
    model: Model | None = None
    tools: list[AgentTool[Any]] = field(default_factory=list)
    messages: list[AgentMessage] = field(default_factory=list)
    is_streaming: bool = False
    streaming_message: AgentMessage | None = None
    pending_tool_calls: set[str] = field(default_factory=set)
    error: str | None = None


class Agent:
    """A conversation with one model: run prompts through :func:`runtime.agent.loop.agent_loop`.

    Args:
        model: The model.
        system_prompt: System prompt.
        tools: Executable tools.
        messages: Prior conversation.
        steering_mode: How many queued steering messages each poll takes.
        follow_up_mode: Same for follow-ups.
        tool_execution: ``parallel`` | ``sequential``.
        max_iterations: LLM-call budget per run (see :class:`AgentLoopConfig`).
        convert_to_llm, transform_context, get_api_key, before_tool_call, after_tool_call,
        stream_options, stream_fn: Passed to :class:`AgentLoopConfig` unchanged.
        drain_follow_ups: ``False``: the loop never polls the follow-up queue; queued follow-ups
            stay for :meth:`take_queued` (an IM turn runs each as a turn of its own).
        configure_loop: ``config -> config``, applied to each run's :class:`AgentLoopConfig` last
            (an owner wraps ``stream_fn`` or adds hooks, e.g. the IM reply contract).

    Attributes:
        failure: The exception a listener or hook raised in the last run (recorded as an
            ``error`` assistant message, see :meth:`prompt`), else ``None``.
    """

    def __init__(
        self,
        *,
        model: Model | None = None,
        system_prompt: str = "",
        tools: Sequence[AgentTool[Any]] = (),
        messages: Sequence[AgentMessage] = (),
        steering_mode: QueueMode = "one-at-a-time",
        follow_up_mode: QueueMode = "one-at-a-time",
        tool_execution: ToolExecutionMode = "parallel",
        max_iterations: int | None = None,
        convert_to_llm: Any = None,
        transform_context: Any = None,
        get_api_key: Any = None,
        before_tool_call: Any = None,
        after_tool_call: Any = None,
        stream_options: StreamOptions | None = None,
        stream_fn: Any = None,
        drain_follow_ups: bool = True,
        configure_loop: Callable[[AgentLoopConfig], AgentLoopConfig] | None = None,
    ) -> None:
        self.state = AgentState(
            system_prompt=system_prompt, model=model, tools=list(tools), messages=list(messages)
        )
        self.steering_mode: QueueMode = steering_mode
        self.follow_up_mode: QueueMode = follow_up_mode
        self.tool_execution: ToolExecutionMode = tool_execution
        self.max_iterations = max_iterations
        self.convert_to_llm = convert_to_llm
        self.transform_context = transform_context
        self.get_api_key = get_api_key
        self.before_tool_call = before_tool_call
        self.after_tool_call = after_tool_call
        self.stream_options = stream_options
        self.stream_fn = stream_fn or default_stream
        self.drain_follow_ups = drain_follow_ups
        self.configure_loop = configure_loop
        self.failure: Exception | None = None
        self._listeners: list[AgentListener] = []
        self._steering: list[AgentMessage] = []
        self._follow_ups: list[AgentMessage] = []
        self._controller: AbortController | None = None
        self._idle: asyncio.Future[None] | None = None
        self._taken: list[tuple[AgentMessage, list[AgentMessage]]] = []
        """Queued messages this run took, with the queue each came from (put back if never used)."""
        self._unended: list[AgentMessage] = []
        """Prompt/steering/tool-result messages whose ``message_start`` was seen but not their end."""
        self._ended = False
        """True once this run's ``agent_end`` was reduced."""

    # ------------------------------------------------------------------ events
    def subscribe(self, listener: AgentListener) -> Callable[[], None]:
        """Add ``listener(event, signal)``; returns a function that removes it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def _reduce(self, event: AgentEvent) -> None:
        s = self.state
        if event.type == "message_start" or event.type == "message_update":
            s.streaming_message = event.message
            if event.type == "message_start" and not isinstance(event.message, AssistantMessage):
                self._unended.append(event.message)  # complete already; kept if a listener fails
        elif event.type == "message_end":
            s.streaming_message = None
            self._unended = [m for m in self._unended if m is not event.message]
            s.messages.append(event.message)
        elif event.type == "agent_end":
            self._ended = True
        elif event.type == "tool_execution_start":
            s.pending_tool_calls.add(event.tool_call_id)
        elif event.type == "tool_execution_end":
            s.pending_tool_calls.discard(event.tool_call_id)
        elif event.type == "turn_end" and event.message.error_message:
            s.error = event.message.error_message

    async def _emit(self, event: AgentEvent) -> None:
        self._reduce(event)
        signal = self._controller.signal if self._controller else AbortController().signal
        for listener in list(self._listeners):
            await resolve(listener(event, signal))

    # ------------------------------------------------------------------ queues
    def steer(self, message: str | AgentMessage) -> None:
        """Queue a message for the running turn: it reaches the model after the current tool
        batch (or at the next run's start). Never skips tools already requested.

        Args:
            message: An agent message, or text (becomes a :class:`UserMessage`).

        Raises:
            TypeError: ``message`` is neither text nor an agent message (nothing is queued).
        """
        self._steering.append(_as_message(message, "steer"))

    def follow_up(self, message: str | AgentMessage) -> None:
        """Queue a message processed when the agent would otherwise stop.

        Args:
            message: An agent message, or text (becomes a :class:`UserMessage`).

        Raises:
            TypeError: ``message`` is neither text nor an agent message (nothing is queued).
        """
        self._follow_ups.append(_as_message(message, "follow_up"))

    def clear_steering_queue(self) -> None:
        """Drop queued steering messages."""
        self._steering.clear()

    def clear_follow_up_queue(self) -> None:
        """Drop queued follow-up messages."""
        self._follow_ups.clear()

    def clear_all_queues(self) -> None:
        """Drop both queues."""
        self._steering.clear()
        self._follow_ups.clear()

    def has_queued_messages(self) -> bool:
        """True if a steering or follow-up message is waiting."""
        return bool(self._steering or self._follow_ups)

    def take_queued(self) -> tuple[list[AgentMessage], list[AgentMessage]]:
        """Empty both queues and return ``(steering, follow_ups)`` in arrival order (what a run
        did not take: steering that came after the last LLM call, follow-ups the loop was told
        not to drain)."""
        steering, follow_ups = list(self._steering), list(self._follow_ups)
        self.clear_all_queues()
        return steering, follow_ups

    @staticmethod
    def _take(queue: list[AgentMessage], mode: QueueMode) -> list[AgentMessage]:
        if not queue:
            return []
        if mode == "all":
            out = list(queue)
            queue.clear()
            return out
        return [queue.pop(0)]

    # ------------------------------------------------------------------ runs
    @property
    def signal(self) -> AbortSignal | None:
        """The running run's abort signal, else ``None``."""
        return self._controller.signal if self._controller else None

    def abort(self, reason: str = "aborted") -> None:
        """Abort the running run (stream and tools); no-op when idle."""
        if self._controller is not None:
            self._controller.abort(reason)

    async def wait_for_idle(self) -> None:
        """Return once no run is in progress."""
        if self._idle is not None:
            await asyncio.shield(self._idle)

    def reset(self) -> None:
        """Forget messages, queues and error (keeps model, tools and system prompt).

        Raises:
            AgentBusyError: a run is in progress (``abort()`` and ``await wait_for_idle()`` first;
                clearing under a running loop would leave its messages half recorded).
        """
        if self.state.is_streaming:
            raise AgentBusyError(
                "cannot reset while a run is in progress: abort() and await wait_for_idle() first"
            )
        self.state.messages.clear()
        self.state.error = None
        self.clear_all_queues()

    async def prompt(
        self,
        message: str | AgentMessage | Sequence[AgentMessage],
        images: Sequence[ImageContent] | None = None,
        *,
        signal: AbortSignal | None = None,
    ) -> None:
        """Run the agent on a new prompt and return when the run (follow-ups included) ends.

        Args:
            message: Text (becomes a :class:`UserMessage`, with ``images`` appended as blocks),
                one message, or several.
            images: Images for a text prompt.
            signal: An outside abort signal; when it fires, the run aborts as by :meth:`abort`.

        Raises:
            AgentBusyError: a run is in progress; use :meth:`steer` or :meth:`follow_up`.
            ValueError: no model is set, ``images`` given with a message that is not text, or
                ``max_iterations``/``tool_execution`` is invalid (see :class:`AgentLoopConfig`).
            TypeError: an item is not an agent message (nothing is run or recorded).
        """
        self._check_idle()
        if isinstance(message, str):
            if images:
                content: list[TextContent | ImageContent] = [TextContent(text=message), *images]
                prompts: list[AgentMessage] = [UserMessage(content=content)]
            else:
                prompts = [UserMessage(content=message)]
        else:
            if images:
                raise ValueError(
                    "images= goes with a text prompt; put ImageContent blocks in the message instead"
                )
            if isinstance(message, _MESSAGE_TYPES):
                prompts = [message]
            elif isinstance(message, Sequence):
                prompts = [_as_message(m, "prompt", allow_text=False) for m in message]
            else:
                raise TypeError(
                    f"prompt takes text, an agent message or a list of them, got {type(message).__name__}"
                )
        await self._run(prompts, signal)

    async def continue_(self, *, signal: AbortSignal | None = None) -> None:
        """Resume from the current messages (after tool results, an error or queued messages).

        When the last message is an assistant message, queued steering (then follow-up) messages
        are used as the prompt. ``signal``: as for :meth:`prompt`.

        Raises:
            AgentBusyError: a run is in progress.
            ValueError: nothing to continue from.
        """
        self._check_idle()
        msgs = self.state.messages
        if not msgs:
            raise ValueError("no messages to continue from")
        if isinstance(msgs[-1], AssistantMessage):
            steering = self._take(self._steering, self.steering_mode)
            if steering:
                await self._run(steering, signal)
                return
            follow = self._take(self._follow_ups, self.follow_up_mode)
            if follow:
                await self._run(follow, signal)
                return
            raise ValueError("cannot continue from an assistant message: prompt, steer or follow_up first")
        await self._run(None, signal)

    async def _record_failure(
        self, model: Model, controller: AbortController, exc: Exception, prompts: list[AgentMessage]
    ) -> None:
        """End a run that a listener or hook broke: stop its stream and tools, keep the prompts and
        every complete message it had started (a prompt whose listener raised is not lost), put
        queued steering/follow-up messages it took but never added back at the front of their
        queue, append an ``error`` assistant message and emit ``agent_end`` once. A failure in an
        ``agent_end`` listener only sets ``state.error`` (the run itself had finished)."""
        s = self.state
        self.failure = exc
        text = f"{type(exc).__name__}: {exc}"
        was_aborted = controller.signal.aborted
        controller.abort(f"run failed: {text}")  # the provider stream and running tools stop
        for m in [*prompts, *self._unended]:  # a prompt whose listener failed before it was added
            if not any(m is kept for kept in s.messages):
                s.messages.append(m)
        self._unended = []
        # Steering/follow-up messages taken from a queue but never added: back to the queue front.
        for m, queue in reversed(self._taken):
            if not any(m is kept for kept in s.messages):
                queue.insert(0, m)
        self._taken = []
        if self._ended:
            log.warning("agent_end listener failed: %s", text)
            s.error = text
            return
        msg = AssistantMessage.error_for(model, text, aborted=was_aborted)
        s.messages.append(msg)
        s.error = msg.error_message
        try:
            await self._emit(AgentEndEvent([msg], "error"))
        except Exception:
            log.exception("a listener failed on the agent_end of a failed run")
            s.error = msg.error_message

    def _check_idle(self) -> None:
        if self.state.is_streaming:
            raise AgentBusyError(
                "Agent is already processing a prompt. Use steer() or follow_up() to queue a message, "
                "or await wait_for_idle() first."
            )

    def _config(self, model: Model) -> AgentLoopConfig:
        async def steering() -> list[AgentMessage]:
            taken = self._take(self._steering, self.steering_mode)
            self._taken.extend((m, self._steering) for m in taken)
            return taken

        async def follow_ups() -> list[AgentMessage]:
            taken = self._take(self._follow_ups, self.follow_up_mode)
            self._taken.extend((m, self._follow_ups) for m in taken)
            return taken

        config = AgentLoopConfig(
            model=model,
            convert_to_llm=self.convert_to_llm,
            transform_context=self.transform_context,
            get_api_key=self.get_api_key,
            before_tool_call=self.before_tool_call,
            after_tool_call=self.after_tool_call,
            tool_execution=self.tool_execution,
            get_steering_messages=steering,
            get_follow_up_messages=follow_ups if self.drain_follow_ups else None,
            max_iterations=self.max_iterations,
            stream_options=self.stream_options,
            stream_fn=self.stream_fn,
        )
        return self.configure_loop(config) if self.configure_loop is not None else config

    async def _run(self, prompts: list[AgentMessage] | None, outside: AbortSignal | None = None) -> None:
        model = self.state.model
        if model is None:
            raise ValueError("Agent has no model: pass model=... or set agent.state.model")
        config = self._config(
            model
        )  # ValueError for a bad max_iterations/tool_execution, before any state change
        s = self.state
        s.is_streaming, s.error, s.streaming_message = True, None, None
        self.failure = None
        self._controller = controller = AbortController()
        unlink = (
            outside.add_listener(lambda: controller.abort(outside.reason or "aborted")) if outside else None
        )
        self._idle = asyncio.get_running_loop().create_future()
        context = AgentContext(s.system_prompt, list(s.messages), list(s.tools))
        self._unended, self._ended, self._taken = [], False, []
        try:
            if prompts is None:
                await run_agent_loop_continue(context, config, self._emit, controller.signal)
            else:
                await run_agent_loop(prompts, context, config, self._emit, controller.signal)
        except Exception as exc:  # a listener or hook bug: recorded like a failed response, never lost
            await self._record_failure(model, controller, exc, prompts or [])
        except asyncio.CancelledError:  # the caller cancelled prompt(): stop the provider call too
            controller.abort("cancelled")
            raise
        finally:
            if unlink is not None:
                unlink()
            s.is_streaming, s.streaming_message = False, None
            s.pending_tool_calls.clear()
            self._controller = None
            idle, self._idle = self._idle, None
            if idle is not None and not idle.done():
                idle.set_result(None)

"""The ``faux`` api: a scripted model for tests and for the offline built-in model
(docs/decisions.md#llm-builtin-model).

A *script* is a queue of steps. Each LLM call pops one step and streams it:

* an :class:`~runtime.llm.types.AssistantMessage` (build one with :func:`faux_assistant_message`), or
* a callable ``(context, options) -> AssistantMessage`` (sync or async) that computes the reply
  from what the model was sent (an async step may also wait, e.g. to simulate a slow model).

Streaming goes through :class:`runtime.llm.builder.MessageBuilder` and :func:`runtime.llm.events.run_stream`,
so the event rules are the same as for real providers: text and thinking stream in chunks of
``chunk_size`` characters, tool-call arguments stream as JSON text in chunks of the same size.
The abort signal is checked before every chunk (``stop_reason="aborted"``); an empty queue ends
the call with an ``error`` event (unless the handle has a ``default_response``).

One ``faux`` api registration serves every handle: a call is routed to the handle whose
``provider`` equals ``model.provider``, so several scripted providers (e.g. a test's ``faux`` and
the built-in model's ``builtin``) coexist. Registering a provider name again replaces its handle.

Nothing happens on import; call :func:`register_faux_provider`.

Example:
    >>> import asyncio
    >>> from runtime import Context, UserMessage, complete
    >>> async def demo() -> str:
    ...     handle = register_faux_provider(responses=[faux_assistant_message([faux_text("hi!")])])
    ...     reply = await complete(handle.get_model(), Context(messages=[UserMessage(content="hello")]))
    ...     return reply.text()
    >>> asyncio.run(demo())
    'hi!'
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import json
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from runtime.llm.abort import AbortSignal
from runtime.llm.builder import MessageBuilder
from runtime.llm.events import AssistantMessageEventStream, run_stream
from runtime.llm.options import SimpleStreamOptions, StreamOptions
from runtime.llm.registry import register_api_provider
from runtime.llm.types import (
    AssistantContent,
    AssistantMessage,
    Context,
    Model,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
)

__all__ = [
    "FAUX_API",
    "FauxCall",
    "FauxProviderHandle",
    "FauxStep",
    "faux_assistant_message",
    "faux_text",
    "faux_thinking",
    "faux_tool_call",
    "get_faux_provider",
    "register_faux_api",
    "register_faux_provider",
    "unregister_faux_provider",
]

FAUX_API = "faux"
"""The api id every faux model carries (``Model.api``)."""

FauxStep: TypeAlias = (
    AssistantMessage
    | Callable[[Context, StreamOptions | None], AssistantMessage | Awaitable[AssistantMessage]]
)
"""One scripted reply: a message, or a function of ``(context, options)`` returning one."""

_call_ids = itertools.count(1)


# --------------------------------------------------------------------------- script helpers


def faux_text(text: str) -> TextContent:
    """Return a text block for :func:`faux_assistant_message`."""
    return TextContent(text=text)


def faux_thinking(text: str, *, signature: str | None = None) -> ThinkingContent:
    """Return a thinking block (streamed as ``thinking_*`` events)."""
    return ThinkingContent(thinking=text, signature=signature)


def faux_tool_call(
    name: str, arguments: dict[str, Any] | str | None = None, id: str | None = None
) -> ToolCall:
    """Return a tool-call block.

    Args:
        name: Tool name.
        arguments: A dict (streamed as its JSON text), or a *raw* JSON string streamed verbatim
            (``""``, ``"null"`` or truncated JSON, to exercise argument parsing), or ``None``
            (means ``{}``).
        id: Call id; defaults to ``faux-call-<n>`` from a process-wide counter.
    """
    call_id = id if id is not None else f"faux-call-{next(_call_ids)}"
    if isinstance(arguments, str):
        # Raw JSON text: kept unvalidated on purpose; the stream parses it like a wire payload.
        raw: Any = arguments
        return ToolCall.model_construct(
            type="toolCall", id=call_id, name=name, arguments=raw, thought_signature=None
        )
    return ToolCall(id=call_id, name=name, arguments=arguments or {})


def faux_assistant_message(
    blocks: str | AssistantContent | Sequence[AssistantContent],
    stop_reason: StopReason = "stop",
    *,
    error_message: str | None = None,
) -> AssistantMessage:
    """Return a scripted assistant message.

    Args:
        blocks: A string (one text block), one block, or a list of blocks in stream order.
        stop_reason: The reply's stop reason. ``"stop"`` on a message with tool calls is streamed
            as ``"toolUse"`` (what a real provider reports); ``"length"`` is kept (the agent loop
            then refuses to run the calls); ``"error"``/``"aborted"`` end with an ``error`` event
            carrying ``error_message``.
        error_message: Text for ``error``/``aborted`` replies.
    """
    if isinstance(blocks, str):
        content: list[Any] = [TextContent(text=blocks)]
    elif isinstance(blocks, TextContent | ThinkingContent | ToolCall):
        content = [blocks]
    else:
        content = list(blocks)
    # Model instances are taken as they are (pydantic does not revalidate them), so a raw-JSON
    # tool call from faux_tool_call survives until the stream parses it.
    return AssistantMessage(content=content, stop_reason=stop_reason, error_message=error_message)


# --------------------------------------------------------------------------- the handle


@dataclass(frozen=True)
class FauxCall:
    """One recorded call: the model, a deep copy of the context it was sent, and the options."""

    model: Model
    context: Context
    options: StreamOptions | None


class FauxProviderHandle:
    """A registered scripted provider (returned by :func:`register_faux_provider`).

    Attributes:
        provider: The provider name routed to this handle (``Model.provider``).
        models: The models it serves (all with ``api="faux"``).
        calls: The calls received, in order (:class:`FauxCall`), for assertions on what the
            model was sent; only the last ``max_recorded_calls`` are kept when that is set.
        max_recorded_calls: Bound on ``calls`` (``None``: keep every call, the default for tests;
            ``0``: keep none — long-lived hosts such as the built-in model use a bound so a session
            actor does not hold a deep copy of every context it ever sent).
        chunk_size: Characters per streamed chunk (≥ 1).
        max_chunks: At most this many chunks per block (≥ 1; ``None``: no bound): a longer block
            streams in proportionally larger chunks, so its event count stays bounded.
        chunk_delay_s: Seconds to wait between chunks (0: only yield to the event loop); the
            wait ends early when the call's signal fires.
        default_response: Step used when the queue is empty (``None``: an empty queue is an error).
    """

    def __init__(
        self,
        provider: str,
        models: list[Model],
        *,
        chunk_size: int,
        chunk_delay_s: float,
        default_response: FauxStep | None,
        max_recorded_calls: int | None = None,
        max_chunks: int | None = None,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        if max_chunks is not None and max_chunks < 1:
            raise ValueError(f"max_chunks must be >= 1, got {max_chunks}")
        self.max_chunks = max_chunks
        self.provider = provider
        self.models = models
        self.calls: list[FauxCall] = []
        self.max_recorded_calls = max_recorded_calls
        self._call_count = 0
        self.chunk_size = chunk_size
        self.chunk_delay_s = chunk_delay_s
        self.default_response = default_response
        self._queue: deque[FauxStep] = deque()

    @property
    def api(self) -> str:
        """Always ``"faux"``."""
        return FAUX_API

    def get_model(self, model_id: str | None = None) -> Model:
        """Return the model ``model_id`` (default: the first model).

        Raises:
            KeyError: no model with that id; the message lists the ids.
        """
        if model_id is None:
            return self.models[0]
        for m in self.models:
            if m.id == model_id:
                return m
        raise KeyError(
            f"faux provider {self.provider!r} has no model {model_id!r}; models: "
            f"{[m.id for m in self.models]}"
        )

    def set_responses(self, steps: Iterable[FauxStep]) -> None:
        """Replace the queue of scripted steps."""
        self._queue = deque(steps)

    def append_responses(self, steps: Iterable[FauxStep]) -> None:
        """Append steps to the queue."""
        self._queue.extend(steps)

    @property
    def pending_count(self) -> int:
        """Steps not yet consumed."""
        return len(self._queue)

    def record(self, model: Model, context: Context, options: StreamOptions | None) -> None:
        """Count one call and keep a deep copy of its context (within ``max_recorded_calls``)."""
        self._call_count += 1
        limit = self.max_recorded_calls
        if limit is None or limit > 0:
            self.calls.append(FauxCall(model=model, context=context.model_copy(deep=True), options=options))
            if limit is not None and len(self.calls) > limit:
                del self.calls[: len(self.calls) - limit]

    @property
    def call_count(self) -> int:
        """Calls received so far (including calls that found the queue empty and calls no longer
        kept in ``calls``)."""
        return self._call_count

    def unregister(self) -> None:
        """Stop routing calls to this handle (the ``faux`` api itself stays registered)."""
        if _handles.get(self.provider) is self:
            del _handles[self.provider]

    # ------------------------------------------------------------------ streaming
    def _next_step(self) -> FauxStep | None:
        if self._queue:
            return self._queue.popleft()
        return self.default_response

    async def _pause(self, signal: AbortSignal | None) -> None:
        if self.chunk_delay_s <= 0 or signal is None:
            await asyncio.sleep(self.chunk_delay_s if self.chunk_delay_s > 0 else 0)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(signal.wait(), self.chunk_delay_s)

    def _chunks(self, text: str) -> list[str]:
        n = self.chunk_size
        if self.max_chunks is not None:
            n = max(n, -(-len(text) // self.max_chunks))  # ceil: at most max_chunks pieces
        return [text[i : i + n] for i in range(0, len(text), n)] or [""]

    async def produce(
        self,
        model: Model,
        context: Context,
        options: StreamOptions | None,
        stream: AssistantMessageEventStream,
    ) -> None:
        """Stream one scripted reply into ``stream`` (the body of the ``faux`` api's ``stream``)."""
        signal = options.signal if options is not None else None
        b = MessageBuilder(stream, model)
        call_no = self._call_count
        step = self._next_step()
        if step is None:
            b.fail(
                f"faux provider {self.provider!r}: no scripted response left for call #{call_no} "
                f"(script more with set_responses/append_responses)"
            )
            return
        if isinstance(step, AssistantMessage):
            scripted = step
        else:
            produced = step(context, options)
            scripted = await produced if inspect.isawaitable(produced) else produced
            if not isinstance(scripted, AssistantMessage):
                raise TypeError(f"faux step returned {type(scripted).__name__}, expected AssistantMessage")

        b.start()
        b.message.usage = scripted.usage.model_copy(deep=True)
        b.message.response_id = scripted.response_id

        def aborted() -> bool:
            return signal is not None and signal.aborted

        for block in scripted.content:
            push: Callable[[str], None]
            if isinstance(block, TextContent):
                pieces = self._chunks(block.text)
                push = functools.partial(b.text_delta, signature=block.text_signature)
            elif isinstance(block, ThinkingContent):
                pieces = self._chunks(block.thinking)
                push = functools.partial(b.thinking_delta, signature=block.signature, redacted=block.redacted)
            else:
                raw = block.arguments if isinstance(block.arguments, str) else json.dumps(block.arguments)
                pieces = self._chunks(raw)
                if aborted():
                    break
                b.tool_call_start(block.id, block.name, thought_signature=block.thought_signature)
                push = b.tool_call_delta
            for piece in pieces:
                if aborted():
                    break
                push(piece)
                await self._pause(signal)
            if aborted():
                break
            b.close_block()
        if aborted():
            b.fail(signal.reason if signal is not None and signal.reason else "aborted", aborted=True)
            return
        stop = scripted.stop_reason
        if stop == "error" or stop == "aborted":
            b.fail(scripted.error_message or f"faux scripted {stop}", aborted=stop == "aborted")
            return
        if stop == "stop" and b.message.tool_calls():
            stop = "toolUse"
        b.finish(stop)


# --------------------------------------------------------------------------- the api


_handles: dict[str, FauxProviderHandle] = {}


def _crash_message(model: Model) -> Callable[[BaseException], AssistantMessage]:
    def build(exc: BaseException) -> AssistantMessage:
        return AssistantMessage.error_for(model, f"faux step failed: {type(exc).__name__}: {exc}")

    return build


def _stream(
    model: Model, context: Context, options: StreamOptions | None = None
) -> AssistantMessageEventStream:
    handle = _handles.get(model.provider)

    async def producer(stream: AssistantMessageEventStream) -> None:
        if handle is None:
            b = MessageBuilder(stream, model)
            b.fail(
                f"no faux provider registered under provider {model.provider!r}; "
                f"registered: {sorted(_handles)}"
            )
            return
        handle.record(model, context, options)
        await handle.produce(model, context, options, stream)

    return run_stream(producer, _crash_message(model))


def _stream_simple(
    model: Model, context: Context, options: SimpleStreamOptions | None = None
) -> AssistantMessageEventStream:
    return _stream(model, context, options)


def register_faux_api() -> None:
    """Register the ``faux`` api (source id ``faux``) in the api registry; idempotent.

    :func:`register_faux_provider` calls it; ``providers.register_builtin_providers`` too.
    """
    register_api_provider(FAUX_API, _stream, _stream_simple, source_id="faux")


_ensure_api_registered = register_faux_api  # kept for callers that used the earlier private name


def register_faux_provider(
    responses: Iterable[FauxStep] | None = None,
    *,
    provider: str = "faux",
    models: Sequence[str | Model] = ("faux-model",),
    chunk_size: int = 4,
    chunk_delay_s: float = 0.0,
    default_response: FauxStep | None = None,
    max_recorded_calls: int | None = None,
    max_chunks: int | None = None,
) -> FauxProviderHandle:
    """Register (or replace) a scripted provider and return its handle.

    Also (re)registers the ``faux`` api in the api registry (idempotent).

    Args:
        responses: Initial queue of steps.
        provider: Provider name; models get ``provider=<this>`` and calls route by it.
        models: Model ids (or whole :class:`Model` objects, whose ``api``/``provider`` are
            overwritten to ``faux``/``provider``).
        chunk_size: Characters per streamed chunk.
        chunk_delay_s: Seconds between chunks (for tests that need a slow stream; abort-aware).
        default_response: Step used whenever the queue is empty (the built-in model uses this).
        max_recorded_calls: Bound on the handle's ``calls`` history (``None``: unbounded).
        max_chunks: Bound on the chunks of one streamed block (``None``: ``chunk_size`` alone
            decides; the built-in model uses 64 so a multi-MB echo is not 4-character deltas).

    Raises:
        ValueError: ``chunk_size < 1``, ``max_chunks < 1`` or ``models`` is empty.
    """
    if not models:
        raise ValueError("register_faux_provider needs at least one model")
    built: list[Model] = []
    for m in models:
        if isinstance(m, Model):
            built.append(m.model_copy(update={"api": FAUX_API, "provider": provider}))
        else:
            built.append(Model(id=m, name=m, api=FAUX_API, provider=provider))
    handle = FauxProviderHandle(
        provider,
        built,
        chunk_size=chunk_size,
        chunk_delay_s=chunk_delay_s,
        default_response=default_response,
        max_recorded_calls=max_recorded_calls,
        max_chunks=max_chunks,
    )
    if responses is not None:
        handle.set_responses(responses)
    register_faux_api()
    _handles[provider] = handle
    return handle


def get_faux_provider(provider: str = "faux") -> FauxProviderHandle:
    """Return the handle registered under ``provider``.

    Raises:
        KeyError: none is registered; the message lists the registered names.
    """
    try:
        return _handles[provider]
    except KeyError:
        raise KeyError(f"no faux provider {provider!r}; registered: {sorted(_handles)}") from None


def unregister_faux_provider(provider: str = "faux") -> None:
    """Forget the handle registered under ``provider`` (no error if absent)."""
    _handles.pop(provider, None)

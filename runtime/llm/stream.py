"""The only LLM entry points: ``stream`` / ``complete`` and their ``_simple`` forms
(docs/decisions.md#llm-single-entry). Every call's usage is reported once when it ends
(:mod:`runtime.llm.usage`; docs/decisions.md#spend-ledger)."""

from __future__ import annotations

from runtime.llm.events import AssistantMessageEventStream
from runtime.llm.options import SimpleStreamOptions, StreamOptions
from runtime.llm.registry import get_api_provider
from runtime.llm.types import AssistantMessage, Context, Model
from runtime.llm.usage import observed

__all__ = ["complete", "complete_simple", "stream", "stream_simple"]


def stream(
    model: Model, context: Context, options: StreamOptions | None = None
) -> AssistantMessageEventStream:
    """Start one LLM call and return its event stream at once.

    Args:
        model: Which model; ``model.api`` selects the registered wire protocol.
        context: System prompt, messages and tools.
        options: See :class:`StreamOptions`.

    Returns:
        An async-iterable stream whose ``await result()`` gives the final message. Its terminal
        event comes after the call's usage was reported (:func:`runtime.llm.usage.observed`).

    Raises:
        UnknownApiError: ``model.api`` is not registered (raised synchronously, before any I/O).
        Provider failures after this returns are ``error`` events, never exceptions.
    """
    return observed(model, get_api_provider(model.api).stream(model, context, options))


def stream_simple(
    model: Model, context: Context, options: SimpleStreamOptions | None = None
) -> AssistantMessageEventStream:
    """Like :func:`stream` with the unified ``reasoning`` level (off/minimal/low/medium/high)."""
    return observed(model, get_api_provider(model.api).stream_simple(model, context, options))


async def complete(model: Model, context: Context, options: StreamOptions | None = None) -> AssistantMessage:
    """Run :func:`stream` to the end and return the final message (``stop_reason`` tells success)."""
    return await stream(model, context, options).result()


async def complete_simple(
    model: Model, context: Context, options: SimpleStreamOptions | None = None
) -> AssistantMessage:
    """Run :func:`stream_simple` to the end and return the final message."""
    return await stream_simple(model, context, options).result()

"""Which model answers a turn: vision routing and the fallback chain
(docs/decisions.md#model-routing, docs/decisions.md#model-fallback-chain).

Vision routing (switch to the vision model when the turn carries an image block):

* every turn, with or without tools, uses the session's main model (no "lite" model);
* :func:`select_model`: an inbound image and ``ai.vision_model`` configured → the vision model;
  otherwise the main model;
* :func:`guard_images`: before any request, image blocks sent to a model whose ``input`` lacks
  ``image`` become :data:`IMAGE_PLACEHOLDER` text — a short note, never a provider error. It is
  applied per candidate inside :class:`FallbackChain`, so a text-only fallback is safe too.

Fallback chain (``ai.fallback_models``, ordered): :class:`FallbackChain` is an
``AgentLoopConfig.stream_fn``. It calls the first candidate; when that call ends with an error
*before any content event* (only ``start`` was seen) and :func:`fallback_reason` classifies the
error as ``connection`` (connection failure or timeout), ``rate_limited`` (HTTP 429, after the
transport's own retries), ``server_error`` (HTTP 5xx) or ``overloaded`` (529 / ``overloaded``), the
same request goes to the next candidate. An error after content started is passed on unchanged
(the partial answer is never mixed with another model's). Other errors (400, 401, aborted) are
not retried elsewhere. Each switch logs one line and counts
``sessionray_model_fallbacks_total{from_api, to_api, reason}``.

Which model answered: the final :class:`~runtime.llm.types.AssistantMessage` carries the answering
candidate's ``provider``/``model`` (so ``ContextRepository.append_messages`` records it in
``agent_sessions.model``), and :attr:`FallbackChain.answered` holds it too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

from runtime import metrics
from runtime.agent.config import MaybeAwaitable, StreamFnT, resolve
from runtime.llm.events import AssistantMessageEventStream, ErrorEvent, StartEvent, run_stream
from runtime.llm.options import StreamOptions
from runtime.llm.stream import stream as default_stream
from runtime.llm.types import (
    AssistantMessage,
    Context,
    ImageContent,
    Model,
    TextContent,
    ToolResultMessage,
    UserMessage,
)

__all__ = [
    "IMAGE_PLACEHOLDER",
    "FallbackChain",
    "FallbackReason",
    "Route",
    "fallback_reason",
    "guard_images",
    "has_image_segments",
    "select_model",
]

log = logging.getLogger("runtime.session.model_routing")

IMAGE_PLACEHOLDER = "(image omitted: this model does not accept images)"
"""What an image becomes for a text-only model (same wording as the providers' hand-off)."""

Route: TypeAlias = Literal["vision_model", "main_model", "placeholder"]
FallbackReason: TypeAlias = Literal["connection", "rate_limited", "server_error", "overloaded"]


def has_image_segments(segments: Sequence[dict[str, Any]]) -> bool:
    """Whether canonical inbound segments include an ``image``."""
    return any(isinstance(s, dict) and s.get("type") == "image" for s in segments)


def select_model(main: Model, vision: Model | None, has_images: bool) -> tuple[Model, Route]:
    """Pick the model of a turn (docs/decisions.md#model-routing) and say why.

    Returns:
        ``(model, route)``: the vision model (``vision_model``) when the turn has images and one
        is configured; else the main model — ``main_model`` when it accepts images or the turn
        has none, ``placeholder`` when images will be replaced by :data:`IMAGE_PLACEHOLDER`.
        A turn with images is counted in ``sessionray_vision_routes_total{route}``.
    """
    if not has_images:
        return main, "main_model"
    if vision is not None:
        route: Route = "vision_model"
        model = vision
    else:
        route = "main_model" if "image" in main.input else "placeholder"
        model = main
    metrics.VISION_ROUTES.inc(route=route)
    return model, route


def _blocks(blocks: list[Any]) -> list[Any]:
    out: list[Any] = []
    for b in blocks:
        if isinstance(b, ImageContent):
            if not (out and isinstance(out[-1], TextContent) and out[-1].text == IMAGE_PLACEHOLDER):
                out.append(TextContent(text=IMAGE_PLACEHOLDER))
        else:
            out.append(b)
    return out


def guard_images(model: Model, context: Context) -> Context:
    """Return ``context`` with image blocks replaced by :data:`IMAGE_PLACEHOLDER` when ``model``
    does not accept images (unchanged — the same object — otherwise or when there are none)."""
    if "image" in model.input:
        return context
    changed = False
    messages: list[Any] = []
    for m in context.messages:
        content = m.content if isinstance(m, UserMessage | ToolResultMessage) else None
        if isinstance(content, list) and any(isinstance(b, ImageContent) for b in content):
            assert isinstance(m, UserMessage | ToolResultMessage)
            m = m.model_copy(update={"content": _blocks(list(m.content))})
            changed = True
        messages.append(m)
    return context.model_copy(update={"messages": messages}) if changed else context


_HTTP = re.compile(r"\bHTTP (\d{3})\b")


def fallback_reason(message: AssistantMessage) -> FallbackReason | None:
    """Classify a failed call's ``error_message`` (transport wording: ``HTTP 503: ...``,
    ``connection error: ...``, ``timeout: ...``, ``overloaded_error``); ``None`` means "do not
    move to another model" (client errors, aborts, unknown failures)."""
    if message.stop_reason != "error":
        return None
    text = message.error_message or ""
    low = text.lower()
    m = _HTTP.search(text)
    if m is not None:
        status = int(m.group(1))
        if status == 529 or "overloaded" in low:
            return "overloaded"
        if status == 429:
            return "rate_limited"
        if 500 <= status < 600:
            return "server_error"
        return None
    if "overloaded" in low:
        return "overloaded"
    if (
        low.startswith(("connection error", "timeout"))
        or "connecterror" in low
        or "connection refused" in low
    ):
        return "connection"
    return None


KeyFn: TypeAlias = Callable[[str], MaybeAwaitable[str | None]]


@dataclass
class FallbackChain:
    """An ``AgentLoopConfig.stream_fn`` that walks ``ai.fallback_models`` (see the module docstring).

    Attributes:
        fallbacks: Ordered candidates tried after the call's own model (duplicates of it skipped).
        base_stream_fn: The underlying stream function (default :func:`runtime.llm.stream.stream`).
        get_api_key: ``(provider) -> key | None`` for a candidate of another provider than the
            call's model (the loop resolved the key for the call's model only); default
            :func:`runtime.config.get_api_key`. ``None`` leaves the key to the provider's env.
        answered: The candidate that produced the last call's final message (``None`` before).
        switches: ``(from ref, to ref, reason)`` of every switch so far, in order.
    """

    fallbacks: Sequence[Model] = ()
    base_stream_fn: StreamFnT = default_stream
    get_api_key: KeyFn | None = None
    answered: Model | None = None

    def __post_init__(self) -> None:
        self.switches: list[tuple[str, str, str]] = []

    def candidates(self, model: Model) -> list[Model]:
        """``model`` followed by the fallbacks that are not the same model."""
        out = [model]
        for m in self.fallbacks:
            if all((m.provider, m.id) != (c.provider, c.id) for c in out):
                out.append(m)
        return out

    async def _key(self, provider: str) -> str | None:
        if self.get_api_key is None:
            from runtime.config import get_api_key

            return get_api_key(provider)
        return await resolve(self.get_api_key(provider))

    def __call__(
        self, model: Model, context: Context, options: StreamOptions | None
    ) -> AssistantMessageEventStream:
        """Stream the request through the chain; same contract as :func:`runtime.llm.stream.stream`."""
        chain = self.candidates(model)

        async def producer(out: AssistantMessageEventStream) -> None:
            for i, cand in enumerate(chain):
                opts = options
                if i > 0 and opts is not None and cand.provider != model.provider:
                    opts = replace(opts, api_key=await self._key(cand.provider))
                inner = self.base_stream_fn(cand, guard_images(cand, context), opts)
                held: list[Any] = []
                started = False
                async for ev in inner:
                    if started:
                        out.push(ev)
                        continue
                    if isinstance(ev, StartEvent):
                        held.append(ev)
                        continue
                    if isinstance(ev, ErrorEvent) and i + 1 < len(chain):
                        reason = fallback_reason(ev.error)
                        if reason is not None:
                            self._switch(cand, chain[i + 1], reason, ev.error.error_message or "")
                            break
                    started = True
                    for h in held:
                        out.push(h)
                    out.push(ev)
                else:
                    self.answered = cand
                    return

        def crash(exc: BaseException) -> AssistantMessage:
            return AssistantMessage.error_for(model, str(exc))

        return run_stream(producer, crash)

    def _switch(self, src: Model, dst: Model, reason: str, error: str) -> None:
        self.switches.append((src.ref(), dst.ref(), reason))
        metrics.MODEL_FALLBACKS.inc(from_api=src.api, to_api=dst.api, reason=reason)
        log.warning(
            "model fallback %s -> %s (%s) after an error before any content: %s",
            src.ref(),
            dst.ref(),
            reason,
            error[:300],
        )

"""Api ``anthropic-messages``: Anthropic Messages API over SSE (``POST {base_url}/v1/messages``).

Stream rules (docs/decisions.md#llm-errors-as-events):

* the event type is the ``event:`` line, falling back to the payload's ``type`` when it is missing;
* ``content_block_start/delta/stop``: deltas are dispatched by *delta* type (``text_delta``,
  ``thinking_delta``, ``signature_delta``, ``input_json_delta``), never by a whitelist of block
  types; ``content_block_stop`` closes the block so consecutive blocks stay separate;
* tool input is the concatenation of the block's ``partial_json`` pieces, parsed once at block
  stop. The start's ``input`` is used only when no delta arrived (so ``{}`` + deltas never gives
  ``{}{...}``); a zero-argument tool yields ``{}``;
* ``redacted_thinking`` blocks become ``ThinkingContent(redacted=True, signature=<data>)``;
* usage from ``message_start`` and ``message_delta`` (``input_tokens``, ``output_tokens``,
  ``cache_read_input_tokens`` → cache_read, ``cache_creation_input_tokens`` → cache_write);
* ``stop_reason``: ``end_turn``/``stop_sequence``/``pause_turn`` → stop, ``max_tokens`` and
  ``model_context_window_exceeded`` → length, ``tool_use`` → toolUse, ``refusal`` → error;
* a ``content_block_delta`` whose ``index`` is not the open block's ends the stream with an
  ``error`` (content so far kept) rather than being appended to the wrong block;
* ``ping`` is ignored; an ``error`` event ends the stream with the provider's message
  (``overloaded_error``/``api_error``/``rate_limit_error`` are retried if no content came yet).

``StreamOptions.output_schema`` is not sent (no native schema mode is used for this api; the
structured-output layer falls back to its tool tier). ``StreamOptions.extra`` keys:
``http_client``, ``anthropic_version`` (header, default ``2023-06-01``), ``thinking_budget``
(tokens, default by reasoning level).

``StreamOptions.temperature`` is **not sent** by default: the current Messages API request
(``anthropic.types.MessageCreateParams`` of the official SDK) has no sampling parameters, newer
models answer 400 to ``temperature``, and extended thinking never took it
(docs/decisions.md#provider-request-bodies). A model whose ``compat`` has ``send_temperature:
true`` (an older model or a compatible server that still honours it) gets it, and even then never
together with ``thinking``.
"""

from __future__ import annotations

import json
from typing import Any

from providers.common import (
    finalize_usage,
    join_url,
    loads,
    request_secrets,
    require_user_turn,
    sendable_user,
)
from providers.handoff import anthropic_tool_id, transform_messages
from providers.sse_api import SseApi
from providers.transport import HttpRequest, ProviderStreamError
from runtime.llm.builder import MessageBuilder
from runtime.llm.options import StreamOptions
from runtime.llm.types import (
    AssistantMessage,
    Context,
    ImageContent,
    Model,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)

__all__ = [
    "API",
    "AnthropicMessagesParser",
    "build_request_body",
    "stream_anthropic_messages",
    "stream_simple",
]

API = "anthropic-messages"
DEFAULT_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
THINKING_BUDGETS = {"minimal": 1024, "low": 2048, "medium": 8192, "high": 16384}
"""Thinking budget in tokens per unified reasoning level."""

_STOP: dict[str, StopReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "toolUse",
    "refusal": "error",
}
_RETRYABLE_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error"})

# --------------------------------------------------------------------------- request


def _blocks(content: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in content:
        if isinstance(b, TextContent):
            if b.text.strip():  # the API rejects a text block without non-whitespace text
                out.append({"type": "text", "text": b.text})
        elif isinstance(b, ImageContent):
            out.append(
                {"type": "image", "source": {"type": "base64", "media_type": b.mime_type, "data": b.data}}
            )
    return out


def _assistant_blocks(msg: AssistantMessage) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in msg.content:
        if isinstance(b, TextContent):
            if b.text.strip():
                out.append({"type": "text", "text": b.text})
        elif isinstance(b, ThinkingContent):
            if b.redacted and b.signature:
                out.append({"type": "redacted_thinking", "data": b.signature})
            elif b.signature:
                out.append({"type": "thinking", "thinking": b.thinking, "signature": b.signature})
            elif b.thinking.strip():  # same model but unsigned: the API rejects it as thinking
                out.append({"type": "text", "text": b.thinking})
        elif isinstance(b, ToolCall):
            out.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.arguments})
    return out


def convert_messages(model: Model, context: Context) -> list[dict[str, Any]]:
    """Turn ``context.messages`` into Messages-API ``messages`` (after cross-provider handoff).

    Consecutive tool results are merged into one ``user`` message of ``tool_result`` blocks (the
    API requires results right after the ``tool_use`` turn); tool-call ids are normalized to
    ``[a-zA-Z0-9_-]{1,64}``. Empty text blocks are dropped (the API rejects them); a user message
    with nothing to send is sent as ``NO_TEXT`` (:func:`providers.common.sendable_user`).

    Raises:
        ContextError: the result would be empty or end on the assistant's message
            (docs/decisions.md#llm-user-turns).
    """
    out: list[dict[str, Any]] = []
    for msg in transform_messages(context.messages, model, anthropic_tool_id):
        if isinstance(msg, UserMessage):
            msg = sendable_user(msg)
            content = msg.content if isinstance(msg.content, str) else _blocks(msg.content)
            out.append({"role": "user", "content": content})
        elif isinstance(msg, AssistantMessage):
            blocks = _assistant_blocks(msg)
            if blocks:
                out.append({"role": "assistant", "content": blocks})
        elif isinstance(msg, ToolResultMessage):
            result = {
                "type": "tool_result",
                "tool_use_id": msg.tool_call_id,
                "content": _blocks(msg.content) or [{"type": "text", "text": "(no output)"}],
                "is_error": msg.is_error,
            }
            last = out[-1] if out else None
            if last and last["role"] == "user" and isinstance(last["content"], list) and last.get("_results"):
                last["content"].append(result)
            else:
                out.append({"role": "user", "content": [result], "_results": True})
    for m in out:
        m.pop("_results", None)
    require_user_turn(out, "assistant")
    return out


def build_request_body(
    model: Model, context: Context, options: StreamOptions, reasoning: str = "off"
) -> dict[str, Any]:
    """Build the ``POST /v1/messages`` JSON (``stream: true``).

    ``max_tokens`` (tokens) defaults to ``model.max_tokens``; with reasoning on, ``thinking`` gets
    a budget from :data:`THINKING_BUDGETS` (or ``options.extra["thinking_budget"]``) and
    ``max_tokens`` is raised above it. ``temperature`` only with ``compat.send_temperature`` and
    no thinking (see the module docstring). ``tool_choice``: ``auto``/``none``/``required`` (→ ``any``)
    or a tool name (→ ``{"type": "tool", "name": ...}``).
    """
    max_tokens = options.max_tokens or model.max_tokens
    body: dict[str, Any] = {
        "model": model.id,
        "max_tokens": max_tokens,
        "stream": True,
        "messages": convert_messages(model, context),
    }
    if context.system_prompt:
        body["system"] = context.system_prompt
    thinking = bool(model.reasoning and reasoning != "off")
    if options.temperature is not None and model.compat.get("send_temperature") and not thinking:
        body["temperature"] = options.temperature
    if context.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in context.tools
        ]
        choice = options.tool_choice
        if choice in ("auto", "none"):
            body["tool_choice"] = {"type": choice}
        elif choice == "required":
            body["tool_choice"] = {"type": "any"}
        elif choice:
            body["tool_choice"] = {"type": "tool", "name": choice}
    if thinking:
        budget = int(options.extra.get("thinking_budget") or THINKING_BUDGETS.get(reasoning, 8192))
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
        body["max_tokens"] = max(max_tokens, budget + 1024)
    return body


# --------------------------------------------------------------------------- stream parsing


class AnthropicMessagesParser:
    """Turns Messages-API stream events into :class:`MessageBuilder` calls (one per attempt)."""

    __slots__ = ("_b", "_initial", "_model", "_open_idx", "_stop", "_stopped", "_tool_raw")

    def __init__(self, builder: MessageBuilder, model: Model) -> None:
        self._b = builder
        self._model = model
        builder.message.usage = Usage()
        self._stop: str | None = None
        self._stopped = False
        self._initial: dict[int, Any] = {}  # block index -> non-empty input from content_block_start
        self._tool_raw: dict[int, bool] = {}  # block index -> got input_json_delta
        self._open_idx: Any = None  # ``index`` of the block opened by the last content_block_start

    def on_event(self, event: str | None, data: str) -> None:
        """Handle one event; ``event`` falls back to the payload's ``type``."""
        if not data.strip():  # an empty keep-alive ``data:`` line
            return
        payload = loads(data)
        kind = event or payload.get("type")
        b = self._b
        if kind == "content_block_delta":
            if "index" in payload and payload["index"] != self._open_idx:
                # a delta for a block that was never started (or already stopped) would be
                # appended to the wrong block; end the stream instead, keeping what came so far
                raise ProviderStreamError(
                    f"content_block_delta for block {payload['index']!r}, which is not open "
                    f"(open block: {self._open_idx!r})"
                )
            delta = payload.get("delta") or {}
            dt = delta.get("type")
            if dt == "text_delta":
                b.text_delta(delta.get("text", ""))
            elif dt == "input_json_delta":
                part = delta.get("partial_json", "")
                if part:
                    self._tool_raw[payload.get("index", -1)] = True
                    b.tool_call_delta(part)
            elif dt == "thinking_delta":
                b.thinking_delta(delta.get("thinking", ""))
            elif dt == "signature_delta":
                b.set_thinking_signature(delta.get("signature", ""))
            # citations_delta and future delta types carry no text of their own
        elif kind == "content_block_start":
            self._block_start(payload.get("index", -1), payload.get("content_block") or {})
        elif kind == "content_block_stop":
            idx = payload.get("index", -1)
            if "index" in payload and idx != self._open_idx:
                return  # stop of a block that is not open: nothing to close
            self._open_idx = None
            initial = self._initial.pop(idx, None)
            if initial is not None and not self._tool_raw.get(idx):
                b.tool_call_delta(json.dumps(initial, ensure_ascii=False))
            b.close_block()
        elif kind == "message_start":
            msg = payload.get("message") or {}
            if isinstance(msg.get("id"), str):
                b.message.response_id = msg["id"]
            self._usage(msg.get("usage") or {})
        elif kind == "message_delta":
            stop = (payload.get("delta") or {}).get("stop_reason")
            if stop:
                self._stop = stop
            self._usage(payload.get("usage") or {})
        elif kind == "message_stop":
            self._stopped = True
        elif kind == "error":
            err = payload.get("error") or {}
            etype = err.get("type", "error")
            raise ProviderStreamError(
                f"{etype}: {err.get('message', '')}", retryable=etype in _RETRYABLE_ERRORS
            )
        # ping and unknown events: nothing to do

    def on_body(self, data: str) -> None:
        """Handle a non-streaming ``message`` body by replaying it as the equivalent events."""
        doc = loads(data)
        if doc.get("type") == "error":
            self.on_event("error", data)
        self.on_event("message_start", json.dumps({"type": "message_start", "message": doc}))
        for i, block in enumerate(doc.get("content") or []):
            self._block_start(i, block)
            self.on_event("content_block_stop", json.dumps({"type": "content_block_stop", "index": i}))
        self._stop = doc.get("stop_reason") or "end_turn"
        self._stopped = True
        self.on_end()

    def _block_start(self, idx: int, block: dict[str, Any]) -> None:
        b = self._b
        self._open_idx = idx
        bt = block.get("type")
        if bt == "tool_use":
            b.tool_call_start(block.get("id", ""), block.get("name", ""))
            initial = block.get("input")
            if initial:
                self._initial[idx] = initial
        elif bt == "thinking":
            sig = block.get("signature")
            b.thinking_delta(
                block.get("thinking", ""), signature=sig if isinstance(sig, str) and sig else None
            )
        elif bt == "redacted_thinking":
            data = block.get("data")
            b.thinking_delta("", signature=data if isinstance(data, str) else "", redacted=True)
        elif bt == "text":
            b.text_delta(block.get("text", ""))
        else:
            b.close_block()  # server tools, results, future types: their text deltas open a text block

    def _usage(self, u: dict[str, Any]) -> None:
        if not u:
            return
        usage = self._b.message.usage
        if u.get("input_tokens") is not None:
            usage.input = u["input_tokens"]
        if u.get("output_tokens") is not None:
            usage.output = u["output_tokens"]
        if u.get("cache_read_input_tokens") is not None:
            usage.cache_read = u["cache_read_input_tokens"]
        if u.get("cache_creation_input_tokens") is not None:
            usage.cache_write = u["cache_creation_input_tokens"]
        finalize_usage(self._model, usage)

    def on_end(self) -> None:
        """Push the terminal event: ``done`` after ``message_stop``/a stop reason, else ``error``."""
        b = self._b
        if self._stop is None and not self._stopped:
            b.fail("stream ended before message_stop")
            return
        reason = _STOP.get(self._stop or "end_turn", "stop")
        if reason == "error":
            b.message.error_message = f"stop_reason: {self._stop}"
        b.finish(reason)


# --------------------------------------------------------------------------- entry points


def _request(model: Model, context: Context, options: StreamOptions, reasoning: str) -> HttpRequest:
    key = options.api_key  # resolved by stream_sse_call
    headers = {
        "content-type": "application/json",
        "accept": "text/event-stream",
        "anthropic-version": str(options.extra.get("anthropic_version", ANTHROPIC_VERSION)),
        **model.headers,
        **options.headers,
    }
    if key:
        headers["x-api-key"] = key
    base = (model.base_url or DEFAULT_BASE_URL).rstrip("/")
    url = join_url(base, "messages" if base.endswith("/v1") else "v1/messages")
    body = build_request_body(model, context, options, reasoning)
    return HttpRequest(url, headers, body, request_secrets(key, headers))


PROTOCOL = SseApi(API, _request, AnthropicMessagesParser)
"""This api's request and parser; its stream functions below."""
stream_anthropic_messages = PROTOCOL.stream
stream_simple = PROTOCOL.stream_simple

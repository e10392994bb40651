"""Api ``openai-completions``: OpenAI Chat Completions over SSE, and every compatible server.

Wire adapter only (request JSON ↔ context, stream chunks ↔ builder calls); HTTP lives in
:mod:`providers.transport`, vendor differences in :mod:`providers.profiles` (``compat`` flags).

Stream rules (docs/decisions.md#llm-errors-as-events):

* text from ``delta.content``; thinking from ``delta.reasoning_content`` (DeepSeek),
  ``delta.reasoning`` or ``delta.reasoning_text`` (vLLM, OpenRouter, Ollama);
* tool calls keyed by ``index``; arguments arrive in pieces and are parsed once when the call
  closes. A delta with no ``index`` opens a new slot when it carries a new ``id`` and continues the
  latest slot when the id is missing too (servers seen in the wild omit ``index``); an ``index``
  reused with a new ``id`` opens a new slot, and id-less pieces at that index continue it;
* usage is read from **any** chunk that carries it, including the final ``choices: []`` chunk;
  ``prompt_tokens`` includes cached tokens, so ``input = prompt_tokens - cached``;
* ``finish_reason``: ``stop`` → stop, ``length`` → length, ``tool_calls``/``function_call`` →
  toolUse, ``content_filter`` → error; ``delta.refusal`` text is kept as text and ends the message
  with ``stop_reason="error"`` and ``error_message="refusal: …"``;
* a body that ends with neither a ``finish_reason`` nor ``data: [DONE]`` was cut short: the
  message ends with ``error`` (content kept); ``[DONE]`` without a ``finish_reason`` is a stop.

``StreamOptions.extra`` keys read here: ``http_client`` (an ``httpx.AsyncClient``).
"""

from __future__ import annotations

import json
from typing import Any

from providers.common import (
    finalize_usage,
    join_url,
    loads,
    mint_tool_call_id,
    request_secrets,
    require_user_turn,
    sendable_user,
)
from providers.handoff import openai_tool_id, transform_messages
from providers.profiles import OpenAICompat, openai_compat
from providers.sse_api import SseApi
from providers.transport import HttpRequest, ProviderStreamError
from runtime.llm.builder import MessageBuilder, parse_partial_json, parse_tool_arguments
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
    "OpenAICompletionsParser",
    "build_request_body",
    "stream_openai_completions",
    "stream_simple",
]

API = "openai-completions"
DEFAULT_BASE_URL = "https://api.openai.com/v1"

_FINISH: dict[str, StopReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "toolUse",
    "function_call": "toolUse",
    "content_filter": "error",
    "error": "error",
}

# --------------------------------------------------------------------------- request


def _user_content(msg: UserMessage) -> str | list[dict[str, Any]]:
    if isinstance(msg.content, str):
        return msg.content
    parts: list[dict[str, Any]] = []
    for b in msg.content:
        if isinstance(b, TextContent):
            parts.append({"type": "text", "text": b.text})
        else:
            parts.append({"type": "image_url", "image_url": {"url": f"data:{b.mime_type};base64,{b.data}"}})
    return parts


def _assistant(msg: AssistantMessage, compat: OpenAICompat) -> dict[str, Any] | None:
    text = "".join(b.text for b in msg.content if isinstance(b, TextContent))
    calls = msg.tool_calls()
    out: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if compat.send_reasoning_content:
        thinking = "".join(
            b.thinking for b in msg.content if isinstance(b, ThinkingContent) and not b.redacted
        )
        if thinking:
            out["reasoning_content"] = thinking
    if calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
            }
            for c in calls
        ]
    if not text and not calls and "reasoning_content" not in out:
        return None
    return out


def _tool_result(msg: ToolResultMessage, compat: OpenAICompat) -> dict[str, Any]:
    text = "\n".join(b.text for b in msg.content if isinstance(b, TextContent))
    if any(isinstance(b, ImageContent) for b in msg.content):
        text = (text + "\n" if text else "") + "(see the attached image)"
    out: dict[str, Any] = {"role": "tool", "tool_call_id": msg.tool_call_id, "content": text or "(no output)"}
    if compat.tool_result_needs_name:
        out["name"] = msg.tool_name
    return out


def convert_messages(model: Model, context: Context, compat: OpenAICompat) -> list[dict[str, Any]]:
    """Turn ``context`` (after :func:`providers.handoff.transform_messages`) into ``messages`` JSON.

    The system prompt goes first as ``developer`` for reasoning models on servers that support
    that role, else ``system``. Images returned by tools follow the tool messages as one user
    message (``tool`` messages cannot carry images). Tool-call ids longer than OpenAI's 40
    characters are shortened (:func:`providers.handoff.openai_tool_id`), results alike. A user
    message with nothing to send is sent as ``NO_TEXT`` (:func:`providers.common.sendable_user`).

    Raises:
        ContextError: no message besides the system prompt, or the last is the assistant's
            (docs/decisions.md#llm-user-turns).
    """
    out: list[dict[str, Any]] = []
    if context.system_prompt:
        role = "developer" if model.reasoning and compat.supports_developer_role else "system"
        out.append({"role": role, "content": context.system_prompt})
    tool_images: list[dict[str, Any]] = []
    for msg in transform_messages(context.messages, model, openai_tool_id):
        if not isinstance(msg, ToolResultMessage) and tool_images:
            out.append({"role": "user", "content": tool_images})
            tool_images = []
        if isinstance(msg, UserMessage):
            out.append({"role": "user", "content": _user_content(sendable_user(msg))})
        elif isinstance(msg, AssistantMessage):
            converted = _assistant(msg, compat)
            if converted is not None:
                out.append(converted)
        else:
            out.append(_tool_result(msg, compat))
            for b in msg.content:
                if isinstance(b, ImageContent):
                    tool_images.append(
                        {"type": "image_url", "image_url": {"url": f"data:{b.mime_type};base64,{b.data}"}}
                    )
    if tool_images:
        out.append({"role": "user", "content": tool_images})
    require_user_turn(out[1:] if context.system_prompt else out, "assistant")
    return out


def build_request_body(
    model: Model, context: Context, options: StreamOptions, reasoning: str = "off"
) -> dict[str, Any]:
    """Build the ``POST /chat/completions`` JSON for one streamed call.

    Args:
        model: Target model; ``compat`` flags come from :func:`providers.profiles.openai_compat`.
        context: System prompt, messages, tools.
        options: ``max_tokens`` (tokens), ``temperature``, ``tool_choice``, ``output_schema``.
        reasoning: Unified level (``off``…``high``) from :class:`SimpleStreamOptions`.

    Raises:
        ValueError: an unknown ``compat.profile``.
    """
    compat = openai_compat(model)
    body: dict[str, Any] = {
        "model": model.id,
        "messages": convert_messages(model, context, compat),
        "stream": True,
    }
    if compat.supports_usage_in_streaming:
        body["stream_options"] = {"include_usage": True}
    body[compat.max_tokens_field] = options.max_tokens or model.max_tokens
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if context.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            }
            for t in context.tools
        ]
    choice = options.tool_choice
    if choice is not None and context.tools:
        if choice in ("auto", "none"):
            body["tool_choice"] = choice
        elif choice == "required":
            body["tool_choice"] = "required" if compat.supports_tool_choice_required else "auto"
        else:
            body["tool_choice"] = {"type": "function", "function": {"name": choice}}
    if options.output_schema is not None and compat.supports_json_schema:
        schema: dict[str, Any] = {"name": options.output_schema_name, "schema": options.output_schema}
        if compat.supports_strict_mode:
            schema["strict"] = True
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    if model.reasoning and reasoning != "off":
        if compat.reasoning_format == "openai":  # the API has every unified level, ``minimal`` too
            body["reasoning_effort"] = reasoning
        elif compat.reasoning_format == "openrouter":
            body["reasoning"] = {"effort": reasoning}
        elif compat.reasoning_format == "qwen":
            body["enable_thinking"] = True
    elif model.reasoning and compat.reasoning_format == "qwen":
        body["enable_thinking"] = False
    return body


# --------------------------------------------------------------------------- stream parsing


class OpenAICompletionsParser:
    """Turns Chat Completions chunks into :class:`MessageBuilder` calls (one per attempt).

    Tool-call slots are kept in ``_slots`` (slot key → content index and raw argument text).
    The builder has one open block at a time; a delta for an earlier, already closed slot
    (interleaved parallel calls) is appended to that slot's raw text and the call's arguments
    are re-parsed at the end, so no argument byte is lost.
    """

    __slots__ = (
        "_alias",
        "_b",
        "_by_id",
        "_done",
        "_finish",
        "_late",
        "_live",
        "_model",
        "_open_slot",
        "_refusal",
        "_slots",
    )

    def __init__(self, builder: MessageBuilder, model: Model) -> None:
        self._b = builder
        self._model = model
        builder.message.usage = Usage()
        self._finish: str | None = None
        self._slots: dict[Any, list[Any]] = {}  # key -> [content_index, raw_args]
        self._open_slot: Any = None
        self._by_id: dict[str, Any] = {}
        self._live: Any = None  # the slot whose block is open in the builder
        self._late: set[Any] = set()
        self._alias: dict[Any, Any] = {}  # index -> slot of the latest call that reused it
        self._refusal = ""
        self._done = False  # ``data: [DONE]`` seen

    def on_event(self, event: str | None, data: str) -> None:
        """Handle one ``data:`` payload (``[DONE]`` is noted; the body's end finishes)."""
        if data == "[DONE]":
            self._done = True
            return
        if not data:
            return
        self._chunk(loads(data))

    def on_body(self, data: str) -> None:
        """Handle a non-streaming ``chat.completion`` body (e.g. a server that ignored ``stream``)."""
        doc = loads(data)
        self._done = True
        choices = doc.get("choices") or [{}]
        message = choices[0].get("message") or {}
        delta = {k: message.get(k) for k in ("content", "reasoning_content", "reasoning", "refusal")}
        delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(message.get("tool_calls") or [])]
        choice = {"index": 0, "delta": delta, "finish_reason": choices[0].get("finish_reason")}
        self._chunk(
            {"id": doc.get("id"), "error": doc.get("error"), "usage": doc.get("usage"), "choices": [choice]}
        )
        self.on_end()

    def _chunk(self, chunk: dict[str, Any]) -> None:
        b = self._b
        err = chunk.get("error")
        if not err and chunk.get("object") == "error":  # vLLM's in-stream error shape
            err = chunk
        if err:
            msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            raise ProviderStreamError(f"stream error: {msg}", retryable=False)
        if b.message.response_id is None and isinstance(chunk.get("id"), str):
            b.message.response_id = chunk["id"]
        usage = chunk.get("usage")
        if usage:
            self._usage(usage)
        choices = chunk.get("choices")
        if not choices:
            return
        choice = choices[0]
        delta = choice.get("delta")
        if delta:
            reasoning = (
                delta.get("reasoning_content") or delta.get("reasoning") or delta.get("reasoning_text")
            )
            if reasoning and isinstance(reasoning, str):
                self._live = None
                b.thinking_delta(reasoning)
            content = delta.get("content")
            if content:
                self._live = None
                b.text_delta(content)
            refusal = delta.get("refusal")
            if refusal:
                self._live = None
                self._refusal += refusal
                b.text_delta(refusal)
            calls = delta.get("tool_calls")
            if calls:
                for tc in calls:
                    self._tool_delta(tc)
        fr = choice.get("finish_reason")
        if fr:
            self._finish = fr

    def _tool_delta(self, tc: dict[str, Any]) -> None:
        b = self._b
        fn = tc.get("function") or {}
        call_id = tc.get("id")
        key = tc.get("index")
        if call_id:
            if call_id in self._by_id:
                key = self._by_id[call_id]
            elif key is None or (key in self._slots and self._slots[key][2] not in (None, call_id)):
                index = key
                key = ("new", len(self._slots))  # no index, or an index reused for another call
                if index is not None:
                    self._alias[index] = key  # later id-less pieces at this index belong to it
        elif key is None:  # bug shape: neither index nor id continues the latest slot
            key = self._open_slot if self._open_slot is not None else ("new", len(self._slots))
        else:
            key = self._alias.get(key, key)
        slot = self._slots.get(key)
        if slot is None:
            idx = b.tool_call_start(call_id or mint_tool_call_id(fn.get("name", "")), fn.get("name") or "")
            slot = self._slots[key] = [idx, "", call_id]
            self._open_slot = self._live = key
            if call_id:
                self._by_id[call_id] = key
        else:
            block = b.message.content[slot[0]]
            assert isinstance(block, ToolCall)
            if fn.get("name") and not block.name:
                block.name = fn["name"]
            if call_id and slot[2] is None:
                slot[2] = block.id = call_id
                self._by_id[call_id] = key
        args = fn.get("arguments")
        if isinstance(args, dict):  # some compatible servers send the arguments as an object
            args = json.dumps(args, ensure_ascii=False)
        if args:
            slot[1] += args
            if key == self._live and key not in self._late:
                b.tool_call_delta(args)
            else:
                self._late.add(key)

    def _usage(self, u: dict[str, Any]) -> None:
        usage = self._b.message.usage
        prompt = u.get("prompt_tokens") or 0
        details = u.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") or u.get("prompt_cache_hit_tokens") or 0
        usage.input = max(prompt - cached, 0)
        usage.cache_read = cached
        usage.output = u.get("completion_tokens") or 0
        finalize_usage(self._model, usage)

    def on_end(self) -> None:
        """Close blocks, repair interleaved tool-call arguments, and push the terminal event."""
        b = self._b
        b.close_block()
        for key in self._late:
            idx, raw = self._slots[key][0], self._slots[key][1]
            block = b.message.content[idx]
            assert isinstance(block, ToolCall)
            # a fresh block: the builder marked the call invalid when it closed it with only the
            # first pieces of its arguments; the whole text decides now
            fresh = ToolCall(id=block.id, name=block.name, thought_signature=block.thought_signature)
            try:
                fresh.arguments = parse_tool_arguments(raw)
            except ValueError as exc:
                fresh.arguments = parse_partial_json(raw)
                fresh.mark_invalid_arguments(raw, str(exc))
            b.message.content[idx] = fresh
        fr = self._finish
        if self._refusal:
            b.message.error_message = f"refusal: {self._refusal}"
            b.finish("error")
            return
        if fr is None:
            if not b.started:
                b.fail("stream ended without any chunk")
            elif not self._done:  # neither finish_reason nor [DONE]: the stream was cut short
                b.fail("stream ended before finish_reason or [DONE]")
            else:
                b.finish()
            return
        reason = _FINISH.get(fr, "stop")
        if reason == "error":
            b.message.error_message = f"finish_reason: {fr}"
        b.finish(reason)


# --------------------------------------------------------------------------- entry points


def _request(model: Model, context: Context, options: StreamOptions, reasoning: str) -> HttpRequest:
    key = options.api_key  # resolved by stream_sse_call
    headers = {
        "content-type": "application/json",
        "accept": "text/event-stream",
        **model.headers,
        **options.headers,
    }
    if key:
        headers["authorization"] = f"Bearer {key}"
    url = join_url(model.base_url or DEFAULT_BASE_URL, "chat/completions")
    return HttpRequest(
        url, headers, build_request_body(model, context, options, reasoning), request_secrets(key, headers)
    )


PROTOCOL = SseApi(API, _request, OpenAICompletionsParser)
"""This api's request and parser; its stream functions below."""
stream_openai_completions = PROTOCOL.stream
stream_simple = PROTOCOL.stream_simple

"""Api ``google-generative-ai``: Gemini ``models/{id}:streamGenerateContent?alt=sse``.

Stream rules (docs/decisions.md#llm-errors-as-events):

* each SSE ``data:`` is one ``GenerateContentResponse``; parts of ``candidates[0].content``:
  ``text`` (``thought: true`` → thinking), ``functionCall`` (complete in one part; an id is minted
  when absent and the matching ``functionResponse`` carries it back); calls in separate chunks
  stay separate tool calls; a ``thoughtSignature`` is kept on the block it came with (an empty
  text part carrying only a signature signs the text block before it);
* ``usageMetadata`` is cumulative: the last one wins. ``promptTokenCount`` includes
  ``cachedContentTokenCount`` (→ cache_read); output = ``candidatesTokenCount`` +
  ``thoughtsTokenCount``;
* ``finishReason``: ``STOP`` → stop (toolUse when the message has calls), ``MAX_TOKENS`` → length,
  anything else (``SAFETY``, ``RECITATION``, ``PROHIBITED_CONTENT``, ``MALFORMED_FUNCTION_CALL``…)
  → error with the reason; ``promptFeedback.blockReason`` → error; no ``finishReason`` at all
  (a cut stream) → error, keeping the content received.

The key goes in the ``x-goog-api-key`` header, never in the URL. ``StreamOptions.output_schema``
is sent natively (``responseMimeType: application/json`` + ``responseJsonSchema``).
``StreamOptions.extra`` keys: ``http_client``, ``thinking_budget`` (tokens).
"""

from __future__ import annotations

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
from providers.handoff import transform_messages
from providers.sse_api import SseApi
from providers.transport import HttpRequest, ProviderStreamError
from runtime.llm.builder import MessageBuilder
from runtime.llm.options import StreamOptions
from runtime.llm.types import (
    AssistantMessage,
    Context,
    ImageContent,
    Model,
    TextContent,
    ThinkingContent,
    ToolResultMessage,
    Usage,
    UserMessage,
)

__all__ = ["API", "GoogleParser", "build_request_body", "stream_google_generative_ai", "stream_simple"]

API = "google-generative-ai"
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
THINKING_BUDGETS = {"minimal": 512, "low": 2048, "medium": 8192, "high": 24576}
"""Thinking budget in tokens per unified reasoning level."""

# --------------------------------------------------------------------------- request


def _parts(content: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in content:
        if isinstance(b, TextContent):
            if b.text:
                out.append({"text": b.text})
        elif isinstance(b, ImageContent):
            out.append({"inlineData": {"mimeType": b.mime_type, "data": b.data}})
    return out


def _model_parts(msg: AssistantMessage) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for b in msg.content:
        part: dict[str, Any]
        if isinstance(b, TextContent):
            if not b.text and not b.text_signature:
                continue
            part = {"text": b.text}
            if b.text_signature:
                part["thoughtSignature"] = b.text_signature
        elif isinstance(b, ThinkingContent):
            if b.redacted:
                continue
            part = {"text": b.thinking, "thought": True}
            if b.signature:
                part["thoughtSignature"] = b.signature
        else:
            part = {"functionCall": {"id": b.id, "name": b.name, "args": b.arguments}}
            if b.thought_signature:
                part["thoughtSignature"] = b.thought_signature
        out.append(part)
    return out


def convert_contents(model: Model, context: Context) -> list[dict[str, Any]]:
    """Turn ``context.messages`` into ``contents`` (roles ``user``/``model``), after handoff.

    Consecutive tool results become one ``user`` content of ``functionResponse`` parts with the
    call's ``id`` and ``name``; ``response`` is ``{"output": text}`` or ``{"error": text}``. A user
    message with nothing to send is sent as ``NO_TEXT`` (:func:`providers.common.sendable_user`).

    Raises:
        ContextError: the result would be empty or end on the ``model``'s content
            (docs/decisions.md#llm-user-turns).
    """
    out: list[dict[str, Any]] = []
    for msg in transform_messages(context.messages, model):
        if isinstance(msg, UserMessage):
            msg = sendable_user(msg)
            parts = [{"text": msg.content}] if isinstance(msg.content, str) else _parts(msg.content)
            out.append({"role": "user", "parts": parts})
        elif isinstance(msg, AssistantMessage):
            parts = _model_parts(msg)
            if parts:
                out.append({"role": "model", "parts": parts})
        elif isinstance(msg, ToolResultMessage):
            text = "\n".join(b.text for b in msg.content if isinstance(b, TextContent))
            resp = {
                "functionResponse": {
                    "id": msg.tool_call_id,
                    "name": msg.tool_name,
                    "response": {"error" if msg.is_error else "output": text},
                }
            }
            images = _parts([b for b in msg.content if isinstance(b, ImageContent)])
            last = out[-1] if out else None
            if last and last["role"] == "user" and last.get("_results"):
                last["parts"].append(resp)
                last["parts"].extend(images)
            else:
                out.append({"role": "user", "parts": [resp, *images], "_results": True})
    for c in out:
        c.pop("_results", None)
    require_user_turn(out, "model")
    return out


def build_request_body(
    model: Model, context: Context, options: StreamOptions, reasoning: str = "off"
) -> dict[str, Any]:
    """Build the ``streamGenerateContent`` JSON.

    ``generationConfig.maxOutputTokens`` (tokens) defaults to ``model.max_tokens``; tools go in one
    ``functionDeclarations`` list with ``parametersJsonSchema``; ``tool_choice`` maps to
    ``toolConfig.functionCallingConfig`` (``AUTO``/``NONE``/``ANY``, a name → ``ANY`` +
    ``allowedFunctionNames``).
    """
    gen: dict[str, Any] = {"maxOutputTokens": options.max_tokens or model.max_tokens}
    if options.temperature is not None:
        gen["temperature"] = options.temperature
    if options.output_schema is not None:
        gen["responseMimeType"] = "application/json"
        gen["responseJsonSchema"] = options.output_schema
    if model.reasoning:
        if reasoning != "off":
            budget = int(options.extra.get("thinking_budget") or THINKING_BUDGETS.get(reasoning, 8192))
            gen["thinkingConfig"] = {"includeThoughts": True, "thinkingBudget": budget}
        else:
            gen["thinkingConfig"] = {"includeThoughts": True}
    body: dict[str, Any] = {"contents": convert_contents(model, context), "generationConfig": gen}
    if context.system_prompt:
        body["systemInstruction"] = {"parts": [{"text": context.system_prompt}]}
    if context.tools:
        body["tools"] = [
            {
                "functionDeclarations": [
                    {"name": t.name, "description": t.description, "parametersJsonSchema": t.parameters}
                    for t in context.tools
                ]
            }
        ]
        choice = options.tool_choice
        if choice in ("auto", "none", "required"):
            mode = {"auto": "AUTO", "none": "NONE", "required": "ANY"}[choice]
            body["toolConfig"] = {"functionCallingConfig": {"mode": mode}}
        elif choice:
            body["toolConfig"] = {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [choice]}}
    return body


# --------------------------------------------------------------------------- stream parsing


class GoogleParser:
    """Turns ``GenerateContentResponse`` chunks into :class:`MessageBuilder` calls."""

    __slots__ = ("_b", "_blocked", "_finish", "_model")

    def __init__(self, builder: MessageBuilder, model: Model) -> None:
        self._b = builder
        self._model = model
        builder.message.usage = Usage()
        self._finish: str | None = None
        self._blocked: str | None = None

    def on_event(self, event: str | None, data: str) -> None:
        """Handle one response chunk."""
        if not data.strip():  # an empty keep-alive ``data:`` line
            return
        chunk = loads(data)
        b = self._b
        if isinstance(chunk, dict) and "error" in chunk:
            err = chunk["error"]
            msg = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            status = err.get("status", "") if isinstance(err, dict) else ""
            raise ProviderStreamError(
                f"{status}: {msg}" if status else msg, retryable=status == "UNAVAILABLE"
            )
        if b.message.response_id is None and isinstance(chunk.get("responseId"), str):
            b.message.response_id = chunk["responseId"]
        feedback = chunk.get("promptFeedback") or {}
        if feedback.get("blockReason"):
            self._blocked = feedback["blockReason"]
        usage = chunk.get("usageMetadata")
        if usage:
            self._usage(usage)
        candidates = chunk.get("candidates")
        if not candidates:
            return
        cand = candidates[0]
        for part in (cand.get("content") or {}).get("parts") or ():
            sig = part.get("thoughtSignature")
            if not isinstance(sig, str):
                sig = None
            if "functionCall" in part:
                fc = part["functionCall"]
                name = fc.get("name", "")
                call_id = fc.get("id") or mint_tool_call_id(name)
                b.tool_call_complete(call_id, name, fc.get("args") or {}, thought_signature=sig)
                continue
            text = part.get("text")
            if text is None:
                continue
            if part.get("thought"):
                b.thinking_delta(text, signature=sig)
            elif text:
                b.text_delta(text, signature=sig)
            elif sig:  # empty text part carrying only a signature: it signs the text before it
                last = b.message.content[-1] if b.message.content else None
                if isinstance(last, TextContent):
                    last.text_signature = sig
                else:
                    b.text_delta("", signature=sig)
        if cand.get("finishReason"):
            self._finish = cand["finishReason"]

    def on_body(self, data: str) -> None:
        """Handle a non-streaming ``generateContent`` body (the same shape as one chunk)."""
        self.on_event(None, data)
        self.on_end()

    def _usage(self, u: dict[str, Any]) -> None:
        usage = self._b.message.usage
        cached = u.get("cachedContentTokenCount") or 0
        usage.input = max((u.get("promptTokenCount") or 0) - cached, 0)
        usage.cache_read = cached
        usage.output = (u.get("candidatesTokenCount") or 0) + (u.get("thoughtsTokenCount") or 0)
        finalize_usage(self._model, usage)

    def on_end(self) -> None:
        """Push the terminal event from ``finishReason`` (see the module docstring)."""
        b = self._b
        if self._blocked:
            b.fail(f"prompt blocked: {self._blocked}")
            return
        fr = self._finish
        if fr is None:
            # Gemini's last chunk always carries finishReason: without it the stream was cut
            b.fail("stream ended without any chunk" if not b.started else "stream ended before finishReason")
        elif fr == "STOP":
            b.finish()
        elif fr == "MAX_TOKENS":
            b.finish("length")
        else:
            b.fail(f"finishReason: {fr}")


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
        headers["x-goog-api-key"] = key
    model_id = model.id.removeprefix("models/")  # the API's own listing names models "models/<id>"
    url = join_url(model.base_url or DEFAULT_BASE_URL, f"models/{model_id}:streamGenerateContent?alt=sse")
    body = build_request_body(model, context, options, reasoning)
    return HttpRequest(url, headers, body, request_secrets(key, headers))


PROTOCOL = SseApi(API, _request, GoogleParser)
"""This api's request and parser; its stream functions below."""
stream_google_generative_ai = PROTOCOL.stream
stream_simple = PROTOCOL.stream_simple

"""Build an :class:`AssistantMessage` incrementally and emit the matching stream events.

Every provider adapter (and the faux model) drives one :class:`MessageBuilder` so the event
rules live in one place: blocks open with ``*_start``, grow with ``*_delta`` and close with
``*_end``; a new block closes the open one; ``finish``/``fail`` close everything and push the
single terminal event.

Tool-call arguments are accumulated as raw JSON text per block and parsed once when the block
closes (partial parses while streaming use pydantic-core's ``allow_partial`` mode). When the
final text is not a JSON object (truncated, trailing garbage, an array…) the block keeps the
best-effort partial parse and is marked with :meth:`~runtime.llm.types.ToolCall.mark_invalid_arguments`;
the agent loop then answers it with an error result instead of running the tool.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic_core import from_json

from runtime.llm.events import (
    AssistantMessageEventStream,
    DoneEvent,
    ErrorEvent,
    StartEvent,
    TextDeltaEvent,
    TextEndEvent,
    TextStartEvent,
    ThinkingDeltaEvent,
    ThinkingEndEvent,
    ThinkingStartEvent,
    ToolCallDeltaEvent,
    ToolCallEndEvent,
    ToolCallStartEvent,
)
from runtime.llm.types import AssistantMessage, Model, StopReason, TextContent, ThinkingContent, ToolCall

__all__ = ["PARTIAL_PARSE_EVERY_DELTA_CHARS", "MessageBuilder", "parse_partial_json", "parse_tool_arguments"]

PARTIAL_PARSE_EVERY_DELTA_CHARS = 65_536
"""Up to this many characters of argument JSON, the partial parse is refreshed on every delta;
beyond it, only once the text grew by 10 % since the last parse (the final parse at the block's
end is always complete)."""


def parse_partial_json(text: str) -> dict[str, Any]:
    """Best-effort parse of an incomplete JSON object (``{"a": "New Yo`` → ``{"a": "New Yo"}``).

    Uses pydantic-core's partial mode (``allow_partial="trailing-strings"``). Returns ``{}`` for
    empty or non-object input; never raises.
    """
    if not text.strip():
        return {}
    try:
        value = from_json(text, allow_partial="trailing-strings")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def parse_tool_arguments(text: str | None) -> dict[str, Any]:
    """Parse complete tool-call argument JSON.

    ``None``, ``""``, whitespace and ``null`` mean ``{}`` (docs/decisions.md#agent-tool-validation).

    Raises:
        ValueError: the text is not valid JSON or not a JSON object; the message quotes the text
            (truncated to 200 characters).
    """
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tool arguments are not valid JSON ({exc.msg}): {text[:200]!r}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"tool arguments must be a JSON object, got {type(value).__name__}: {text[:200]!r}")
    return value


class MessageBuilder:
    """Accumulates one assistant response and pushes events into ``stream``.

    Args:
        stream: Where events go.
        model: Fills ``api``, ``provider``, ``model`` of the message.
    """

    def __init__(self, stream: AssistantMessageEventStream, model: Model) -> None:
        self.stream = stream
        self.message = AssistantMessage(api=model.api, provider=model.provider, model=model.id)
        self._open: int | None = None
        self._open_kind: Literal["text", "thinking", "toolCall"] | None = None
        self._args_raw: dict[int, str] = {}
        self._parsed_len: dict[int, int] = {}
        self.started = False
        self.content_started = False
        """True once any content delta arrived (retries are allowed only before this)."""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Push ``start`` once."""
        if not self.started:
            self.started = True
            self.stream.push(StartEvent(partial=self.message))

    def close_block(self) -> None:
        """Close the open block (if any) with its ``*_end`` event."""
        idx, kind = self._open, self._open_kind
        if idx is None:
            return
        self._open = self._open_kind = None
        block = self.message.content[idx]
        if kind == "text" and isinstance(block, TextContent):
            self.stream.push(TextEndEvent(content_index=idx, content=block.text, partial=self.message))
        elif kind == "thinking" and isinstance(block, ThinkingContent):
            self.stream.push(
                ThinkingEndEvent(content_index=idx, content=block.thinking, partial=self.message)
            )
        elif kind == "toolCall" and isinstance(block, ToolCall):
            raw = self._args_raw.pop(idx, "")
            try:
                block.arguments = parse_tool_arguments(raw)
            except ValueError as exc:
                # Truncated or broken JSON (e.g. stop at max_tokens): keep the partial parse for
                # display and mark the call, so validate_tool_call refuses to run the tool on
                # guessed arguments and tells the model what was wrong.
                block.arguments = parse_partial_json(raw)
                block.mark_invalid_arguments(raw, str(exc))
            self.stream.push(ToolCallEndEvent(content_index=idx, tool_call=block, partial=self.message))

    # ------------------------------------------------------------------ text / thinking
    def text_delta(self, delta: str, *, signature: str | None = None) -> None:
        """Append text, opening a text block if the open block is not text."""
        self.start()
        if self._open_kind != "text":
            self.close_block()
            self.message.content.append(TextContent(text="", text_signature=signature))
            self._open, self._open_kind = len(self.message.content) - 1, "text"
            self.stream.push(TextStartEvent(content_index=self._open, partial=self.message))
        idx = self._open
        assert idx is not None
        block = self.message.content[idx]
        assert isinstance(block, TextContent)
        if signature is not None:
            block.text_signature = signature
        if delta:
            self.content_started = True
            block.text += delta
            self.stream.push(TextDeltaEvent(content_index=idx, delta=delta, partial=self.message))

    def thinking_delta(self, delta: str, *, signature: str | None = None, redacted: bool = False) -> None:
        """Append thinking text, opening a thinking block if needed."""
        self.start()
        if self._open_kind != "thinking":
            self.close_block()
            self.message.content.append(ThinkingContent(thinking="", signature=signature, redacted=redacted))
            self._open, self._open_kind = len(self.message.content) - 1, "thinking"
            self.stream.push(ThinkingStartEvent(content_index=self._open, partial=self.message))
        idx = self._open
        assert idx is not None
        block = self.message.content[idx]
        assert isinstance(block, ThinkingContent)
        if signature is not None:
            block.signature = signature
        if delta:
            self.content_started = True
            block.thinking += delta
            self.stream.push(ThinkingDeltaEvent(content_index=idx, delta=delta, partial=self.message))

    def set_thinking_signature(self, signature: str) -> None:
        """Append to the signature of the open thinking block (Anthropic ``signature_delta``)."""
        if self._open_kind == "thinking" and self._open is not None:
            block = self.message.content[self._open]
            assert isinstance(block, ThinkingContent)
            block.signature = (block.signature or "") + signature

    # ------------------------------------------------------------------ tool calls
    def tool_call_start(self, call_id: str, name: str, *, thought_signature: str | None = None) -> int:
        """Open a new tool-call block and return its content index."""
        self.start()
        self.close_block()
        self.content_started = True
        self.message.content.append(ToolCall(id=call_id, name=name, thought_signature=thought_signature))
        idx = len(self.message.content) - 1
        self._open, self._open_kind = idx, "toolCall"
        self._args_raw[idx] = ""
        self.stream.push(ToolCallStartEvent(content_index=idx, partial=self.message))
        return idx

    def tool_call_delta(self, delta: str) -> None:
        """Append raw argument JSON to the open tool call and refresh its partial parse (see
        :data:`PARTIAL_PARSE_EVERY_DELTA_CHARS` for huge arguments)."""
        idx = self._open
        if idx is None or self._open_kind != "toolCall" or not delta:
            return
        raw = self._args_raw[idx] + delta
        self._args_raw[idx] = raw
        block = self.message.content[idx]
        assert isinstance(block, ToolCall)
        done = self._parsed_len.get(idx, 0)
        if len(raw) <= PARTIAL_PARSE_EVERY_DELTA_CHARS or len(raw) - done >= len(raw) // 10:
            # Past 64 KiB the partial view is refreshed only after 10 % growth: re-parsing the
            # whole text on every delta would make a huge argument quadratic to stream.
            block.arguments = parse_partial_json(raw)
            self._parsed_len[idx] = len(raw)
        self.stream.push(ToolCallDeltaEvent(content_index=idx, delta=delta, partial=self.message))

    def tool_call_complete(self, call_id: str, name: str, arguments: dict[str, Any], **kw: Any) -> None:
        """Emit a whole tool call at once (Gemini sends complete ``functionCall`` parts)."""
        self.tool_call_start(call_id, name, thought_signature=kw.get("thought_signature"))
        self.tool_call_delta(json.dumps(arguments, ensure_ascii=False))
        self.close_block()

    # ------------------------------------------------------------------ end
    def finish(self, stop_reason: StopReason | None = None) -> AssistantMessage:
        """Close blocks and push ``done``.

        ``stop_reason`` defaults to ``toolUse`` when the message holds tool calls, else ``stop``.
        An ``error``/``aborted`` reason is routed to :meth:`fail`.
        """
        self.start()
        self.close_block()
        if stop_reason is None:
            stop_reason = "toolUse" if self.message.tool_calls() else "stop"
        if stop_reason == "error" or stop_reason == "aborted":
            return self.fail(self.message.error_message or stop_reason, aborted=stop_reason == "aborted")
        self.message.stop_reason = stop_reason
        self.stream.push(DoneEvent(reason=stop_reason, message=self.message))
        return self.message

    def fail(self, error_message: str, *, aborted: bool = False) -> AssistantMessage:
        """Close blocks and push the terminal ``error`` event (stop_reason error or aborted)."""
        self.start()
        self.close_block()
        self.message.stop_reason = "aborted" if aborted else "error"
        self.message.error_message = error_message
        self.stream.push(ErrorEvent(reason=self.message.stop_reason, error=self.message))
        return self.message

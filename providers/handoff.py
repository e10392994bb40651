"""Cross-provider handoff: make a context recorded with any model safe to send to ``target``.

Applied by every wire adapter before it converts messages to its JSON
(docs/decisions.md#llm-cross-provider-handoff). Rules:

* Thinking produced by a *different* model (different api, provider or model id) becomes plain
  text; empty thinking is dropped; redacted thinking and signatures (thinking signatures, text
  signatures, Gemini thought signatures) are kept only when the target is the same model.
* Tool-call ids are rewritten by ``normalize_id`` (e.g. Anthropic allows ``[a-zA-Z0-9_-]``, at
  most 64 characters; OpenAI at most 40 characters) and the same mapping is applied to the later
  tool results; two ids that normalize to the same string get distinct ids (a hash suffix on the
  second).
* Assistant messages that ended in ``error`` or ``aborted`` are skipped, with any tool results
  that answer their calls; so is a tool result that answers no open call of the assistant
  message before it (its call was trimmed from the context, or it is a duplicate).
* A tool call with no result before the next user/assistant message (or the end) gets a
  synthetic error result, so every provider sees a well-formed call/result pairing.
* Images are replaced by a short text placeholder when ``"image" not in target.input``.
* Host :class:`~runtime.llm.types.CustomMessage` entries are dropped (``convert_to_llm`` owns them).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    ImageContent,
    Message,
    Model,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

__all__ = [
    "IMAGE_PLACEHOLDER",
    "MISSING_RESULT_TEXT",
    "anthropic_tool_id",
    "is_same_model",
    "openai_tool_id",
    "transform_messages",
]

IMAGE_PLACEHOLDER = "(image omitted: this model does not accept images)"
MISSING_RESULT_TEXT = "No result provided: the tool call was interrupted."

_ANTHROPIC_BAD = re.compile(r"[^a-zA-Z0-9_-]")


def anthropic_tool_id(call_id: str) -> str:
    """Map any id onto Anthropic's rule ``^[a-zA-Z0-9_-]{1,64}$``.

    Invalid characters become ``_``; ids longer than 64 characters keep 55 characters plus
    ``_`` and 8 hex digits of their SHA-1, so distinct long ids stay distinct.
    """
    clean = _ANTHROPIC_BAD.sub("_", call_id) or "call"
    if len(clean) <= 64:
        return clean
    return clean[:55] + "_" + hashlib.sha1(call_id.encode()).hexdigest()[:8]


def openai_tool_id(call_id: str) -> str:
    """Map any id onto OpenAI's limit of 40 characters (longer ids are rejected with HTTP 400).

    Ids of at most 40 characters are kept as they are; longer ones keep 31 characters plus ``_``
    and 8 hex digits of their SHA-1, so distinct long ids stay distinct.
    """
    if len(call_id) <= 40:
        return call_id
    return call_id[:31] + "_" + hashlib.sha1(call_id.encode()).hexdigest()[:8]


def is_same_model(message: AssistantMessage, target: Model) -> bool:
    """True when ``message`` was produced by ``target`` (same api, provider alias and model id)."""
    return message.api == target.api and message.provider == target.provider and message.model == target.id


def _images_to_text(blocks: list[Any], vision: bool) -> list[Any]:
    if vision or not any(isinstance(b, ImageContent) for b in blocks):
        return blocks
    out: list[Any] = []
    for b in blocks:
        if isinstance(b, ImageContent):
            if not (out and isinstance(out[-1], TextContent) and out[-1].text == IMAGE_PLACEHOLDER):
                out.append(TextContent(text=IMAGE_PLACEHOLDER))
        else:
            out.append(b)
    return out


def _unique(norm: Callable[[str], str], call_id: str, ids: dict[str, str]) -> str:
    """``norm(call_id)``, made distinct from the ids other calls were already mapped to (two ids
    such as ``call|1`` and ``call.1`` both normalize to ``call_1``; a target rejects duplicates)."""
    new_id = norm(call_id)
    taken = set(ids.values())
    if new_id in taken:
        new_id = norm(f"{call_id}_{hashlib.sha1(call_id.encode()).hexdigest()[:8]}")
    return new_id


def _assistant(
    msg: AssistantMessage, target: Model, ids: dict[str, str], norm: Callable[[str], str]
) -> AssistantMessage:
    same = is_same_model(msg, target)
    content: list[TextContent | ThinkingContent | ToolCall] = []
    for b in msg.content:
        if isinstance(b, ThinkingContent):
            if same and (b.thinking.strip() or b.signature):
                content.append(b)
            elif not same and not b.redacted and b.thinking.strip():
                content.append(TextContent(text=b.thinking))
        elif isinstance(b, TextContent):
            content.append(b if same or b.text_signature is None else TextContent(text=b.text))
        else:
            new_id = ids.get(b.id) or _unique(norm, b.id, ids)
            ids[b.id] = new_id
            keep_sig = same and b.thought_signature is not None
            if new_id != b.id or (b.thought_signature is not None and not keep_sig):
                b = b.model_copy(
                    update={"id": new_id, "thought_signature": b.thought_signature if keep_sig else None}
                )
            content.append(b)
    return msg.model_copy(update={"content": content})


def transform_messages(
    messages: list[AgentMessage], target: Model, normalize_id: Callable[[str], str] | None = None
) -> list[Message]:
    """Return a new message list safe to send to ``target`` (rules in the module docstring).

    Args:
        messages: The context's messages in order (not modified).
        target: The model the request goes to.
        normalize_id: Maps a tool-call id to one the target accepts (identity when ``None``).

    Returns:
        User, assistant and tool-result messages only; unchanged messages are the same objects.
    """
    norm = normalize_id or (lambda s: s)
    vision = "image" in target.input
    ids: dict[str, str] = {}
    skipped: set[str] = set()
    out: list[Message] = []
    pending: list[ToolCall] = []  # calls of the last assistant still waiting for a result

    def flush_pending() -> None:
        for call in pending:
            out.append(
                ToolResultMessage(
                    tool_call_id=call.id,
                    tool_name=call.name,
                    is_error=True,
                    content=[TextContent(text=MISSING_RESULT_TEXT)],
                )
            )
        pending.clear()

    for msg in messages:
        if isinstance(msg, AssistantMessage):
            flush_pending()
            if msg.stop_reason in ("error", "aborted"):
                skipped.update(c.id for c in msg.tool_calls())
                continue
            converted = _assistant(msg, target, ids, norm)
            if not converted.content:
                continue
            out.append(converted)
            pending.extend(converted.tool_calls())
        elif isinstance(msg, ToolResultMessage):
            if msg.tool_call_id in skipped:
                continue
            new_id = ids.get(msg.tool_call_id, norm(msg.tool_call_id))
            if not any(c.id == new_id for c in pending):
                # orphan (its call was trimmed away) or duplicate result: every api rejects a
                # result that does not answer an open call of the preceding assistant message
                continue
            content = _images_to_text(msg.content, vision)
            if new_id != msg.tool_call_id or content is not msg.content:
                msg = msg.model_copy(update={"tool_call_id": new_id, "content": content})
            pending[:] = [c for c in pending if c.id != new_id]
            out.append(msg)
        elif isinstance(msg, UserMessage):
            flush_pending()
            if isinstance(msg.content, list):
                content = _images_to_text(msg.content, vision)
                if content is not msg.content:
                    msg = msg.model_copy(update={"content": content})
            out.append(msg)
        # CustomMessage: dropped (convert_to_llm decides what the model sees)
    flush_pending()
    return out

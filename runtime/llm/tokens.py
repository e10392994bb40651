"""The one token estimate of the runtime (docs/decisions.md#agent-context-budget).

Providers count tokens with their own tokenizers, which the runtime does not ship; before a call
it only needs a cheap, deterministic upper-ish guess. The rule, used by compaction and by the
per-turn context budget alike:

* text: ⌈characters / 4⌉ tokens (about right for English and code; CJK text has about one token
  per one or two characters, so it is *under*-estimated up to ~4×, which is why the context budget
  calibrates the estimate against the provider's reported usage);
* one image block: :data:`IMAGE_TOKENS`;
* per message: + 4 (role and framing), + 80 characters for a group sender's prefix when the
  message is not yet rendered (``convert_to_llm`` puts the real prefix into the text);
* a tool call: its name and its JSON arguments as text; a tool (definition): its name,
  description and JSON Schema as text; a structured-output schema: its JSON as text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Context,
    TextContent,
    ThinkingContent,
    Tool,
    ToolResultMessage,
    UserMessage,
)

__all__ = [
    "IMAGE_TOKENS",
    "estimate_request_tokens",
    "estimate_text_tokens",
    "estimate_tokens",
    "estimate_tools_tokens",
]

IMAGE_TOKENS = 1200
"""Estimated tokens of one image block."""

SENDER_PREFIX_CHARS = 80
"""Characters counted for the ``[sender:…]`` prefix a group user message is rendered with."""


def _message_chars(m: AgentMessage, rendered: bool) -> tuple[int, int]:
    """(characters, images) of one message."""
    chars = images = 0
    if isinstance(m, UserMessage):
        if isinstance(m.content, str):
            chars += len(m.content)
        else:
            for b in m.content:
                if isinstance(b, TextContent):
                    chars += len(b.text)
                else:
                    images += 1
        if m.sender and not rendered:
            chars += SENDER_PREFIX_CHARS
    elif isinstance(m, AssistantMessage):
        for c in m.content:
            if isinstance(c, TextContent):
                chars += len(c.text)
            elif isinstance(c, ThinkingContent):
                chars += len(c.thinking)
            else:
                chars += len(c.name) + len(json.dumps(c.arguments, ensure_ascii=False, default=repr))
    elif isinstance(m, ToolResultMessage):
        for r in m.content:
            if isinstance(r, TextContent):
                chars += len(r.text)
            else:
                images += 1
    else:
        chars += len(json.dumps(m.data, ensure_ascii=False, default=repr))
    return chars, images


def estimate_tokens(messages: Sequence[AgentMessage], *, rendered: bool = False) -> int:
    """Rough token count: ⌈characters / 4⌉ + :data:`IMAGE_TOKENS` per image, + 4 per message.

    ``rendered``: the messages are what ``convert_to_llm`` produced (a group sender's prefix is
    already in the text), so no :data:`SENDER_PREFIX_CHARS` are added for ``sender``.
    """
    total = 0
    for m in messages:
        chars, images = _message_chars(m, rendered)
        total += math.ceil(chars / 4) + images * IMAGE_TOKENS + 4
    return total


def estimate_text_tokens(text: str) -> int:
    """⌈characters / 4⌉ of ``text`` (a system prompt, a schema)."""
    return math.ceil(len(text) / 4)


def estimate_tools_tokens(tools: Sequence[Tool]) -> int:
    """Tokens of the tool definitions sent with a call: each tool's name, description and JSON
    Schema as compact JSON text, + 4 per tool."""
    total = 0
    for t in tools:
        schema = json.dumps(t.parameters, ensure_ascii=False, separators=(",", ":"), default=repr)
        total += estimate_text_tokens(t.name + t.description + schema) + 4
    return total


def estimate_request_tokens(context: Context, output_schema: dict[str, Any] | None = None) -> int:
    """Tokens of one request as a provider receives it: system prompt + tools + messages (already
    rendered by ``convert_to_llm``) + the structured-output JSON Schema when one is sent
    (``StreamOptions.output_schema``)."""
    total = estimate_text_tokens(context.system_prompt or "") + estimate_tools_tokens(context.tools or [])
    total += estimate_tokens(context.messages, rendered=True)
    if output_schema is not None:
        total += estimate_text_tokens(json.dumps(output_schema, ensure_ascii=False, separators=(",", ":")))
    return total

"""Core types of the agent engine, as pydantic v2 models
(docs/decisions.md#llm-context-shape).

Everything an LLM call needs is plain, JSON-serializable data: a :class:`Model`
says *where* and *how* to call (its ``api`` id picks the wire protocol from the
api registry), a :class:`Context` says *what* to send (system prompt, messages,
tools). Messages are a discriminated union on ``role``; content blocks are a
discriminated union on ``type``. ``Context.model_validate_json(ctx.model_dump_json())``
is lossless for every message and block type.

Units: timestamps are Unix epoch milliseconds; token counts are tokens; costs
are USD (``Model.cost`` is USD per million tokens, ``Usage.cost`` is USD spent).
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

__all__ = [
    "NO_TEXT",
    "AgentMessage",
    "AssistantContent",
    "AssistantMessage",
    "Context",
    "Cost",
    "CustomMessage",
    "ImageContent",
    "InputKind",
    "Message",
    "Model",
    "ModelCost",
    "StopReason",
    "TextContent",
    "ThinkingContent",
    "Tool",
    "ToolCall",
    "ToolResultContent",
    "ToolResultMessage",
    "Usage",
    "UserContent",
    "UserMessage",
    "now_ms",
]

StopReason: TypeAlias = Literal["stop", "length", "toolUse", "error", "aborted"]
"""Why an assistant message ended: ``stop`` (natural end), ``length`` (max tokens hit),
``toolUse`` (the model wants tool results), ``error`` (provider or transport failure),
``aborted`` (the caller's signal fired)."""

InputKind: TypeAlias = Literal["text", "image"]

NO_TEXT = "[message without text]"
"""What the model reads for a user message that has nothing else to show: an inbound message with no
text and no segment that has a placeholder (runtime.platforms.placeholders), and what a provider
sends for a user message with no text and no image (docs/decisions.md#llm-user-turns)."""


def now_ms() -> int:
    """Return the current Unix time in milliseconds (the unit of every ``timestamp``)."""
    return time.time_ns() // 1_000_000


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# --------------------------------------------------------------------------- content blocks


class TextContent(_Base):
    """A run of plain text in a message."""

    type: Literal["text"] = "text"
    text: str
    """The text itself."""
    text_signature: str | None = None
    """Provider-specific opaque id of this text block (kept for same-model replay)."""


class ThinkingContent(_Base):
    """Model reasoning ("thinking") emitted before or between answers; never part of a reply."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    """The reasoning text (empty for redacted thinking)."""
    signature: str | None = None
    """Opaque signature (Anthropic ``signature_delta``, OpenAI reasoning item id, Gemini
    ``thoughtSignature``); only replayed to the same model (cross-provider handoff rule)."""
    redacted: bool = False
    """True for redacted thinking: ``signature`` then holds the encrypted payload."""


class ImageContent(_Base):
    """An inline image: base64 bytes and their MIME type (e.g. ``image/png``)."""

    type: Literal["image"] = "image"
    data: str
    """Base64-encoded image bytes (no ``data:`` URL prefix)."""
    mime_type: str
    """IANA media type of the decoded bytes."""


class ToolCall(_Base):
    """A request by the model to run one tool."""

    type: Literal["toolCall"] = "toolCall"
    id: str
    """Provider-assigned (or minted) call id; the matching result carries it as ``tool_call_id``."""
    name: str
    """Tool name as declared in ``Context.tools``."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """Parsed JSON arguments. While streaming this is a best-effort parse of partial JSON."""
    thought_signature: str | None = None
    """Gemini ``thoughtSignature`` attached to the call part, replayed to the same model."""
    _arguments_error: str | None = PrivateAttr(default=None)
    _raw_arguments: str | None = PrivateAttr(default=None)

    @property
    def arguments_error(self) -> str | None:
        """Why the streamed argument JSON did not parse (``None`` when it did).

        Set by :meth:`runtime.llm.builder.MessageBuilder.close_block` (via :meth:`mark_invalid_arguments`)
        when the final argument text is not a JSON object; ``arguments`` then only holds a
        best-effort partial parse, and :func:`runtime.agent.tools.validate_tool_call` refuses the call
        instead of running the tool on guessed arguments. Live only: not serialized.
        """
        return self._arguments_error

    @property
    def raw_arguments(self) -> str | None:
        """The argument text as streamed, kept only when it did not parse (see ``arguments_error``)."""
        return self._raw_arguments

    def mark_invalid_arguments(self, raw: str, error: str) -> None:
        """Record that the streamed argument text ``raw`` is not a JSON object (``error`` says why)."""
        self._raw_arguments = raw
        self._arguments_error = error

    def __eq__(self, other: object) -> bool:
        """Equal when the fields are equal (the live parse-failure marks are not part of the value)."""
        if not isinstance(other, ToolCall):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # mutable, like every pydantic model


UserContent: TypeAlias = Annotated[TextContent | ImageContent, Field(discriminator="type")]
AssistantContent: TypeAlias = Annotated[TextContent | ThinkingContent | ToolCall, Field(discriminator="type")]
ToolResultContent: TypeAlias = Annotated[TextContent | ImageContent, Field(discriminator="type")]


# --------------------------------------------------------------------------- usage


class Cost(_Base):
    """Money spent on one call, in USD, split like :class:`Usage`."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float = 0.0
    cache_write: float = 0.0
    total: float = 0.0


class Usage(_Base):
    """Token accounting of one assistant message (all fields in tokens, ``cost`` in USD).

    ``input`` excludes cached tokens (``cache_read``/``cache_write`` are counted apart);
    ``total_tokens`` = input + output + cache_read + cache_write.
    """

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    total_tokens: int = 0
    cost: Cost = Field(default_factory=Cost)


class ModelCost(_Base):
    """Prices in USD per million tokens (finite, ≥ 0: a negative or NaN price would corrupt the
    ledger's sums and with them every USD quota; see docs/decisions.md#spend-ledger)."""

    input: float = Field(0.0, ge=0, allow_inf_nan=False)
    output: float = Field(0.0, ge=0, allow_inf_nan=False)
    cache_read: float = Field(0.0, ge=0, allow_inf_nan=False)
    cache_write: float = Field(0.0, ge=0, allow_inf_nan=False)


# --------------------------------------------------------------------------- messages


class UserMessage(_Base):
    """A message from the user (or an IM participant; see ``sender`` for group scenes)."""

    role: Literal["user"] = "user"
    content: str | list[UserContent]
    """Plain text, or text and image blocks."""
    timestamp: int = Field(default_factory=now_ms)
    """Unix ms."""
    sender: dict[str, Any] | None = None
    """IM sender metadata (``id``, ``name``, ``roles``) kept beside the clean text; the
    ``[sender:…]`` prefix is rendered from it when converting for the LLM
    (docs/decisions.md#security-sender-prefix)."""


class AssistantMessage(_Base):
    """One model response: content blocks plus the call's provenance and accounting."""

    role: Literal["assistant"] = "assistant"
    content: list[AssistantContent] = Field(default_factory=list)
    api: str = ""
    """The api id that produced it (e.g. ``openai-completions``)."""
    provider: str = ""
    """The provider alias from configuration."""
    model: str = ""
    """The model id."""
    usage: Usage = Field(default_factory=Usage)
    stop_reason: StopReason = "stop"
    error_message: str | None = None
    """Human-readable failure text when ``stop_reason`` is ``error`` or ``aborted``."""
    response_id: str | None = None
    """The provider's response id, when it sends one."""
    timestamp: int = Field(default_factory=now_ms)
    """Unix ms when the response started."""

    @classmethod
    def error_for(cls, model: Model, text: str, *, aborted: bool = False) -> AssistantMessage:
        """Return the empty message that stands for a failed (or, with ``aborted``, cancelled)
        call of ``model``: ``api``/``provider``/``model`` from it, no content, zero usage,
        ``stop_reason`` ``"error"`` (``"aborted"``), ``error_message=text``, timestamp now.

        The one shape every crash path uses (providers, the agent loop and its wrappers);
        :meth:`runtime.llm.builder.MessageBuilder.fail` instead ends a message that may already
        hold streamed content."""
        return cls(
            api=model.api,
            provider=model.provider,
            model=model.id,
            stop_reason="aborted" if aborted else "error",
            error_message=text,
        )

    def text(self) -> str:
        """Concatenate the text blocks (thinking and tool calls excluded)."""
        return "".join(b.text for b in self.content if isinstance(b, TextContent))

    def tool_calls(self) -> list[ToolCall]:
        """Return the tool-call blocks in source order."""
        return [b for b in self.content if isinstance(b, ToolCall)]


class ToolResultMessage(_Base):
    """The outcome of one tool call, sent back to the model."""

    role: Literal["toolResult"] = "toolResult"
    tool_call_id: str
    tool_name: str
    content: list[ToolResultContent] = Field(default_factory=list)
    details: Any = None
    """Structured data for the host/UI; never sent to the model."""
    is_error: bool = False
    timestamp: int = Field(default_factory=now_ms)


class CustomMessage(_Base):
    """Extension point for host messages (IM notices, UI markers) kept in a session.

    ``convert_to_llm`` drops these by default; a host that wants the model to see one
    converts it into a :class:`UserMessage` in its own ``convert_to_llm``.
    """

    role: Literal["custom"] = "custom"
    custom_type: str
    """The host's own discriminator (e.g. ``im_notice``)."""
    data: dict[str, Any] = Field(default_factory=dict)
    timestamp: int = Field(default_factory=now_ms)


Message: TypeAlias = Annotated[
    UserMessage | AssistantMessage | ToolResultMessage, Field(discriminator="role")
]
"""A message an LLM understands."""

AgentMessage: TypeAlias = Annotated[
    UserMessage | AssistantMessage | ToolResultMessage | CustomMessage, Field(discriminator="role")
]
"""A message kept in an agent's context: an LLM message or a host :class:`CustomMessage`."""


# --------------------------------------------------------------------------- tools, context, model


class Tool(_Base):
    """A tool as the model sees it: name, description and a JSON Schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON Schema (draft 2020-12 subset) of the ``arguments`` object."""


class Context(_Base):
    """Everything sent to the model: the system prompt, the messages and the tools
    (docs/decisions.md#llm-context-shape)."""

    system_prompt: str = ""
    messages: list[AgentMessage] = Field(default_factory=list)
    tools: list[Tool] | None = None


class Model(_Base):
    """A callable model: identity, wire protocol (``api``) and budget
    (docs/decisions.md#llm-single-entry).

    Raises nothing itself; ``stream`` raises ``UnknownApiError`` when ``api`` is not
    registered.
    """

    id: str
    """The provider's model id (sent on the wire)."""
    name: str = ""
    """Display name; defaults to ``id`` in listings."""
    api: str
    """Wire-protocol id in the api registry: ``openai-completions``, ``anthropic-messages``,
    ``google-generative-ai``, ``faux``…"""
    provider: str = ""
    """Provider alias from ``ai.providers`` (e.g. ``local``)."""
    base_url: str = ""
    """Endpoint base URL (e.g. ``https://api.openai.com/v1``)."""
    reasoning: bool = False
    """Whether the model can emit thinking."""
    input: list[InputKind] = Field(default_factory=lambda: list[InputKind](["text"]))
    """Accepted input kinds; ``image`` means vision-capable."""
    cost: ModelCost = Field(default_factory=ModelCost)
    context_window: int = 128_000
    """Context window in tokens."""
    max_tokens: int = 4_096
    """Default output budget in tokens."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra HTTP headers sent with every request."""
    compat: dict[str, Any] = Field(default_factory=dict)
    """Per-api capability flags (e.g. ``supports_developer_role``, ``max_tokens_field``,
    ``structured_output``); each provider documents the keys it reads."""

    def ref(self) -> str:
        """Return ``provider/id`` (or just ``id`` without a provider), as used in config."""
        return f"{self.provider}/{self.id}" if self.provider else self.id

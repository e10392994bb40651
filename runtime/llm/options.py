"""Options of one LLM call (``stream(model, context, options)``,
docs/decisions.md#llm-single-entry).

Dataclasses rather than pydantic models: they hold live objects (an :class:`AbortSignal`,
callbacks) and are never serialized.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from runtime.llm.abort import AbortSignal

__all__ = ["ReasoningLevel", "SimpleStreamOptions", "StreamOptions"]

ReasoningLevel: TypeAlias = Literal["off", "minimal", "low", "medium", "high"]


@dataclass
class StreamOptions:
    """Per-call options understood by every api.

    Attributes:
        signal: Cancellation; when it fires the stream ends with an ``error`` event whose
            message has ``stop_reason="aborted"``.
        api_key: Overrides the key from ``get_api_key``/the environment. Never logged.
        max_tokens: Output budget in tokens (defaults to ``model.max_tokens``).
        temperature: Sampling temperature, ``None`` for the provider default.
        headers: Extra HTTP headers for this call (merged over ``model.headers``).
        session_id: Opaque id for provider-side prompt caching / affinity.
        timeout: Whole-request timeout in seconds (``None``: the provider default, 600 s).
        tool_choice: ``None``/``"auto"``, ``"none"``, ``"required"`` (any tool), or a tool name to
            force that tool (structured output's ``tool`` tier uses this).
        output_schema: A JSON Schema that the final text must follow, requested natively
            (OpenAI ``response_format=json_schema`` strict, Gemini ``responseSchema``);
            structured output's ``native`` tier sets it. Providers without native support
            ignore it.
        output_schema_name: Name sent with ``output_schema`` (``[a-zA-Z0-9_-]``, ≤ 64 chars).
        max_retries: Retries on 429/5xx/overloaded before the first content event.
        extra: Api-specific extras (documented per provider module).
    """

    signal: AbortSignal | None = None
    api_key: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    session_id: str | None = None
    timeout: float | None = None
    tool_choice: str | None = None
    output_schema: dict[str, Any] | None = None
    output_schema_name: str = "output"
    max_retries: int = 2
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class SimpleStreamOptions(StreamOptions):
    """:class:`StreamOptions` plus one unified reasoning knob mapped by each api.

    Attributes:
        reasoning: ``off`` | ``minimal`` | ``low`` | ``medium`` | ``high``; ignored by models whose
            ``Model.reasoning`` is false.
    """

    reasoning: ReasoningLevel = "off"

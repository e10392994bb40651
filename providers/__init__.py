"""LLM wire protocols, one module per ``api`` id
(docs/decisions.md#provider-split-by-concern).

Importing this package (or any provider module) registers nothing; entry points call
:func:`register_builtin_providers` once (docs/decisions.md#llm-api-registry).
"""

from __future__ import annotations

__all__ = ["register_builtin_providers"]


def register_builtin_providers() -> list[str]:
    """Register the built-in apis in :mod:`runtime.llm.registry` (idempotent; later calls replace).

    Registers ``openai-completions``, ``anthropic-messages``, ``google-generative-ai`` (source id
    ``builtin``) and ``faux`` (source id ``faux``).

    Returns:
        The api ids registered by this call, sorted.
    """
    from providers import anthropic_messages, faux, google_generative_ai, openai_completions
    from runtime.llm.registry import register_api_provider

    register_api_provider(
        openai_completions.API,
        openai_completions.stream_openai_completions,
        openai_completions.stream_simple,
        source_id="builtin",
    )
    register_api_provider(
        anthropic_messages.API,
        anthropic_messages.stream_anthropic_messages,
        anthropic_messages.stream_simple,
        source_id="builtin",
    )
    register_api_provider(
        google_generative_ai.API,
        google_generative_ai.stream_google_generative_ai,
        google_generative_ai.stream_simple,
        source_id="builtin",
    )
    faux.register_faux_api()
    return sorted([openai_completions.API, anthropic_messages.API, google_generative_ai.API, faux.FAUX_API])

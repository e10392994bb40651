"""LLM wire protocols, one module per ``api`` id
(docs/decisions.md#provider-split-by-concern).

Importing this package (or any provider module) registers nothing; entry points call
:func:`register_builtin_providers` once (docs/decisions.md#llm-api-registry).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from providers.common import ProviderConfigs

__all__ = ["register_builtin_providers"]


def register_builtin_providers(provider_configs: ProviderConfigs | None = None) -> list[str]:
    """Register the built-in apis in :mod:`runtime.llm.registry` (idempotent; later calls replace).

    Registers ``openai-completions``, ``anthropic-messages``, ``google-generative-ai`` (source id
    ``builtin``) and ``faux`` (source id ``faux``). The scripted faux handles of the configuration
    (``ai.providers.<alias>.script``) are registered above the providers, by
    :func:`actors.models.faux_script.register_configured_providers`, which calls this function
    (docs/decisions.md#layout-forbidden-pairs).

    Args:
        provider_configs: The configured providers by alias (``Config.ai.providers``); the
            registered stream functions look API keys up in it
            (:func:`providers.common.resolve_api_key`). ``None``: no configured providers (keys
            come from the call's options or, on the api's own host, its conventional variable).
            Providers never read the process-wide configuration
            (`docs/decisions.md#providers-take-config`).

    Returns:
        The api ids registered by this call, sorted.
    """
    from providers import anthropic_messages, faux, google_generative_ai, openai_completions
    from runtime.llm.registry import register_api_provider

    for module, stream in (
        (openai_completions, openai_completions.stream_openai_completions),
        (anthropic_messages, anthropic_messages.stream_anthropic_messages),
        (google_generative_ai, google_generative_ai.stream_google_generative_ai),
    ):
        register_api_provider(
            module.API,
            partial(stream, provider_configs=provider_configs),
            partial(module.stream_simple, provider_configs=provider_configs),
            source_id="builtin",
        )
    faux.register_faux_api()
    return sorted([openai_completions.API, anthropic_messages.API, google_generative_ai.API, faux.FAUX_API])

"""Small helpers every wire adapter shares: API-key lookup, cost, ids, tool choice, URLs.

Nothing here knows a wire format; each adapter maps the results onto its own JSON.
"""

from __future__ import annotations

import os
import secrets as _secrets
from collections.abc import Callable
from typing import Any

from pydantic_core import from_json

from runtime.options import StreamOptions
from runtime.types import AssistantMessage, Model, Usage

__all__ = [
    "DEFAULT_KEY_ENV",
    "apply_cost",
    "crash_handler",
    "finalize_usage",
    "join_url",
    "loads",
    "mint_tool_call_id",
    "resolve_api_key",
]

DEFAULT_KEY_ENV: dict[str, str] = {
    "openai-completions": "OPENAI_API_KEY",
    "anthropic-messages": "ANTHROPIC_API_KEY",
    "google-generative-ai": "GEMINI_API_KEY",
    "openai-images": "OPENAI_API_KEY",
}
"""Environment variable read when neither options, ``get_api_key`` nor the config give a key."""


def resolve_api_key(model: Model, options: StreamOptions | None) -> str | None:
    """Return the API key for one call, or ``None`` (keyless local servers).

    Order (issue 3, item 4): ``options.api_key``; ``options.extra["get_api_key"](provider_alias)``
    (the agent loop's dynamic-key hook, seed 002 D3 ``getApiKey``); the provider's
    ``api_key_env`` from the loaded configuration (:func:`runtime.config.get_api_key`); finally the
    api's conventional variable (:data:`DEFAULT_KEY_ENV`). Keys are never logged.
    """
    if options is not None:
        if options.api_key:
            return options.api_key
        hook: Callable[[str], str | None] | None = options.extra.get("get_api_key")
        if hook is not None:
            key = hook(model.provider)
            if key:
                return key
    from runtime.config import get_api_key  # local import: config is optional at import time

    key = get_api_key(model.provider) if model.provider else None
    if key:
        return key
    env = DEFAULT_KEY_ENV.get(model.api)
    return os.environ.get(env) if env else None


def loads(data: str) -> Any:
    """Parse one event's JSON (pydantic-core's Rust parser: 3-5x faster than ``json.loads`` on
    stream chunks, which keeps the hot path lean).

    Raises:
        ValueError: ``data`` is not valid JSON.
    """
    return from_json(data, cache_strings=False)


def finalize_usage(model: Model, usage: Usage) -> None:
    """Fill ``usage.total_tokens`` (input + output + cache_read + cache_write) and its cost."""
    usage.total_tokens = usage.input + usage.output + usage.cache_read + usage.cache_write
    apply_cost(model, usage)


def apply_cost(model: Model, usage: Usage) -> None:
    """Set ``usage.cost`` in USD from ``model.cost`` (USD per million tokens)."""
    c, m = usage.cost, model.cost
    c.input = usage.input * m.input / 1e6
    c.output = usage.output * m.output / 1e6
    c.cache_read = usage.cache_read * m.cache_read / 1e6
    c.cache_write = usage.cache_write * m.cache_write / 1e6
    c.total = c.input + c.output + c.cache_read + c.cache_write


def mint_tool_call_id(name: str) -> str:
    """Return a fresh call id ``call_<12 hex>`` for providers that send none (Gemini)."""
    del name  # the id must not depend on the name: two calls of one tool need distinct ids
    return f"call_{_secrets.token_hex(6)}"


def join_url(base_url: str, path: str) -> str:
    """Join ``base_url`` and ``path`` with exactly one ``/`` between them."""
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def crash_handler(model: Model) -> Callable[[BaseException], AssistantMessage]:
    """Return the ``on_crash`` callback for :func:`runtime.events.run_stream`: an error message
    naming the exception (``stop_reason="error"``; run_stream turns cancellation into aborted)."""

    def on_crash(exc: BaseException) -> AssistantMessage:
        return AssistantMessage(
            api=model.api,
            provider=model.provider,
            model=model.id,
            stop_reason="error",
            error_message=f"{type(exc).__name__}: {exc}",
        )

    return on_crash

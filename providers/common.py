"""Small helpers every wire adapter shares: API-key lookup, cost, ids, tool choice, URLs.

Nothing here knows a wire format; each adapter maps the results onto its own JSON.
"""

from __future__ import annotations

import os
import secrets as _secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias
from urllib.parse import urlsplit

from pydantic_core import from_json

from runtime.config import ProviderConfig
from runtime.llm.options import StreamOptions
from runtime.llm.types import NO_TEXT, AssistantMessage, ImageContent, Model, Usage, UserMessage
from runtime.llm.usage import priced

__all__ = [
    "DEFAULT_KEY_ENV",
    "OFFICIAL_HOSTS",
    "SECRET_HEADERS",
    "ApiKeyError",
    "ContextError",
    "ProviderConfigs",
    "apply_cost",
    "crash_handler",
    "finalize_usage",
    "join_url",
    "loads",
    "mint_tool_call_id",
    "request_secrets",
    "require_user_turn",
    "resolve_api_key",
    "sendable_user",
]

DEFAULT_KEY_ENV: dict[str, str] = {
    "openai-completions": "OPENAI_API_KEY",
    "anthropic-messages": "ANTHROPIC_API_KEY",
    "google-generative-ai": "GEMINI_API_KEY",
    "openai-images": "OPENAI_API_KEY",
}
"""Environment variable read when neither options, ``get_api_key`` nor the config give a key."""

ProviderConfigs: TypeAlias = Mapping[str, ProviderConfig]
"""The configured providers by alias (``Config.ai.providers``), as the caller passes them to
:func:`providers.register_builtin_providers` (or straight to a provider function); providers
never read the process-wide configuration themselves."""

OFFICIAL_HOSTS: dict[str, str] = {
    "openai-completions": "api.openai.com",
    "anthropic-messages": "api.anthropic.com",
    "google-generative-ai": "generativelanguage.googleapis.com",
    "openai-images": "api.openai.com",
}
"""The only host each :data:`DEFAULT_KEY_ENV` variable is ever sent to."""


class ApiKeyError(ValueError):
    """No usable API key for a call; the message names where the key was expected (the
    environment variable's *name*), never a key value."""


SECRET_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "x-goog-api-key", "proxy-authorization"})
"""Header names whose values are redacted from errors and logs like API keys."""


def _clean_key(key: str, source: str) -> str:
    key = key.strip()
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        # httpx would quote the whole header value (key included) in its error
        raise ApiKeyError(f"the API key from {source} contains whitespace or control characters")
    return key


def resolve_api_key(
    model: Model, options: StreamOptions | None, provider_configs: ProviderConfigs | None = None
) -> str | None:
    """Return the API key for one call, or ``None`` (keyless local servers).

    Order (docs/decisions.md#llm-api-keys): ``options.api_key``;
    ``options.extra["get_api_key"](provider_alias)`` (the agent loop's dynamic-key hook); for a
    provider in ``provider_configs`` (``ai.providers``, passed by the caller: providers never read
    the process-wide configuration), the variable named by its ``api_key_env`` (no
    ``api_key_env``: keyless, and no other vendor's key is ever sent to it); for an unconfigured
    provider alias, the api's conventional variable (:data:`DEFAULT_KEY_ENV`), and only when the
    model's ``base_url`` is empty or on the api's own host (:data:`OFFICIAL_HOSTS`). Surrounding
    whitespace (a trailing newline from a ``.env`` file) is stripped. Keys are never logged.

    Raises:
        ApiKeyError: the configured ``api_key_env`` variable is unset or empty (the message names
            the variable and the config key), or the key contains whitespace/control characters.
    """
    if options is not None:
        if options.api_key:
            return _clean_key(options.api_key, "StreamOptions.api_key")
        hook: Callable[[str], str | None] | None = options.extra.get("get_api_key")
        if hook is not None:
            key = hook(model.provider)
            if key:
                return _clean_key(key, "the get_api_key hook")
    provider = provider_configs.get(model.provider) if provider_configs and model.provider else None
    if provider is not None:
        env = provider.api_key_env
        if not env:
            return None
        value = os.environ.get(env, "")
        if not value.strip():
            raise ApiKeyError(
                f"no API key for provider {model.provider!r}: the environment variable {env} "
                f"(ai.providers.{model.provider}.api_key_env) is not set"
            )
        return _clean_key(value, f"the environment variable {env}")
    default_env = DEFAULT_KEY_ENV.get(model.api)
    host = urlsplit(model.base_url).hostname if model.base_url else OFFICIAL_HOSTS.get(model.api)
    if not default_env or host != OFFICIAL_HOSTS.get(model.api):
        return None  # never send e.g. OPENAI_API_KEY to a host that is not OpenAI's
    value = os.environ.get(default_env, "")
    return _clean_key(value, f"the environment variable {default_env}") if value.strip() else None


def request_secrets(key: str | None, headers: dict[str, str]) -> list[str]:
    """Strings to redact for one request: the key, and the values of :data:`SECRET_HEADERS`
    (a key put into ``headers`` in the configuration) with and without a ``Bearer`` prefix."""
    out = [key] if key else []
    for name, value in headers.items():
        if name.lower() in SECRET_HEADERS and value:
            out.append(value)
            scheme, _, rest = value.partition(" ")
            if rest and scheme.lower() in ("bearer", "basic"):
                out.append(rest.strip())
    return sorted(set(out), key=len, reverse=True)  # longest first: no partial replacement


def loads(data: str) -> Any:
    """Parse one event's JSON (pydantic-core's Rust parser: 3-5x faster than ``json.loads`` on
    stream chunks, which keeps the hot path lean).

    Raises:
        ValueError: ``data`` is not valid JSON.
    """
    return from_json(data, cache_strings=False)


def finalize_usage(model: Model, usage: Usage) -> None:
    """Fill ``usage.total_tokens`` (input + output + cache_read + cache_write) and its cost.

    Raises:
        ValueError: a count the provider sent is not a whole number (``1.5``, ``true``, ``"7"``);
            the transport turns it into a ``malformed event`` error instead of storing a message
            that would not validate when read back.
    """
    bad: list[str] = []
    for name in ("input", "output", "cache_read", "cache_write"):
        value = getattr(usage, name)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            bad.append(f"{name}={value!r}")
            value = 0  # the message keeps valid types whatever the provider sent
        setattr(usage, name, value)
    if bad:
        usage.total_tokens = 0
        raise ValueError(f"usage: token count {', '.join(bad)} is not a whole number")
    usage.total_tokens = usage.input + usage.output + usage.cache_read + usage.cache_write
    apply_cost(model, usage)


def apply_cost(model: Model, usage: Usage) -> None:
    """Set ``usage.cost`` in USD from ``model.cost`` (USD per million tokens;
    :func:`runtime.llm.usage.priced`)."""
    usage.cost = priced(model.cost, usage)


def mint_tool_call_id(name: str) -> str:
    """Return a fresh call id ``call_<12 hex>`` for providers that send none (Gemini)."""
    del name  # the id must not depend on the name: two calls of one tool need distinct ids
    return f"call_{_secrets.token_hex(6)}"


class ContextError(ValueError):
    """A Context no provider body can be built from: it has no message, or it ends on the
    assistant's message (docs/decisions.md#llm-user-turns). Raised before anything is sent; the
    stream ends with an ``error`` event carrying this message."""


def sendable_user(msg: UserMessage) -> UserMessage:
    """``msg``, or — when it has no non-whitespace text and no image — a copy whose content is
    :data:`~runtime.llm.types.NO_TEXT` (an empty user message is never sent, nor dropped:
    docs/decisions.md#llm-user-turns)."""
    if isinstance(msg.content, str):
        empty = not msg.content.strip()
    else:
        empty = not any(isinstance(b, ImageContent) or b.text.strip() for b in msg.content)
    return msg.model_copy(update={"content": NO_TEXT}) if empty else msg


def require_user_turn(messages: Sequence[Mapping[str, Any]], assistant_role: str) -> None:
    """Check a converted message list (``{"role", …}`` dicts, system messages left out) before it
    is sent (docs/decisions.md#llm-user-turns).

    Raises:
        ContextError: ``messages`` is empty, or its last role is ``assistant_role`` (``assistant``;
            Gemini: ``model``).
    """
    if not messages:
        raise ContextError("the context has no message for the model to answer")
    if messages[-1].get("role") == assistant_role:
        raise ContextError("the context ends on the assistant's message: nothing for the model to answer")


def join_url(base_url: str, path: str) -> str:
    """Join ``base_url`` and ``path`` with exactly one ``/`` between them."""
    return base_url.rstrip("/") + "/" + path.lstrip("/")


def crash_handler(model: Model) -> Callable[[BaseException], AssistantMessage]:
    """Return the ``on_crash`` callback for :func:`runtime.llm.events.run_stream`: an error message
    naming the exception (``stop_reason="error"``; run_stream turns cancellation into aborted)."""

    def on_crash(exc: BaseException) -> AssistantMessage:
        plain = isinstance(exc, ApiKeyError | ContextError)
        text = str(exc) if plain else f"{type(exc).__name__}: {exc}"
        return AssistantMessage.error_for(model, text)

    return on_crash

"""The api registry: wire protocols registered by ``api`` id
(docs/decisions.md#llm-api-registry).

``runtime`` never imports a provider module by name; providers call
:func:`register_api_provider` and :func:`runtime.llm.stream.stream` looks the model's ``api`` up here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runtime.llm.events import AssistantMessageEventStream
from runtime.llm.options import SimpleStreamOptions, StreamOptions
from runtime.llm.types import Context, Model

__all__ = [
    "ApiMismatchError",
    "ApiProvider",
    "StreamFn",
    "StreamSimpleFn",
    "UnknownApiError",
    "get_api_provider",
    "list_api_providers",
    "register_api_provider",
    "unregister_api_providers",
]

StreamFn = Callable[[Model, Context, StreamOptions | None], AssistantMessageEventStream]
StreamSimpleFn = Callable[[Model, Context, SimpleStreamOptions | None], AssistantMessageEventStream]


class UnknownApiError(LookupError):
    """No provider is registered for the requested api id; the message lists the registered ids."""


class ApiMismatchError(ValueError):
    """A provider was called with a model whose ``api`` is a different id."""


@dataclass(frozen=True)
class ApiProvider:
    """One registered wire protocol: its id, full and simple stream functions, and owner."""

    api: str
    stream: StreamFn
    stream_simple: StreamSimpleFn
    source_id: str | None = None


_registry: dict[str, ApiProvider] = {}


def _checked(api: str, fn: Callable[..., AssistantMessageEventStream]) -> Callable:
    def wrapper(model: Model, context: Context, options: object = None) -> AssistantMessageEventStream:
        if model.api != api:
            raise ApiMismatchError(f"model {model.id!r} has api {model.api!r}, not {api!r}")
        return fn(model, context, options)

    return wrapper


def register_api_provider(
    api: str, stream: StreamFn, stream_simple: StreamSimpleFn, source_id: str | None = None
) -> None:
    """Register (or replace) the implementation of ``api``.

    Args:
        api: The id models name in ``Model.api`` (e.g. ``openai-completions``).
        stream: ``(model, context, StreamOptions | None) -> AssistantMessageEventStream``.
        stream_simple: Same with :class:`SimpleStreamOptions` (unified ``reasoning`` level).
        source_id: Owner tag so :func:`unregister_api_providers` can remove a group at once.

    The registered callables reject a model of another api with :class:`ApiMismatchError`.
    """
    _registry[api] = ApiProvider(api, _checked(api, stream), _checked(api, stream_simple), source_id)


def get_api_provider(api: str) -> ApiProvider:
    """Return the provider registered for ``api``.

    Raises:
        UnknownApiError: nothing is registered under ``api``; the message lists the known ids.
    """
    try:
        return _registry[api]
    except KeyError:
        known = ", ".join(sorted(_registry)) or "(none; call providers.register_builtin_providers())"
        raise UnknownApiError(f"no provider registered for api {api!r}; registered: {known}") from None


def list_api_providers() -> list[str]:
    """Return the registered api ids, sorted."""
    return sorted(_registry)


def unregister_api_providers(source_id: str) -> int:
    """Remove every provider registered with ``source_id``; returns how many were removed."""
    gone = [k for k, v in _registry.items() if v.source_id == source_id]
    for k in gone:
        del _registry[k]
    return len(gone)

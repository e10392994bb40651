"""The two stream functions of an SSE wire protocol, made once for every provider module
(docs/decisions.md#provider-split-by-concern).

A provider module names what is its own — its ``api`` id, how one request is made, which parser
reads the answer — in an :class:`SseApi`, and exports its ``stream`` and ``stream_simple``: the
functions :func:`providers.register_builtin_providers` registers
(docs/decisions.md#llm-api-registry). The call itself is :func:`providers.transport.stream_sse_call`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from providers.common import ProviderConfigs
from providers.transport import HttpRequest, SseParser, stream_sse_call
from runtime.llm.builder import MessageBuilder
from runtime.llm.events import AssistantMessageEventStream
from runtime.llm.options import SimpleStreamOptions, StreamOptions
from runtime.llm.types import Context, Model

__all__ = ["SseApi"]


@dataclass(frozen=True)
class SseApi:
    """One SSE wire protocol.

    Attributes:
        api: Its ``api`` id (registry key, metrics label).
        request: ``(model, context, options, reasoning) -> HttpRequest``: URL, headers and JSON
            body of one call; ``options.api_key`` is the key resolved for it (``None``: keyless),
            ``reasoning`` the unified level (``"off"`` for plain :class:`StreamOptions`).
        parser: ``(builder, model) -> SseParser``: a fresh parser per attempt, feeding ``builder``.
    """

    api: str
    request: Callable[[Model, Context, StreamOptions, str], HttpRequest]
    parser: Callable[[MessageBuilder, Model], SseParser]

    def stream(
        self,
        model: Model,
        context: Context,
        options: StreamOptions | None = None,
        *,
        provider_configs: ProviderConfigs | None = None,
    ) -> AssistantMessageEventStream:
        """Stream one call; returns at once, and failures (HTTP errors, timeouts, aborts,
        malformed chunks) arrive as the terminal ``error`` event with the provider's message.
        ``provider_configs`` (``ai.providers``) is where the API key is looked up
        (:func:`providers.common.resolve_api_key`)."""
        return stream_sse_call(
            self.api,
            model,
            options,
            lambda opts, reasoning: self.request(model, context, opts, reasoning),
            lambda builder: self.parser(builder, model),
            provider_configs,
        )

    def stream_simple(
        self,
        model: Model,
        context: Context,
        options: SimpleStreamOptions | None = None,
        *,
        provider_configs: ProviderConfigs | None = None,
    ) -> AssistantMessageEventStream:
        """:meth:`stream` with the unified reasoning level of ``options`` (default: none), which
        each protocol's ``request`` maps to its own field."""
        return self.stream(
            model, context, options or SimpleStreamOptions(), provider_configs=provider_configs
        )

"""The platform HTTP clients of one delivery actor: one per bot whose transport is HTTP, each with
its share of the bot's connection bound, each probing what the server's TCP acknowledged
(docs/decisions.md#delivery-connections, docs/decisions.md#delivery-not-received).
"""

from __future__ import annotations

import ssl
from typing import Any

import certifi
import httpcore
import httpx

from runtime.delivery.settings import DeliverySettings, bot_id_of, bot_key
from runtime.delivery.wire_probe import ProbedBackend
from runtime.platforms.common import setting
from runtime.reply.http_pool import PoolTransport

__all__ = [
    "DEFAULT_BOT_CONNECTIONS",
    "MAX_CONNECTIONS",
    "PlatformClients",
    "actor_connections",
    "platform_client",
]

MAX_CONNECTIONS = 32
"""Platform API connections one delivery actor opens at most to one bot, whatever its
``bots[].max_connections`` (docs/decisions.md#delivery-connections)."""
DEFAULT_BOT_CONNECTIONS = 4
"""``bots[].max_connections`` when unset: a small server's listen backlog (5 for Python's
``http.server``) is not overrun by one bot's replies (docs/decisions.md#delivery-connections)."""
KEEPALIVE_S = 5.0
"""An idle kept-alive connection is closed after this many seconds (httpx's default)."""


def actor_connections(bot: Any, actors: int) -> int:
    """Connections one of ``actors`` delivery actors opens at most to ``bot``'s platform API: its
    share of ``bots[].max_connections`` (default 4: all actors together), rounded up, at least 1 and
    at most :data:`MAX_CONNECTIONS`."""
    bound = int(setting(bot, "max_connections", DEFAULT_BOT_CONNECTIONS) or DEFAULT_BOT_CONNECTIONS)
    return max(1, min(MAX_CONNECTIONS, -(-bound // max(1, actors))))


def platform_client(
    timeout_s: float,
    max_connections: int,
    *,
    network_backend: httpcore.AsyncNetworkBackend | None = None,
) -> httpx.AsyncClient:
    """The HTTP client of one bot's platform API in a delivery actor (HTTP/1.1, TLS verified
    against certifi's roots; proxy variables of the environment are not read).

    Args:
        timeout_s: httpx timeout of each operation (connect, write, read, wait for a connection),
            in seconds.
        max_connections: Connections it opens at most (kept alive between calls); a call waits for
            a free one, and a wait past ``timeout_s`` is ``httpx.PoolTimeout`` (nothing written).
        network_backend: httpcore backend under the probe (None: httpcore's own).
    """
    pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl.create_default_context(cafile=certifi.where()),
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=KEEPALIVE_S,
        network_backend=ProbedBackend(network_backend),
    )
    return httpx.AsyncClient(transport=PoolTransport(pool), timeout=timeout_s, trust_env=False)


class PlatformClients:
    """One :func:`platform_client` per bot of ``settings.bots`` not in ``socket_bots``, keyed by
    :func:`runtime.delivery.settings.bot_key`, with :func:`actor_connections` connections each."""

    def __init__(self, settings: DeliverySettings, socket_bots: set[tuple[str, str]]) -> None:
        self._clients: dict[tuple[str, str], httpx.AsyncClient] = {}
        for bot in settings.bots:
            key = bot_key(str(bot.platform), bot_id_of(bot))
            if key not in socket_bots:
                self._clients[key] = platform_client(
                    settings.timeout_s, actor_connections(bot, settings.actors)
                )

    def get(self, key: tuple[str, str]) -> httpx.AsyncClient | None:
        """The client of the bot ``key`` (None: no such HTTP bot)."""
        return self._clients.get(key)

    def values(self) -> list[httpx.AsyncClient]:
        """Every client (one per HTTP bot)."""
        return list(self._clients.values())

    async def aclose(self) -> None:
        """Close every client and its connections."""
        for client in self._clients.values():
            await client.aclose()

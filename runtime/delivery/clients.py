"""The platform HTTP clients of one delivery actor: one per bot whose transport is HTTP, each with
its share of the bot's connection bound, each probing what the server's TCP acknowledged
(docs/decisions.md#delivery-connections, docs/decisions.md#delivery-not-received).
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import certifi
import httpcore
import httpx

from runtime.config import BotConfig
from runtime.delivery.settings import DeliverySettings, bot_id_of, bot_key
from runtime.delivery.wire_probe import ProbedBackend
from runtime.platforms.common import setting
from runtime.reply.http_pool import PoolTransport

__all__ = [
    "DEFAULT_BOT_CONNECTIONS",
    "MAX_CONNECTIONS",
    "PlatformClient",
    "PlatformClients",
    "actor_connections",
    "platform_client",
]

MAX_CONNECTIONS = 32
"""Platform API connections one delivery actor opens at most to one bot, whatever its
``bots[].max_connections`` (docs/decisions.md#delivery-connections)."""
DEFAULT_BOT_CONNECTIONS: int = BotConfig.model_fields["max_connections"].default
"""``bots[].max_connections`` of a bot entry without the field (the config's default, 4)."""
KEEPALIVE_S = 5.0
"""An idle kept-alive connection is closed after this many seconds (httpx's default)."""


def actor_connections(bot: Any, actors: int) -> int:
    """Connections one of ``actors`` delivery actors opens at most to ``bot``'s platform API: its
    share of ``bots[].max_connections`` (all actors together), rounded up, at least 1 and
    at most :data:`MAX_CONNECTIONS`."""
    bound = int(setting(bot, "max_connections", DEFAULT_BOT_CONNECTIONS) or DEFAULT_BOT_CONNECTIONS)
    return max(1, min(MAX_CONNECTIONS, -(-bound // max(1, actors))))


class PlatformClient(httpx.AsyncClient):
    """The httpx client of :func:`platform_client`, plus :meth:`post_json`: a JSON POST straight
    through its connection pool (:meth:`runtime.reply.http_pool.PoolTransport.call`), the same
    request on the wire as ``client.post(url, json=...)`` and the same errors."""

    def __init__(self, transport: PoolTransport, timeout_s: float) -> None:
        super().__init__(transport=transport, timeout=timeout_s, trust_env=False)
        self.direct = transport
        self.timeouts = {"connect": timeout_s, "read": timeout_s, "write": timeout_s, "pool": timeout_s}

    @property
    def direct_ok(self) -> bool:
        """:meth:`post_json` may stand for ``post``: no httpx event hook is set on this client
        (it bypasses them; with one, every call goes through httpx's client)."""
        return not (self.event_hooks["request"] or self.event_hooks["response"])

    async def post_json(
        self, url: str, body: Any, headers: dict[str, str] | None, extensions: dict[str, Any]
    ) -> httpx.Response:
        """POST ``body`` as compact UTF-8 JSON (httpx's own encoding) to ``url`` with ``headers``
        and httpx's default ones; ``extensions`` (e.g. ``trace``) go to httpcore.

        Raises:
            httpx.TransportError: as ``httpx.AsyncClient.post``.
            ValueError: ``body`` holds NaN or infinity (httpx refuses them too).
        """
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        parts = urlsplit(url)
        given = {k.encode("ascii"): v.encode("ascii") for k, v in (headers or {}).items()}
        own = {k.lower() for k in given}
        raw = [(b"Host", parts.netloc.rpartition("@")[2].encode("ascii"))]
        raw += [(k, v) for k, v in _DEFAULT_HEADERS if k.lower() not in own]
        raw += [*given.items(), (b"Content-Length", str(len(data)).encode())]
        if b"content-type" not in own:
            raw.append((b"Content-Type", b"application/json"))
        return await self.direct.call("POST", url, raw, data, {"timeout": self.timeouts, **extensions})


_DEFAULT_HEADERS = [
    (b"Accept", b"*/*"),
    (b"Accept-Encoding", b"gzip, deflate"),
    (b"Connection", b"keep-alive"),
    (b"User-Agent", f"python-httpx/{httpx.__version__}".encode()),
]
"""The headers httpx adds to every request of a client unless the call gives its own
(``Accept-Encoding``: the two codings every httpx decodes)."""


def platform_client(
    timeout_s: float,
    max_connections: int,
    *,
    network_backend: httpcore.AsyncNetworkBackend | None = None,
) -> PlatformClient:
    """The HTTP client of one bot's platform API in a delivery actor (HTTP/1.1, TLS verified
    against certifi's roots, no proxy).

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
    return PlatformClient(PoolTransport(pool), timeout_s)


def _proxied(api_base: str | None) -> bool:
    """The environment names a proxy for ``api_base`` (``HTTP(S)_PROXY``, ``ALL_PROXY``, and the
    host is not in ``NO_PROXY``), as the standard library reads the variables."""
    if not api_base:
        return False
    parts = urlsplit(api_base)
    proxies = urllib.request.getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return False
    return not urllib.request.proxy_bypass(parts.hostname or "")


class PlatformClients:
    """One client per bot of ``settings.bots`` not in ``socket_bots``, keyed by
    :func:`runtime.delivery.settings.bot_key`, with :func:`actor_connections` connections each: a
    :func:`platform_client`, or, for a bot whose ``api_base`` the environment sends through a
    proxy, httpx's own client, which uses the proxy (its peer is then the proxy: nothing is
    probed, and a call written and unanswered stays uncertain)."""

    def __init__(self, settings: DeliverySettings, socket_bots: set[tuple[str, str]]) -> None:
        self._clients: dict[tuple[str, str], httpx.AsyncClient] = {}
        for bot in settings.bots:
            key = bot_key(str(bot.platform), bot_id_of(bot))
            if key in socket_bots:
                continue
            share = actor_connections(bot, settings.actors)
            if _proxied(setting(bot, "api_base", None)):  # as before: httpx reads the proxy variables
                limits = httpx.Limits(max_connections=share, max_keepalive_connections=share)
                self._clients[key] = httpx.AsyncClient(timeout=settings.timeout_s, limits=limits)
            else:
                self._clients[key] = platform_client(settings.timeout_s, share)

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

"""An httpx transport over a caller-built ``httpcore.AsyncConnectionPool``: the way to give an
httpx client an httpcore network backend (httpx itself offers no public parameter for one;
assigning ``AsyncHTTPTransport._pool`` would depend on a private attribute).

Used by the guarded media fetch (:mod:`runtime.reply.media_fetch`: connect-time address check) and
by the delivery actors' platform client (:mod:`runtime.delivery.wire_probe`: what the peer's TCP
acknowledged). Only public APIs: ``httpx.AsyncBaseTransport``/``AsyncByteStream``/``Request``/
``Response`` and ``httpcore.AsyncConnectionPool``. HTTP/1.1 only, no proxies, no environment
settings; httpcore errors are raised as the httpx errors of the same name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpcore
import httpx

__all__ = ["PoolTransport"]

_HTTPCORE_ERRORS: tuple[type[Exception], ...] = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    httpcore.ProxyError,
    httpcore.ConnectionNotAvailable,
)


def _httpx_error(exc: Exception, request: httpx.Request) -> httpx.TransportError:
    """The httpx exception of the same name as an httpcore one (``ConnectError``, ``ReadTimeout``…)."""
    cls = getattr(httpx, type(exc).__name__, None)
    if not (isinstance(cls, type) and issubclass(cls, httpx.TransportError)):
        cls = httpx.TransportError
    return cls(str(exc) or type(exc).__name__, request=request)


class _RawStream(httpx.AsyncByteStream):
    """An httpcore response body as an httpx stream (errors mapped to httpx's)."""

    def __init__(self, body: Any, request: httpx.Request) -> None:
        self._body, self._request = body, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._body:
                yield chunk
        except _HTTPCORE_ERRORS as exc:
            raise _httpx_error(exc, self._request) from exc

    async def aclose(self) -> None:
        close = getattr(self._body, "aclose", None)
        if close is not None:
            await close()


class PoolTransport(httpx.AsyncBaseTransport):
    """httpx transport that sends every request through ``pool`` (see module docstring).

    Args:
        pool: The connection pool, with whatever ``network_backend``, limits and TLS context the
            caller chose; closed by :meth:`aclose`.
    """

    def __init__(self, pool: httpcore.AsyncConnectionPool) -> None:
        self._pool = pool

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through the pool; the body is returned unread (streamed)."""
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,  # httpx request streams are async iterables of bytes
            extensions=request.extensions,
        )
        try:
            resp = await self._pool.handle_async_request(core)
        except _HTTPCORE_ERRORS as exc:
            raise _httpx_error(exc, request) from exc
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=_RawStream(resp.stream, request),
            extensions=resp.extensions,
        )

    async def call(
        self,
        method: str,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        extensions: dict[str, Any],
    ) -> httpx.Response:
        """One request straight through the pool, its body read: what an ``httpx.AsyncClient``
        adds around :meth:`handle_async_request` (auth and redirect loops, cookies, header
        merging, request and response streams) is skipped — about a tenth of a delivery
        actor's CPU per platform call (docs/decisions.md#delivery-connections).

        Args:
            url: Absolute URL.
            headers: Every header to send, ``Host`` and ``Content-Length`` included (nothing is added).
            body: The request body (``b""``: none).
            extensions: httpcore extensions (``timeout``, ``trace``).

        Returns:
            The response, its content read.

        Raises:
            httpx.TransportError: the httpx error of the same name as httpcore's (``ConnectError``…).
        """
        try:
            resp = await self._pool.request(method, url, headers=headers, content=body, extensions=extensions)
        except _HTTPCORE_ERRORS as exc:
            raise _httpx_error(exc, httpx.Request(method, url)) from exc
        return httpx.Response(status_code=resp.status, headers=resp.headers, content=resp.content)

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self._pool.aclose()

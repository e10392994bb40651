"""Guarded HTTP(S) fetch of outbound media URLs
(docs/decisions.md#security-media-fetch-guard).

Entry point: ``await fetch_url(url, limit, allow_private=…, allowed_hosts=…)`` → the body bytes,
or :class:`MediaRejected` with a bounded reason (:data:`REJECT_REASONS`, shared with
:mod:`runtime.reply.media`, which re-exports everything public here).

The address rule: anything that is not a globally routable unicast address (loopback, private,
link-local, carrier-grade NAT ``100.64/10``, multicast, reserved, unspecified, benchmarking…; IPv4
embedded in IPv4-mapped, 6to4, Teredo and NAT64 IPv6 addresses is unwrapped and checked too) is
refused unless exempt. Decimal/octal/hex IPv4 spellings (``http://2130706433/``) are resolved by
the system resolver and so checked as the address they mean. It is applied twice: by
:func:`check_address` before each hop (nothing is sent to a refused host), and at connect time by
an httpcore network backend that resolves, checks and connects to the vetted IP itself, so a DNS
answer that changes in between (rebinding) cannot reach a private address. TLS still verifies, and
sends SNI for, the URL's host name. Only public httpx/httpcore APIs are used
(:class:`runtime.reply.http_pool.PoolTransport`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Iterable
from typing import Any, Literal, TypeAlias
from urllib.parse import urljoin, urlsplit

import certifi
import httpcore
import httpx

from runtime.reply.http_pool import PoolTransport

__all__ = ["REJECT_REASONS", "MediaRejected", "RejectReason", "check_address", "fetch_url"]

RejectReason: TypeAlias = Literal[
    "not_found",
    "outside_media_dir",
    "forbidden_address",
    "bad_url",
    "fetch_failed",
    "too_large",
    "type_mismatch",
    "unknown_type",
    "bad_base64",
    "empty",
    "bad_file_ref",
]
REJECT_REASONS: tuple[str, ...] = (
    "not_found", "outside_media_dir", "forbidden_address", "bad_url", "fetch_failed",
    "too_large", "type_mismatch", "unknown_type", "bad_base64", "empty", "bad_file_ref",
)  # fmt: skip
"""The bounded ``reason`` label values of ``sessionray_media_rejected_total`` (``bad_file_ref``: a
``file`` reference that is a URI or a file-system path, not a platform file id; ``bad_url`` also
counts a ``share`` link that is not http(s))."""


class MediaRejected(Exception):
    """An attachment cannot be used; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: RejectReason = reason
        self.detail = detail


# --------------------------------------------------------------------------- addresses


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _forbidden(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True unless ``ip`` is a globally routable unicast address. IPv4 carried inside an IPv6
    address (IPv4-mapped, 6to4, Teredo client, NAT64 well-known prefix) is checked as well."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded: list[ipaddress.IPv4Address] = []
        if ip.ipv4_mapped is not None:
            embedded.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            embedded.append(ip.sixtofour)
        if ip.teredo is not None:
            embedded.append(ip.teredo[1])
        if ip in _NAT64:
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if any(_forbidden(v4) for v4 in embedded):
            return True
        if ip.ipv4_mapped is not None:
            return False  # a mapped public IPv4 address is as public as the address itself
    return not ip.is_global or ip.is_multicast


async def _resolve_checked(host: str, port: int | None, *, exempt: bool) -> list[str]:
    """Resolve ``host`` (a literal IP needs no lookup) and refuse it unless every address is
    public or ``exempt``. Returns the address strings, in resolver order."""
    try:
        addresses = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise MediaRejected("fetch_failed", f"cannot resolve {host!r}: {exc}") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not exempt:
        for ip in addresses:
            if _forbidden(ip):
                raise MediaRejected("forbidden_address", f"{host!r} resolves to non-public address {ip}")
    return [str(ip) for ip in addresses]


async def check_address(url: str, *, allow_private: bool, allowed_hosts: Iterable[str] = ()) -> None:
    """Refuse ``url`` unless it is http(s) and every address its host resolves to is public.

    Literal IPs are checked without any lookup; names are resolved with the event loop's
    ``getaddrinfo``. Nothing is sent to the host. ``allow_private`` exempts every host;
    ``allowed_hosts`` exempts the listed host names / IP literals only.

    Raises:
        MediaRejected: ``bad_url`` (scheme/host), ``fetch_failed`` (name does not resolve),
            ``forbidden_address`` (loopback/private/link-local/… and not exempt).
    """
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", port out of range / not a number
        raise MediaRejected("bad_url", f"unparsable URL {url[:200]!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise MediaRejected("bad_url", f"only http(s) URLs with a host are fetched: {url[:200]!r}")
    exempt = allow_private or host in set(allowed_hosts)
    await _resolve_checked(host, port, exempt=exempt)


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore network backend that re-resolves and re-checks the host at connect time and then
    connects to the vetted IP itself, so a DNS answer that changes after :func:`check_address`
    (rebinding) cannot reach a private address. TLS still verifies the URL's host name."""

    def __init__(self, allow_private: bool, allowed_hosts: frozenset[str]) -> None:
        self._inner = httpcore.AnyIOBackend()
        self._allow_private, self._allowed_hosts = allow_private, allowed_hosts

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        exempt = self._allow_private or host in self._allowed_hosts
        ips = await _resolve_checked(host, port, exempt=exempt)
        last: Exception | None = None
        for ip in ips:  # every address is vetted; try them in resolver order
            try:
                return await self._inner.connect_tcp(ip, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None  # _resolve_checked never returns an empty list
        raise last

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise MediaRejected("bad_url", "unix sockets are never used for media")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _client(allow_private: bool, allowed_hosts: frozenset[str], timeout_s: float) -> httpx.AsyncClient:
    pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl.create_default_context(cafile=certifi.where()),
        network_backend=_GuardedBackend(allow_private, allowed_hosts),
        max_connections=4,
    )
    return httpx.AsyncClient(
        transport=PoolTransport(pool),
        timeout=timeout_s,
        follow_redirects=False,
        trust_env=False,
        headers={"Accept-Encoding": "identity"},
    )


async def fetch_url(
    url: str,
    limit: int,
    *,
    allow_private: bool = False,
    allowed_hosts: Iterable[str] = (),
    timeout_s: float = 15.0,
    max_redirects: int = 3,
) -> bytes:
    """GET ``url`` and return its body (at most ``limit`` bytes), refusing non-public addresses.

    Every hop (redirects are followed by hand, at most ``max_redirects``) is checked with
    :func:`check_address` before connecting and again at connect time by the guarded transport;
    the body is read raw (``Accept-Encoding: identity``; a compressed body is refused); the whole
    fetch, name resolution included, is bounded by ``timeout_s`` seconds.

    Args:
        url: An http(s) URL.
        limit: Maximum body size in bytes.
        allow_private: Exempt every host from the address rule (local development only).
        allowed_hosts: Host names / IP literals exempt from the address rule.
        timeout_s: Whole-fetch bound in seconds (also the per-operation httpx timeout).
        max_redirects: Redirect hops followed.

    Raises:
        MediaRejected: ``bad_url``, ``forbidden_address``, ``fetch_failed`` (HTTP status, network
            error, timeout, compressed body, too many redirects) or ``too_large``.
    """
    hosts = frozenset(allowed_hosts)
    try:
        async with asyncio.timeout(timeout_s):
            async with _client(allow_private, hosts, timeout_s) as client:
                return await _fetch_hops(client, url, limit, allow_private, hosts, max_redirects)
    except TimeoutError:
        raise MediaRejected(
            "fetch_failed", f"GET {url[:200]}: no complete answer within {timeout_s} s"
        ) from None


async def _fetch_hops(
    client: httpx.AsyncClient,
    url: str,
    limit: int,
    allow_private: bool,
    allowed_hosts: frozenset[str],
    max_redirects: int,
) -> bytes:
    for _ in range(max_redirects + 1):
        await check_address(url, allow_private=allow_private, allowed_hosts=allowed_hosts)
        try:
            async with client.stream("GET", url) as resp:
                if resp.is_redirect and "location" in resp.headers:
                    url = urljoin(url, resp.headers["location"])
                    continue
                return await _read_body(resp, url, limit)
        except httpx.InvalidURL as exc:
            raise MediaRejected("bad_url", f"{url[:200]!r}: {exc}") from None
        except ValueError as exc:  # urljoin of a malformed Location
            raise MediaRejected("bad_url", f"redirect from {url[:200]!r}: {exc}") from None
        except httpx.HTTPError as exc:
            raise MediaRejected("fetch_failed", f"GET {url[:200]}: {type(exc).__name__}: {exc}") from None
    raise MediaRejected("fetch_failed", f"more than {max_redirects} redirects")


async def _read_body(resp: httpx.Response, url: str, limit: int) -> bytes:
    if resp.status_code != 200:
        raise MediaRejected("fetch_failed", f"GET {url[:200]} -> HTTP {resp.status_code}")
    encoding = resp.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise MediaRejected("fetch_failed", f"GET {url[:200]}: compressed body ({encoding})")
    declared = resp.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise MediaRejected("too_large", f"{declared} bytes > limit {limit}")
    buf = bytearray()
    async for chunk in resp.aiter_raw():
        buf += chunk
        if len(buf) > limit:
            raise MediaRejected("too_large", f"more than {limit} bytes")
    return bytes(buf)

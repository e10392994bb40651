"""Outbound media checks for a validated :class:`~runtime.segments.Reply` (seed 000; issue #4 item 7).

Entry point: ``await check_reply_media(reply, policy, platform)`` → :class:`MediaCheckResult`
(the reply to send, plus the resolved bytes of every usable attachment, keyed by segment index).

Per ``media.kind``:

* ``url`` — fetched over HTTP(S) with ``httpx``. Before any connection, the host is resolved and
  *every* address is checked: loopback, private, link-local, multicast, reserved and unspecified
  addresses are refused unless ``MediaPolicy.allow_private_urls`` (DESIGN "Security"). Redirects
  are followed by hand (≤ ``max_redirects``), each hop checked the same way. The body is read in
  chunks and abandoned as soon as it passes the size limit.
* ``path`` — confined to ``MediaPolicy.media_dir``: a ``..`` part is refused outright, and the
  resolved path (symlinks followed) must stay inside the resolved media directory.
* ``base64`` — strictly decoded (no ``data:`` prefix, no stray characters).
* ``file`` — an opaque platform reference: its bytes live on the platform, the host cannot check
  them, so it passes through unchanged (seed 000).

Readable bytes are sniffed with the ``filetype`` library (magic numbers, never the file name or
the URL's extension) and must match the segment type (``image`` → ``image/*``, ``audio`` →
``audio/*``, ``video`` → ``video/*``; ``file`` accepts anything) and fit the platform's limit for
that segment type. An unusable attachment is replaced by a short text segment
(``MediaPolicy.unavailable_text``) and counted in ``sessionray_media_rejected_total{reason}``
with ``reason`` ∈ :data:`REJECT_REASONS`.

Known limit: the address check resolves the host name itself, then httpx resolves it again to
connect; a DNS answer that changes in between (rebinding) is not caught. Literal IP URLs are exact.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import logging
import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Literal, TypeAlias
from urllib.parse import urljoin, urlsplit

import certifi
import filetype
import httpcore
import httpx

from runtime import metrics
from runtime.segments import (
    AudioSegment,
    FileSegment,
    ImageSegment,
    Media,
    Reply,
    Segment,
    TextSegment,
    VideoSegment,
)

__all__ = [
    "DEFAULT_LIMITS",
    "PLATFORM_LIMITS",
    "REJECT_REASONS",
    "MediaCheckResult",
    "MediaPolicy",
    "MediaRejected",
    "RejectReason",
    "ResolvedMedia",
    "check_address",
    "check_reply_media",
    "resolve_media",
]

log = logging.getLogger(__name__)

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
]
REJECT_REASONS: tuple[str, ...] = (
    "not_found", "outside_media_dir", "forbidden_address", "bad_url", "fetch_failed",
    "too_large", "type_mismatch", "unknown_type", "bad_base64",
)  # fmt: skip
"""The bounded ``reason`` label values of ``sessionray_media_rejected_total``."""

MB = 1024 * 1024
DEFAULT_LIMITS: dict[str, int] = {"image": 10 * MB, "audio": 20 * MB, "video": 50 * MB, "file": 50 * MB}
"""Size limits in bytes per segment type for a platform without its own entry."""
PLATFORM_LIMITS: dict[str, dict[str, int]] = {
    # Telegram Bot API: photos up to 10 MB, other uploads up to 50 MB (multipart/form-data).
    "telegram": {"image": 10 * MB, "audio": 50 * MB, "video": 50 * MB, "file": 50 * MB},
    # OneBot 11 implementations differ; conservative defaults (override in MediaPolicy.limits).
    "onebot11": {"image": 10 * MB, "audio": 10 * MB, "video": 50 * MB, "file": 50 * MB},
    "console": {"image": 50 * MB, "audio": 50 * MB, "video": 200 * MB, "file": 200 * MB},
}
"""Default size limits in bytes per platform and segment type."""

_EXPECTED_PREFIX = {"image": "image/", "audio": "audio/", "video": "video/", "file": ""}


@dataclass
class MediaPolicy:
    """How outbound media is read and checked.

    Attributes:
        media_dir: Directory that ``path`` media must stay inside (``None``: ``path`` is refused).
        allow_private_urls: Allow ``url`` fetches to loopback/private/link-local addresses
            (local development only).
        allowed_hosts: Host names / IP literals exempt from the private-address rule (e.g. an
            internal media server), the others stay refused.
        limits: Per-platform overrides ``{platform: {segment_type: bytes}}`` over
            :data:`PLATFORM_LIMITS`.
        fetch_timeout_s: Whole-fetch timeout in seconds.
        max_redirects: Redirect hops followed (each re-checked).
        unavailable_text: Text of the replacement segment.
    """

    media_dir: Path | None = None
    allow_private_urls: bool = False
    allowed_hosts: frozenset[str] = frozenset()
    limits: dict[str, dict[str, int]] = field(default_factory=dict)
    fetch_timeout_s: float = 15.0
    max_redirects: int = 3
    unavailable_text: str = "[attachment unavailable]"

    def limit(self, platform: str, segment_type: str) -> int:
        """Return the size limit in bytes for ``segment_type`` on ``platform``."""
        table: Mapping[str, int] = (
            self.limits.get(platform) or PLATFORM_LIMITS.get(platform) or DEFAULT_LIMITS
        )
        return table.get(segment_type, DEFAULT_LIMITS[segment_type])


class MediaRejected(Exception):
    """An attachment cannot be used; ``reason`` is one of :data:`REJECT_REASONS`."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: RejectReason = reason
        self.detail = detail


@dataclass(frozen=True)
class ResolvedMedia:
    """A usable attachment.

    Attributes:
        segment_type: ``image`` | ``audio`` | ``video`` | ``file``.
        media: The original reference.
        data: The bytes (``None`` for ``kind == "file"``, which the platform holds).
        mime: Sniffed MIME type (``None`` for ``file`` refs and unknown bytes in a ``file`` segment).
        size: ``len(data)`` in bytes (``None`` for ``file`` refs).
    """

    segment_type: str
    media: Media
    data: bytes | None
    mime: str | None
    size: int | None


@dataclass
class MediaCheckResult:
    """Outcome of :func:`check_reply_media`.

    Attributes:
        reply: The reply to send (unusable attachments replaced by a text segment).
        attachments: Resolved media by segment index in ``reply``.
        rejected: ``(segment index, reason, detail)`` for each replaced attachment.
    """

    reply: Reply
    attachments: dict[int, ResolvedMedia] = field(default_factory=dict)
    rejected: list[tuple[int, str, str]] = field(default_factory=list)


# --------------------------------------------------------------------------- addresses


def _forbidden(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


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
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MediaRejected("bad_url", f"only http(s) URLs with a host are fetched: {url[:200]!r}")
    exempt = allow_private or parts.hostname in set(allowed_hosts)
    await _resolve_checked(parts.hostname, parts.port, exempt=exempt)


class _GuardedBackend(httpcore.AsyncNetworkBackend):
    """httpcore network backend that re-resolves and re-checks the host at connect time and then
    connects to the vetted IP itself, so a DNS answer that changes after :func:`check_address`
    (rebinding) cannot reach a private address. TLS still verifies the URL's host name."""

    def __init__(self, policy: MediaPolicy) -> None:
        self._inner = httpcore.AnyIOBackend()
        self._policy = policy

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        exempt = self._policy.allow_private_urls or host in self._policy.allowed_hosts
        ips = await _resolve_checked(host, port, exempt=exempt)
        return await self._inner.connect_tcp(ips[0], port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise MediaRejected("bad_url", "unix sockets are never used for media")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _client(policy: MediaPolicy) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    # route every connection through the guarded backend (httpx exposes no public hook for it)
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=ssl.create_default_context(cafile=certifi.where()),
        network_backend=_GuardedBackend(policy),
    )
    return httpx.AsyncClient(
        transport=transport, timeout=policy.fetch_timeout_s, follow_redirects=False, trust_env=False
    )


async def _fetch(url: str, limit: int, policy: MediaPolicy) -> bytes:
    async with _client(policy) as client:
        for _ in range(policy.max_redirects + 1):
            await check_address(
                url, allow_private=policy.allow_private_urls, allowed_hosts=policy.allowed_hosts
            )
            try:
                async with client.stream("GET", url) as resp:
                    if resp.is_redirect and "location" in resp.headers:
                        url = urljoin(url, resp.headers["location"])
                        continue
                    if resp.status_code != 200:
                        raise MediaRejected("fetch_failed", f"GET {url[:200]} -> HTTP {resp.status_code}")
                    declared = resp.headers.get("content-length")
                    if declared and declared.isdigit() and int(declared) > limit:
                        raise MediaRejected("too_large", f"{declared} bytes > limit {limit}")
                    buf = bytearray()
                    async for chunk in resp.aiter_bytes():
                        buf += chunk
                        if len(buf) > limit:
                            raise MediaRejected("too_large", f"more than {limit} bytes")
                    return bytes(buf)
            except httpx.HTTPError as exc:
                raise MediaRejected("fetch_failed", f"GET {url[:200]}: {type(exc).__name__}: {exc}") from None
    raise MediaRejected("fetch_failed", f"more than {policy.max_redirects} redirects")


# --------------------------------------------------------------------------- paths, base64


def _read_path(value: str, limit: int, policy: MediaPolicy) -> bytes:
    if policy.media_dir is None:
        raise MediaRejected("outside_media_dir", "no media directory is configured; path media is refused")
    if ".." in PurePosixPath(value).parts or ".." in PureWindowsPath(value).parts:
        raise MediaRejected("outside_media_dir", f"'..' in media path {value!r}")
    root = policy.media_dir.resolve()
    try:
        target = (root / value).resolve(strict=True)
    except (OSError, RuntimeError):
        raise MediaRejected("not_found", f"no such media file {value!r}") from None
    if not target.is_relative_to(root):
        raise MediaRejected("outside_media_dir", f"{value!r} resolves outside the media directory")
    if not target.is_file():
        raise MediaRejected("not_found", f"{value!r} is not a regular file")
    size = target.stat().st_size
    if size > limit:
        raise MediaRejected("too_large", f"{size} bytes > limit {limit}")
    return target.read_bytes()


def _decode_base64(value: str, limit: int) -> bytes:
    if len(value) // 4 * 3 > limit + 3:
        raise MediaRejected("too_large", f"about {len(value) // 4 * 3} bytes > limit {limit}")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaRejected("bad_base64", str(exc)) from None
    if len(data) > limit:
        raise MediaRejected("too_large", f"{len(data)} bytes > limit {limit}")
    return data


# --------------------------------------------------------------------------- entry points


async def resolve_media(segment_type: str, media: Media, policy: MediaPolicy, platform: str) -> ResolvedMedia:
    """Read, sniff and check one attachment.

    Args:
        segment_type: ``image`` | ``audio`` | ``video`` | ``file``.
        media: The reference from the segment.
        policy: Limits, media directory, private-address rule.
        platform: Platform name for the size limit (e.g. ``telegram``).

    Returns:
        The resolved attachment (``data``/``mime`` set unless ``kind == "file"``).

    Raises:
        MediaRejected: with a reason from :data:`REJECT_REASONS`.
    """
    if media.kind == "file":
        return ResolvedMedia(segment_type, media, None, None, None)
    limit = policy.limit(platform, segment_type)
    if media.kind == "url":
        data = await _fetch(media.value, limit, policy)
    elif media.kind == "path":
        data = await asyncio.to_thread(_read_path, media.value, limit, policy)
    else:
        data = _decode_base64(media.value, limit)
    if len(data) > limit:
        raise MediaRejected("too_large", f"{len(data)} bytes > limit {limit}")
    kind = filetype.guess(data)
    mime = kind.mime if kind is not None else None
    expected = _EXPECTED_PREFIX[segment_type]
    if expected:
        if mime is None:
            raise MediaRejected("unknown_type", f"bytes of a {segment_type} segment have no known type")
        if not mime.startswith(expected):
            raise MediaRejected("type_mismatch", f"{segment_type} segment holds {mime}")
    return ResolvedMedia(segment_type, media, data, mime, len(data))


async def check_reply_media(reply: Reply, policy: MediaPolicy, platform: str) -> MediaCheckResult:
    """Check every attachment of ``reply``; replace the unusable ones by a text segment.

    Returns:
        :class:`MediaCheckResult` — the reply to send (same order; each rejected attachment
        becomes ``TextSegment(policy.unavailable_text)``), resolved attachments by index, and the
        rejections. Each rejection increments ``MEDIA_REJECTED(reason)`` and logs a warning.
        Never raises for a bad attachment.
    """
    out: list[Segment] = []
    result = MediaCheckResult(reply=reply)
    for index, seg in enumerate(reply.segments):
        if isinstance(seg, ImageSegment | AudioSegment | VideoSegment | FileSegment):
            try:
                result.attachments[index] = await resolve_media(seg.type, seg.data.media, policy, platform)
            except MediaRejected as exc:
                metrics.MEDIA_REJECTED.inc(reason=exc.reason)
                log.warning("attachment %d (%s, %s) rejected: %s", index, seg.type, seg.data.media.kind, exc)
                result.rejected.append((index, exc.reason, exc.detail))
                out.append(TextSegment.of(policy.unavailable_text))
                continue
        out.append(seg)
    if result.rejected:
        result.reply = Reply(segments=out)
    return result

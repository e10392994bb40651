"""Outbound media checks for a validated :class:`~runtime.reply.segments.Reply`
(docs/decisions.md#security-media-bytes).

Entry point: ``await check_reply_media(reply, policy, platform)`` → :class:`MediaCheckResult`
(the reply to send, plus the resolved bytes of every usable attachment, keyed by segment index).

Per ``media.kind``:

* ``url`` — fetched by :func:`runtime.reply.media_fetch.fetch_url`: only globally routable addresses
  (checked before each hop and again at connect time, so decimal/octal IPv4 spellings, IPv4
  inside IPv6, redirects and DNS rebinding cannot reach loopback/private/link-local hosts) unless
  ``MediaPolicy.allow_private_urls`` / ``allowed_hosts``
  (docs/decisions.md#security-media-fetch-guard); the body is read raw (a compressed body is
  refused: no decompression bomb) and abandoned past the size limit; the whole fetch is bounded by
  ``fetch_timeout_s``.
* ``path`` — confined to ``MediaPolicy.media_dir``: a ``..`` part or a NUL is refused outright, an
  absolute path outside the directory is refused without touching the file system (no existence
  oracle), and the resolved path (symlinks followed) must stay inside the resolved media
  directory. The file is opened non-blocking without following a symlink and must be a regular
  file (a FIFO or device never blocks the reader); at most ``limit + 1`` bytes are read.
* ``base64`` — strictly decoded (no ``data:`` prefix, no stray characters).
* ``file`` — an opaque platform reference (a Telegram ``file_id``, a OneBot cached file name): its
  bytes live on the platform, the host cannot check them
  (docs/decisions.md#security-media-references), so it passes through unchanged — but only if it
  *is* a platform file id (:func:`file_ref_problem`): a value with a URI scheme (``file:``,
  ``http:``, ``base64:``, ``C:``…) or a file-system path (a ``/`` or ``\\`` anywhere, a leading
  ``~``, ``.``/``..``) or a control character is refused (``bad_file_ref``): OneBot implementations
  and a local Telegram Bot API server would read such a value from the host's disk or the network,
  bypassing ``media_dir`` and the address rule.

``share`` segments (link cards) are checked here too (the other URL rules live at this stage, and
the URL is never fetched by the host): only ``http``/``https`` URLs with a host pass
(:func:`share_url_problem`); any other (``javascript:``, ``data:``, ``file:``…) becomes the text
``"<title> [link unavailable]"`` and is counted as ``bad_url``.

Readable bytes are sniffed with the ``filetype`` library (magic numbers, never the file name or
the URL's extension) and must match the segment type (``image`` → ``image/*``, ``audio`` →
``audio/*``, ``video`` → ``video/*``; ``file`` accepts anything) and fit the platform's limit for
that segment type. An unusable attachment is replaced by a short text segment
(``MediaPolicy.unavailable_text``) and counted in ``sessionray_media_rejected_total{reason}``
with ``reason`` ∈ :data:`REJECT_REASONS`.

Zero-byte attachments are refused (``empty``): no platform accepts them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from urllib.parse import urlsplit

import filetype

from runtime import metrics
from runtime.reply.media_fetch import REJECT_REASONS, MediaRejected, RejectReason, check_address, fetch_url
from runtime.reply.segments import (
    AudioSegment,
    FileSegment,
    ImageSegment,
    Media,
    Reply,
    Segment,
    ShareSegment,
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
    "file_ref_problem",
    "refused_share_text",
    "resolve_media",
    "share_url_problem",
]

log = logging.getLogger(__name__)


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
        link_unavailable_text: Appended to a refused ``share`` link's title (its replacement text).
    """

    media_dir: Path | None = None
    allow_private_urls: bool = False
    allowed_hosts: frozenset[str] = frozenset()
    limits: dict[str, dict[str, int]] = field(default_factory=dict)
    fetch_timeout_s: float = 15.0
    max_redirects: int = 3
    unavailable_text: str = "[attachment unavailable]"
    link_unavailable_text: str = "[link unavailable]"

    def limit(self, platform: str, segment_type: str) -> int:
        """Return the size limit in bytes for ``segment_type`` on ``platform``."""
        table: Mapping[str, int] = (
            self.limits.get(platform) or PLATFORM_LIMITS.get(platform) or DEFAULT_LIMITS
        )
        return table.get(segment_type, DEFAULT_LIMITS[segment_type])


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


# --------------------------------------------------------------------------- paths, base64


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_path(value: str, limit: int, policy: MediaPolicy) -> bytes:
    if policy.media_dir is None:
        raise MediaRejected("outside_media_dir", "no media directory is configured; path media is refused")
    if "\x00" in value:
        raise MediaRejected("not_found", f"NUL character in media path {value[:200]!r}")
    if ".." in PurePosixPath(value).parts or ".." in PureWindowsPath(value).parts:
        raise MediaRejected("outside_media_dir", f"'..' in media path {value!r}")
    root = policy.media_dir.resolve()
    if Path(value).is_absolute() and not (
        Path(value).is_relative_to(policy.media_dir.absolute()) or Path(value).is_relative_to(root)
    ):  # refused before any file-system access: no "does it exist?" oracle outside the directory
        raise MediaRejected("outside_media_dir", f"{value!r} is outside the media directory")
    try:
        target = (root / value).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        raise MediaRejected("not_found", f"no such media file {value!r}") from None
    if not target.is_relative_to(root):
        raise MediaRejected("outside_media_dir", f"{value!r} resolves outside the media directory")
    try:
        fd = os.open(target, _OPEN_FLAGS)  # no symlink swapped in since resolve(); never blocks
    except OSError as exc:
        raise MediaRejected("not_found", f"cannot open media file {value!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a directory, FIFO, socket or device
            raise MediaRejected("not_found", f"{value!r} is not a regular file")
        if info.st_size > limit:
            raise MediaRejected("too_large", f"{info.st_size} bytes > limit {limit}")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)  # the file may grow after fstat
    finally:
        os.close(fd)
    if len(data) > limit:
        raise MediaRejected("too_large", f"more than {limit} bytes")
    return data


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


# --------------------------------------------------------------------------- references (no I/O)

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def file_ref_problem(value: str) -> str | None:
    """Why ``value`` is not usable as a ``file``-kind media reference, or ``None`` if it is.

    A ``file`` reference must be an opaque platform file id
    (docs/decisions.md#security-media-references), e.g. a Telegram ``file_id`` or a OneBot cached
    file name such as ``123.jpg``. Refused: an empty value, a control character (NUL included),
    leading/trailing whitespace, a URI scheme (``file:``, ``http:``, ``base64:``, a drive letter
    ``C:``…), and anything path-like (a ``/`` or ``\\`` anywhere, a leading ``~``, ``.`` or ``..``).
    A bare name without a separator cannot be told apart from a platform file name and passes.
    """
    if not value.strip():
        return "empty file reference"
    if _CONTROL.search(value):
        return "control character in file reference"
    if value != value.strip():
        return "leading or trailing whitespace in file reference"
    if _SCHEME.match(value):
        return f"file reference {value[:200]!r} has a URI scheme; only a platform file id is allowed"
    if "/" in value or "\\" in value or value.startswith("~") or value in (".", ".."):
        return f"file reference {value[:200]!r} is a file-system path; only a platform file id is allowed"
    return None


def share_url_problem(url: str) -> str | None:
    """Why ``url`` is not usable as a ``share`` link, or ``None`` if it is.

    Only ``http``/``https`` URLs with a host and without control characters or spaces pass
    (``javascript:``, ``data:``, ``file:``… would reach a client as a clickable link;
    docs/decisions.md#security-media-bytes). The host
    never fetches a share URL, so no address rule applies.
    """
    if _CONTROL.search(url) or " " in url:
        return "control character or space in share URL"
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:
        return f"unparsable share URL {url[:200]!r}: {exc}"
    if parts.scheme not in ("http", "https") or not host:
        return f"only http(s) share URLs with a host are sent: {url[:200]!r}"
    return None


def _link_text(seg: ShareSegment, policy: MediaPolicy) -> str:
    title = seg.data.title.strip()
    return f"{title} {policy.link_unavailable_text}" if title else policy.link_unavailable_text


def refused_share_text(platform: str, seg: ShareSegment, policy: MediaPolicy | None = None) -> str | None:
    """For a renderer: ``None`` when ``seg``'s URL may be sent (:func:`share_url_problem`), else
    count it (``MEDIA_REJECTED(reason="bad_url")``), log it and return its replacement text
    (``"<title> [link unavailable]"``). Normally :func:`check_reply_media` has already replaced such
    a link before a codec renders; this guards a render without that check."""
    problem = share_url_problem(seg.data.url)
    if problem is None:
        return None
    metrics.MEDIA_REJECTED.inc(reason="bad_url")
    log.warning("%s: share link rejected: %s", platform, problem)
    return _link_text(seg, policy or MediaPolicy())


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
        problem = file_ref_problem(media.value)
        if problem is not None:
            raise MediaRejected("bad_file_ref", problem)
        return ResolvedMedia(segment_type, media, None, None, None)
    limit = policy.limit(platform, segment_type)
    if media.kind == "url":
        data = await fetch_url(
            media.value,
            limit,
            allow_private=policy.allow_private_urls,
            allowed_hosts=policy.allowed_hosts,
            timeout_s=policy.fetch_timeout_s,
            max_redirects=policy.max_redirects,
        )
    elif media.kind == "path":
        data = await asyncio.to_thread(_read_path, media.value, limit, policy)
    else:
        data = _decode_base64(media.value, limit)
    if len(data) > limit:
        raise MediaRejected("too_large", f"{len(data)} bytes > limit {limit}")
    if not data:
        raise MediaRejected("empty", f"the {media.kind} attachment has no bytes")
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
    """Check every attachment and ``share`` link of ``reply``; replace the unusable ones by a text
    segment.

    Returns:
        :class:`MediaCheckResult` — the reply to send (same order; each rejected attachment
        becomes ``TextSegment(policy.unavailable_text)``, each refused share link
        ``TextSegment("<title> " + policy.link_unavailable_text)``), resolved attachments by index,
        and the rejections. Each rejection increments ``MEDIA_REJECTED(reason)`` (a share link:
        ``bad_url``) and logs a warning. Never raises for a bad attachment or link.
    """
    out: list[Segment] = []
    result = MediaCheckResult(reply=reply)
    for index, seg in enumerate(reply.segments):
        if isinstance(seg, ShareSegment) and (problem := share_url_problem(seg.data.url)) is not None:
            metrics.MEDIA_REJECTED.inc(reason="bad_url")
            log.warning("share link %d rejected: %s", index, problem)
            result.rejected.append((index, "bad_url", problem))
            out.append(TextSegment.of(_link_text(seg, policy)))
            continue
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

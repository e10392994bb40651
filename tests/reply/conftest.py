"""Fixtures for tests/reply: Prometheus counter deltas, a tiny real PNG, a fresh faux provider."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client import REGISTRY

from providers.faux import FauxProviderHandle, register_faux_provider, unregister_faux_provider
from runtime.reply.capability import CapabilityCache


def sample(name: str, **labels: str) -> float:
    """Current value of one Prometheus sample (0.0 when the series does not exist yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


class Deltas:
    """Snapshot of counters; ``delta(...)`` gives the increase since the snapshot."""

    def __init__(self) -> None:
        self._before: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def watch(self, name: str, **labels: str) -> None:
        self._before[(name, tuple(sorted(labels.items())))] = sample(name, **labels)

    def delta(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return sample(name, **labels) - self._before.get(key, 0.0)

    def structured(self) -> dict[tuple[str, str], float]:
        """Non-zero increases of sessionray_structured_replies_total as {(mode, outcome): n}."""
        return struct_deltas(self)

    def downgrades(self) -> dict[tuple[str, str], float]:
        """Non-zero increases of sessionray_structured_downgrades_total as {(from, to): n}."""
        return down_deltas(self)

    def media(self) -> dict[str, float]:
        """Non-zero increases of sessionray_media_rejected_total as {reason: n}."""
        out = {}
        for r in REASONS:
            v = self.delta(MEDIA, reason=r)
            if v:
                out[r] = v
        return out

    def leaks(self) -> dict[str, float]:
        """Non-zero increases of sessionray_leak_hits_total as {action: n}."""
        return {a: v for a in ("redact", "block") if (v := self.delta(LEAK, action=a))}


STRUCT = "sessionray_structured_replies_total"
DOWN = "sessionray_structured_downgrades_total"
MEDIA = "sessionray_media_rejected_total"
LEAK = "sessionray_leak_hits_total"

REASONS = (
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
)
MODES = ("native", "tool", "prompt")
OUTCOMES = ("first_try", "corrected", "default", "failed")


@contextmanager
def counting() -> Iterator[Deltas]:
    """Snapshot every structured/downgrade/media/leak series we assert on."""
    d = Deltas()
    for m in MODES:
        for o in OUTCOMES:
            d.watch(STRUCT, mode=m, outcome=o)
        for m2 in MODES:
            d.watch(DOWN, from_mode=m, to_mode=m2)
    for r in REASONS:
        d.watch(MEDIA, reason=r)
    for a in ("redact", "block"):
        d.watch(LEAK, action=a)
    yield d


def struct_deltas(d: Deltas) -> dict[tuple[str, str], float]:
    """All non-zero structured-reply counter increases, as {(mode, outcome): n}."""
    out = {}
    for m in MODES:
        for o in OUTCOMES:
            v = d.delta(STRUCT, mode=m, outcome=o)
            if v:
                out[(m, o)] = v
    return out


def down_deltas(d: Deltas) -> dict[tuple[str, str], float]:
    """All non-zero downgrade counter increases, as {(from, to): n}."""
    out = {}
    for m in MODES:
        for m2 in MODES:
            v = d.delta(DOWN, from_mode=m, to_mode=m2)
            if v:
                out[(m, m2)] = v
    return out


def png_bytes(width: int = 1, height: int = 1) -> bytes:
    """A real, minimal RGB PNG image."""

    def chunk(tag: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF)
        )

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


@pytest.fixture
def deltas() -> Iterator[Deltas]:
    """Counter snapshot taken at test start; assert ``deltas.structured()`` etc. (counters are
    cumulative across the session)."""
    with counting() as d:
        yield d


@pytest.fixture
def png() -> bytes:
    """A real 1x1 PNG."""
    return png_bytes()


_n = 0


@pytest.fixture
def faux() -> Iterator[FauxProviderHandle]:
    """A faux provider under a unique provider name (so the capability cache key is fresh)."""
    global _n
    _n += 1
    name = f"faux-structured-{_n}"
    handle = register_faux_provider(provider=name, models=["m"])
    yield handle
    unregister_faux_provider(name)


@pytest.fixture
def cache() -> CapabilityCache:
    """A fresh capability cache."""
    return CapabilityCache()


def _request_text(ctx: Any) -> str:
    parts = [ctx.system_prompt]
    for m in ctx.messages:
        c = getattr(m, "content", "")
        if isinstance(c, str):
            parts.append(c)
        else:
            parts.extend(getattr(b, "text", "") for b in c)
    return "\n".join(parts)


@pytest.fixture
def request_text() -> Any:
    """Function: all text of a recorded context (system prompt + message texts)."""
    return _request_text

"""Fixtures for tests/platforms: the platform API server, fixture loading, degradation counters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from runtime.reply.media import REJECT_REASONS
from runtime.reply.segments import SEGMENT_TYPES
from tests.platform_api_server import PlatformApiServer

DEGRADED = "sessionray_segments_degraded_total"
REJECTED = "sessionray_media_rejected_total"


class Degraded:
    """Snapshot of ``sessionray_segments_degraded_total``; :meth:`delta` = increases since then."""

    def __init__(self) -> None:
        self.before = self._now()

    @staticmethod
    def _now() -> dict[tuple[str, str], float]:
        out = {}
        for platform in ("onebot11", "telegram", "console"):
            for t in SEGMENT_TYPES:
                out[(platform, t)] = (
                    REGISTRY.get_sample_value(DEGRADED, {"platform": platform, "type": t}) or 0.0
                )
        return out

    def delta(self) -> dict[tuple[str, str], float]:
        """Non-zero increases as ``{(platform, type): n}``."""
        now = self._now()
        return {k: v - self.before[k] for k, v in now.items() if v != self.before[k]}


@pytest.fixture
def degraded() -> Degraded:
    """Counter snapshot taken at test start."""
    return Degraded()


class Rejected:
    """Snapshot of ``sessionray_media_rejected_total``; :meth:`delta` = increases since then."""

    def __init__(self) -> None:
        self.before = self._now()

    @staticmethod
    def _now() -> dict[str, float]:
        return {r: REGISTRY.get_sample_value(REJECTED, {"reason": r}) or 0.0 for r in REJECT_REASONS}

    def delta(self) -> dict[str, float]:
        """Non-zero increases as ``{reason: n}``."""
        now = self._now()
        return {k: v - self.before[k] for k, v in now.items() if v != self.before[k]}


@pytest.fixture
def rejected() -> Rejected:
    """Media-rejection counter snapshot taken at test start."""
    return Rejected()


@pytest.fixture
def load(fixtures_dir: Path) -> Any:
    """``load("onebot11/event_private_message_array.json")`` → raw bytes of a fixture."""

    def _load(rel: str) -> bytes:
        return (fixtures_dir / rel).read_bytes()

    return _load


@pytest.fixture
def load_json(load: Any) -> Any:
    """``load_json(rel)`` → the parsed fixture."""

    def _load_json(rel: str) -> Any:
        return json.loads(load(rel))

    return _load_json


@pytest.fixture
def api_server(fixtures_dir: Path) -> Iterator[PlatformApiServer]:
    """A running :class:`PlatformApiServer` (OneBot v11 + Telegram), stopped after the test."""
    with PlatformApiServer(fixtures_dir) as server:
        yield server

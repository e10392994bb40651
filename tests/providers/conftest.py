"""Fixtures of the provider tests: a fresh replay server per test and registered built-in apis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import providers.transport as transport
from providers import register_builtin_providers
from tests.providers.replay_server import ReplayServer


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    """A running :class:`ReplayServer` on 127.0.0.1 (stopped after the test)."""
    register_builtin_providers()
    with ReplayServer() as server:
        yield server


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record retry delays (seconds) instead of sleeping."""
    seen: list[float] = []

    async def fake_sleep(s: float) -> None:
        seen.append(s)

    monkeypatch.setattr(transport, "_sleep", fake_sleep)
    return seen

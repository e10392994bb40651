"""Fixtures of the provider tests: a fresh replay server per test and registered built-in apis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from providers import register_builtin_providers
from tests.providers.replay_server import ReplayServer


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    """A running :class:`ReplayServer` on 127.0.0.1 (stopped after the test)."""
    register_builtin_providers()
    with ReplayServer() as server:
        yield server

"""Fixtures of the agent-feature tests: a private Prometheus registry per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import prometheus_client
import pytest

from runtime import metrics


@pytest.fixture
def metric() -> Iterator[Callable[..., float]]:
    """``metric(name, **labels) -> value`` (0.0 when never recorded) on a fresh registry."""
    registry = prometheus_client.CollectorRegistry()
    previous = metrics.get_backend()
    metrics.set_backend(metrics.PrometheusBackend(registry))

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    try:
        yield value
    finally:
        metrics.set_backend(previous)

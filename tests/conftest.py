"""Shared fixtures: paths to the recorded fixtures, one local Ray instance per test session,
the PostgreSQL URL that `make test` exports (SESSIONRAY_TEST_PG_URL), and a private metrics
registry per test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import prometheus_client
import pytest

from runtime import metrics

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(os.environ.get("SESSIONRAY_FIXTURES", ROOT / "tests" / "fixtures"))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The read-only recorded payloads in tests/fixtures (never edited; sources in SOURCES.md)."""
    assert FIXTURES.is_dir(), f"fixtures not found at {FIXTURES} (SESSIONRAY_FIXTURES overrides it)"
    return FIXTURES


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """Start one local Ray instance for the whole test session (shut down at the end)."""
    import ray

    os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")
    # The console's internal endpoints: the same token in this process and in every Ray worker.
    os.environ.setdefault("SESSIONRAY_CONSOLE_API_TOKEN", "test-console-api-token")
    if not ray.is_initialized():
        ray.init(
            num_cpus=8,
            include_dashboard=False,
            logging_level="warning",
            runtime_env={
                "env_vars": {
                    "PYTHONPATH": str(ROOT),
                    "SESSIONRAY_CONSOLE_API_TOKEN": os.environ["SESSIONRAY_CONSOLE_API_TOKEN"],
                }
            },
        )
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def pg_url() -> str:
    """URL of the test PostgreSQL server; `make test`/`make pytest` start one (scripts/test-deps.sh).
    A bare `pytest` without it fails the PostgreSQL tests loudly rather than skip them."""
    url = os.environ.get("SESSIONRAY_TEST_PG_URL")
    if not url:
        pytest.fail(
            "SESSIONRAY_TEST_PG_URL is not set: run the tests with `make test` or `make pytest`, or\n"
            "  export SESSIONRAY_TEST_PG_URL=$(scripts/test-deps.sh --postgres-only)"
        )
    return url


@pytest.fixture
def metric() -> Iterator[Callable[..., float]]:
    """``metric(name, **labels) -> value`` (0.0 when never recorded) on a fresh registry, installed
    as the process's metrics backend for the test."""
    registry = prometheus_client.CollectorRegistry()
    previous = metrics.get_backend()
    metrics.set_backend(metrics.PrometheusBackend(registry))

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    try:
        yield value
    finally:
        metrics.set_backend(previous)

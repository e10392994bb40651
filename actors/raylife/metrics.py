"""A :mod:`runtime.metrics` backend on ``ray.util.metrics``, installed inside every actor.

Inside Ray actors the catalogue in :mod:`runtime.metrics` is recorded through Ray's metrics API:
each node's metrics agent exports the series (one scrape target per node). Ray prefixes every name
with ``ray_`` and adds a ``WorkerId`` label, so dashboards ``sum without (WorkerId)``.

Facts this module is built around (measured; docs/decisions.md#ops-ray-pitfalls):

* recording costs ≈ 2 µs; series appear after one report interval
  (``RAY_metrics_report_interval_ms``, 10 s by default);
* **undeclared tag keys are silently dropped**, so every metric is created with exactly the label
  names declared in the catalogue (``tag_keys``), and :mod:`runtime.metrics` already refuses
  calls whose label names differ;
* Ray's Prometheus exporter appends nothing to counter names, so a catalogue name such as
  ``sessionray_deliveries_total`` is exported as ``ray_sessionray_deliveries_total``.

Usage, at the top of an actor's ``__init__``::

    from actors.raylife.metrics import install_ray_metrics
    install_ray_metrics()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime import metrics

__all__ = ["RayMetricsBackend", "install_ray_metrics"]


class _RayMetric:
    """One ``ray.util.metrics`` object behind the ``record(value, labels, op)`` protocol."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric

    def record(self, value: float, labels: dict[str, str], op: str) -> None:
        """Apply ``op`` (inc | set | observe) with ``value`` to the series ``labels``."""
        tags = labels or None
        if op == "inc":
            self.metric.inc(value, tags=tags)
        elif op == "set":
            self.metric.set(value, tags=tags)
        else:
            self.metric.observe(value, tags=tags)


class RayMetricsBackend:
    """Creates ``ray.util.metrics`` Counter/Gauge/Histogram objects with declared tag keys.

    Implements :class:`runtime.metrics.MetricsBackend`. Histogram boundaries are the catalogue's
    buckets (seconds); Ray requires them strictly positive and increasing, which they are.
    """

    def make(self, kind: str, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Any:
        """Return a recorder for metric ``name`` of ``kind`` (counter | gauge | histogram).

        Raises:
            ValueError: ``kind`` is not one of the three.
        """
        from ray.util import metrics as ray_metrics

        tag_keys = tuple(labels) or None
        doc = doc.encode("ascii", "replace").decode("ascii")  # Ray's C++ layer rejects non-ASCII text
        if kind == "counter":
            return _RayMetric(ray_metrics.Counter(name, description=doc, tag_keys=tag_keys))
        if kind == "gauge":
            return _RayMetric(ray_metrics.Gauge(name, description=doc, tag_keys=tag_keys))
        if kind == "histogram":
            return _RayMetric(
                ray_metrics.Histogram(name, description=doc, boundaries=list(buckets), tag_keys=tag_keys)
            )
        raise ValueError(f"unknown metric kind {kind!r} for {name}")


_installed = False


def install_ray_metrics() -> None:
    """Route this process's :mod:`runtime.metrics` to Ray's metrics API (idempotent).

    Call at actor start (``__init__``). Calling it in the driver/ingress process would hide the
    ingress metrics from ``GET /metrics``; the ingress keeps prometheus-client.
    """
    global _installed
    if _installed:
        return
    metrics.set_backend(RayMetricsBackend())
    _installed = True

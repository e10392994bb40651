"""Per-step p50/p99 table from finished spans (docs/decisions.md#ops-traces), for ``make bench``.

Input: span records as :func:`runtime.tracing.sdk.span_record` makes them — what
:func:`runtime.tracing.records.read_spans` reads from ``tracing.spans_dir`` after a run with
``tracing.enabled``, or ``span_record`` of an in-memory exporter's spans. Output: one
:class:`StepRow` per span name (``webhook``, ``inbox.store``, ``submit``, ``activation``,
``host.accept``, ``turn``, ``llm.call``, ``tool``, ``reply.validate``, ``handoff``,
``delivery``, ``delivery.claim``, ``delivery.send``, ``delivery.close``, ``replay``), durations in
ms, sorted by name; :func:`format_table` prints it. Usage::

    from runtime.tracing.records import read_spans
    from tests.bench.trace_table import format_table, step_table
    print(format_table(step_table(read_spans(spans_dir))))
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from tests.bench.stats import pct

__all__ = ["StepRow", "format_table", "step_table"]


class StepRow(NamedTuple):
    """One step: how many spans, their p50 and p99 durations in ms (nearest rank)."""

    step: str
    count: int
    p50_ms: float
    p99_ms: float


def step_table(spans: Iterable[dict[str, Any]]) -> list[StepRow]:
    """Group ``spans`` by name; each group's duration p50/p99 in ms (spans without an end are
    left out)."""
    by_step: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        if s.get("end_ns") is not None and s.get("start_ns") is not None:
            by_step[s["name"]].append((s["end_ns"] - s["start_ns"]) / 1e6)
    return [StepRow(k, len(v), pct(v, 0.5), pct(v, 0.99)) for k, v in sorted(by_step.items())]


def format_table(rows: Sequence[StepRow]) -> str:
    """A fixed-width table: step, n, p50 ms, p99 ms."""
    lines = [f"{'step':<20} {'n':>6} {'p50 ms':>10} {'p99 ms':>10}"]
    lines += [f"{r.step:<20} {r.count:>6} {r.p50_ms:>10.2f} {r.p99_ms:>10.2f}" for r in rows]
    return "\n".join(lines)

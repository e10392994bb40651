"""Reading finished spans back: the JSON-lines files of :class:`runtime.tracing.sdk.JsonlExporter`
and a message's timeline (``sessionray trace``, the bench's per-step table).

A span record is the dict of :func:`runtime.tracing.sdk.span_record` (ids in hex, times in Unix
ns). Nothing of OpenTelemetry is imported here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["TimelineRow", "format_timeline", "read_spans", "timeline", "trace_of"]


def read_spans(spans_dir: str | Path) -> list[dict[str, Any]]:
    """Every span record in ``spans_dir``'s ``spans-*.jsonl`` files (a line that is not a JSON
    object — e.g. one cut off by a crash — is skipped). A missing directory has none."""
    out: list[dict[str, Any]] = []
    for path in sorted(Path(spans_dir).glob("spans-*.jsonl")):
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and "trace_id" in record:
                    out.append(record)
    return out


def trace_of(spans: Iterable[dict[str, Any]], ident: str) -> list[dict[str, Any]]:
    """The spans of the traces of message or reply ``ident`` (a span with attribute
    ``message_id`` or ``reply_id`` equal to it), plus the traces of its replays (a span linking to
    one of them), sorted by start time."""
    spans = list(spans)
    traces = {
        s["trace_id"]
        for s in spans
        if ident in (s.get("attributes", {}).get("message_id"), s.get("attributes", {}).get("reply_id"))
    }
    linked = {s["trace_id"] for s in spans for link in s.get("links", []) if link.get("trace_id") in traces}
    traces |= linked
    return sorted((s for s in spans if s["trace_id"] in traces), key=lambda s: (s["start_ns"], s["end_ns"]))


class TimelineRow(NamedTuple):
    """One step of a timeline: ``start_ms`` after the first step's start, ``duration_ms``;
    ``depth``: how many ancestors it has among the steps shown."""

    step: str
    process: str
    start_ms: float
    duration_ms: float
    depth: int


def timeline(spans: Sequence[dict[str, Any]]) -> list[TimelineRow]:
    """``spans`` (as :func:`trace_of` returns them) as rows, in start order."""
    if not spans:
        return []
    t0 = min(s["start_ns"] for s in spans)
    parent = {s["span_id"]: s.get("parent_id") for s in spans}

    def depth(span_id: str | None) -> int:
        n = 0
        while span_id is not None and parent.get(span_id) in parent:
            span_id, n = parent[span_id], n + 1
        return n

    return [
        TimelineRow(
            step=s["name"],
            process=str(s.get("process") or "?"),
            start_ms=(s["start_ns"] - t0) / 1e6,
            duration_ms=(s["end_ns"] - s["start_ns"]) / 1e6,
            depth=depth(s["span_id"]),
        )
        for s in spans
    ]


def format_timeline(rows: Sequence[TimelineRow]) -> str:
    """A fixed-width table: step (indented by depth), process, start offset ms, duration ms."""
    lines = [f"{'step':<32} {'process':<10} {'start ms':>10} {'duration ms':>12}"]
    for r in rows:
        name = "  " * r.depth + r.step
        lines.append(f"{name:<32} {r.process:<10} {r.start_ms:>10.1f} {r.duration_ms:>12.1f}")
    return "\n".join(lines)

"""The OpenTelemetry SDK set-up of a process with tracing on (imported only then).

Where spans go (docs/decisions.md#ops-traces):

* ``tracing.otlp_endpoint`` set: OTLP/HTTP protobuf to that URL (e.g.
  ``http://collector:4318/v1/traces``), batched; needs the ``otlp`` extra
  (``pip install 'sessionray[otlp]'``);
* else one JSON line per finished span in ``<tracing.spans_dir>/spans-<process>-<pid>.jsonl``
  (:class:`JsonlExporter`; read back by :mod:`runtime.tracing.records` and ``sessionray trace``).

Sampling is decided once per trace at its root (``TraceIdRatioBased(sample_ratio)``) and followed
by every child, in every process (the ``traceparent`` flags carry it).
"""

from __future__ import annotations

import atexit
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["JsonlExporter", "context_of", "install", "link_of", "span_record", "traceparent_of"]

_PROPAGATOR = TraceContextTextMapPropagator()
EXPORT_DELAY_MS = 500
"""How long finished spans wait at most before a batch is exported, in ms."""


def install(settings: Any, process: str, *, exporter: SpanExporter | None = None) -> TracerProvider:
    """A tracer provider for this process, its own (not the global one), with the sampler of
    ``settings.sample_ratio`` and the exporter the settings name; flushed at exit.

    Args:
        settings: The ``tracing`` section (``otlp_endpoint``, ``sample_ratio``, ``spans_dir``).
        process: The process kind (``ingress`` | ``router`` | ``host`` | ``delivery`` | ...), the
            resource attribute ``sessionray.process`` of every span.
        exporter: Use this one, exporting each span as it ends (tests: the SDK's
            ``InMemorySpanExporter``).

    Raises:
        RuntimeError: ``otlp_endpoint`` is set but the OTLP exporter is not installed.
    """
    resource = Resource.create(
        {"service.name": "sessionray", "sessionray.process": process, "process.pid": os.getpid()}
    )
    ratio = float(getattr(settings, "sample_ratio", 1.0))
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        provider.add_span_processor(
            BatchSpanProcessor(_exporter(settings, process), schedule_delay_millis=EXPORT_DELAY_MS)
        )
    atexit.register(provider.shutdown)
    return provider


def _exporter(settings: Any, process: str) -> SpanExporter:
    endpoint = getattr(settings, "otlp_endpoint", None)
    if endpoint:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise RuntimeError(
                "tracing.otlp_endpoint needs the OTLP exporter: pip install 'sessionray[otlp]'"
            ) from exc
        return OTLPSpanExporter(endpoint=endpoint)
    spans_dir = Path(getattr(settings, "spans_dir", None) or "./data/traces")
    return JsonlExporter(spans_dir / f"spans-{process}-{os.getpid()}.jsonl")


class JsonlExporter(SpanExporter):
    """Appends one JSON object per span (:func:`span_record`) to ``path`` (its directory is made)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s), ensure_ascii=False) + "\n" for s in spans)
        try:
            with self._lock:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(lines)
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as a JSON-able dict: ``trace_id``/``span_id``/``parent_id`` (hex; parent
    None for a root), ``name``, ``process``, ``start_ns``/``end_ns`` (Unix ns), ``attributes``,
    ``events`` (``name``, ``time_ns``, ``attributes``), ``links`` (``trace_id``, ``span_id``)."""
    ctx = span.get_span_context()
    parent = span.parent
    return {
        "trace_id": f"{ctx.trace_id:032x}" if ctx is not None else None,
        "span_id": f"{ctx.span_id:016x}" if ctx is not None else None,
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "name": span.name,
        "process": span.resource.attributes.get("sessionray.process"),
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "attributes": dict(span.attributes or {}),
        "events": [
            {"name": e.name, "time_ns": e.timestamp, "attributes": dict(e.attributes or {})}
            for e in span.events
        ],
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
    }


def context_of(parent: str) -> Any:
    """The OpenTelemetry context whose remote parent is the ``traceparent`` string ``parent`` (an
    empty context when it is malformed: the step then starts a new trace)."""
    return _PROPAGATOR.extract({"traceparent": parent})


def link_of(tp: str) -> trace.Link | None:
    """A span link to the span of ``tp`` (None when it is malformed)."""
    ctx = trace.get_current_span(context_of(tp)).get_span_context()
    return trace.Link(ctx) if ctx.is_valid else None


def traceparent_of(span: Any) -> str | None:
    """``span``'s W3C ``traceparent`` (None for an invalid, e.g. non-recording root, span)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

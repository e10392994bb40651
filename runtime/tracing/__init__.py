"""Traces of every step of a message (OpenTelemetry), zero cost when off.

One trace per inbound message, across processes (docs/decisions.md#ops-traces): the ingress opens
the root span ``webhook``; the message carries its W3C ``traceparent`` string
(``"00-<32 hex trace id>-<16 hex span id>-<2 hex flags>"``) through Ray calls and in its inbox
row, and each process opens its steps' spans as children of it. Inside one process the current
span travels in :mod:`contextvars` (asyncio tasks inherit it), so a step only names itself.

Off (the default, ``tracing.enabled: false``) nothing of OpenTelemetry is imported and
:func:`span` returns one shared do-nothing object: the cost of a step is a function call and a
module-global test (measured in docs/operations.md, "Tracing"). On, :func:`configure` (in
:mod:`runtime.tracing.sdk`) installs the SDK's tracer provider for the process.

Usage::

    from runtime import tracing
    with tracing.span("inbox.store", message_id=mid) as step:
        ...
        step.set(outcome="stored")
    parent = tracing.traceparent()  # the current step, to hand to another process (or None)

This module imports nothing of ours (a leaf, like :mod:`runtime.metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "NOOP",
    "Step",
    "configure",
    "enabled",
    "event",
    "flush",
    "past_span",
    "reset",
    "span",
    "traceparent",
]

_state: dict[str, Any] = {"on": False, "tracer": None, "provider": None}
"""``on``: spans are made; ``tracer`` / ``provider``: the process's OpenTelemetry tracer and
tracer provider (None when off)."""


class Step:
    """A step's span as a context manager (what :func:`span` returns when tracing is on)."""

    __slots__ = ("_attrs", "_cm", "_links", "_name", "_parent", "_span", "_start_ns")

    def __init__(
        self,
        name: str,
        parent: str | None,
        links: Sequence[str],
        attrs: dict[str, Any],
        start_ns: int | None = None,
    ) -> None:
        self._name, self._parent, self._links, self._attrs = name, parent, links, attrs
        self._start_ns = start_ns
        self._span: Any = None
        self._cm: Any = None

    def __enter__(self) -> Step:
        from opentelemetry import trace

        from runtime.tracing.sdk import context_of, link_of

        links = [link for link in (link_of(tp) for tp in self._links) if link is not None]
        ctx = context_of(self._parent) if self._parent else None
        attrs = {k: v for k, v in self._attrs.items() if v is not None}
        self._span = _state["tracer"].start_span(
            self._name, context=ctx, links=links, attributes=attrs, start_time=self._start_ns
        )
        self._cm = trace.use_span(self._span, end_on_exit=True)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)

    def set(self, **attrs: Any) -> None:
        """Set attributes on the span (None values are left out)."""
        self._span.set_attributes({k: v for k, v in attrs.items() if v is not None})

    def event(self, name: str, **attrs: Any) -> None:
        """Add a timed event (e.g. ``first_token``) to the span."""
        self._span.add_event(name, {k: v for k, v in attrs.items() if v is not None})

    def traceparent(self) -> str | None:
        """This span's W3C ``traceparent``."""
        from runtime.tracing.sdk import traceparent_of

        return traceparent_of(self._span)


class _Noop:
    """The step of a process without tracing: every call does nothing."""

    __slots__ = ()

    def __enter__(self) -> _Noop:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def set(self, **attrs: Any) -> None:
        return None

    def event(self, name: str, **attrs: Any) -> None:
        return None

    def traceparent(self) -> str | None:
        return None


NOOP = _Noop()
"""The one do-nothing step (tracing off)."""


def span(
    name: str,
    *,
    parent: str | None = None,
    links: Sequence[str] = (),
    start_ns: int | None = None,
    **attrs: Any,
) -> Step | _Noop:
    """A context manager timing one step as a span named ``name`` (``area.step``, e.g.
    ``delivery.send``) with ``attrs`` (str/int/float/bool; None left out).

    Args:
        parent: A ``traceparent`` from another process (the step continues that trace); None:
            the current span of this task, or a new trace when there is none.
        links: ``traceparent`` strings of related spans (a replayed message links its first
            attempt); malformed ones are left out.
        start_ns: When the step began (``time.time_ns()``), for a step whose first part ran
            before its trace was known (:func:`past_span`); None: now.
    """
    if not _state["on"]:
        return NOOP
    return Step(name, parent, links, attrs, start_ns)


def past_span(name: str, start_ns: int, end_ns: int, **attrs: Any) -> None:
    """Record a step that already ran, from ``start_ns`` to ``end_ns`` (``time.time_ns()``), as a
    finished child of the current span: a step done before its trace was known (a delivery
    actor reads the chat's queue, and learns a reply's trace from its row).
    Nothing when tracing is off."""
    if not _state["on"]:
        return
    attributes = {k: v for k, v in attrs.items() if v is not None}
    _state["tracer"].start_span(name, attributes=attributes, start_time=start_ns).end(end_time=end_ns)


def traceparent() -> str | None:
    """The current span's W3C ``traceparent`` (None when tracing is off or no span is current)."""
    if not _state["on"]:
        return None
    from opentelemetry import trace

    from runtime.tracing.sdk import traceparent_of

    return traceparent_of(trace.get_current_span())


def event(name: str, **attrs: Any) -> None:
    """Add an event to the current span (nothing when tracing is off)."""
    if not _state["on"]:
        return
    from opentelemetry import trace

    trace.get_current_span().add_event(name, {k: v for k, v in attrs.items() if v is not None})


def enabled() -> bool:
    """Whether this process makes spans."""
    return bool(_state["on"])


def configure(settings: Any, process: str, *, exporter: Any = None) -> bool:
    """Turn tracing on for this process when ``settings.enabled`` (a ``tracing`` config section, or
    None: off); returns whether it is on. Idempotent: a second call keeps the first set-up.
    See :func:`runtime.tracing.sdk.install` for ``process`` and ``exporter``."""
    if _state["on"] or settings is None or not getattr(settings, "enabled", False):
        return bool(_state["on"])
    from runtime.tracing.sdk import install

    provider = install(settings, process, exporter=exporter)
    _state["provider"], _state["tracer"] = provider, provider.get_tracer("sessionray")
    _state["on"] = True
    return True


def flush(timeout_ms: int = 5000) -> bool:
    """Export the spans finished so far now (True when all went, or tracing is off)."""
    provider = _state["provider"]
    return True if provider is None else bool(provider.force_flush(timeout_ms))


def reset() -> None:
    """Tracing off again in this process: the spans finished so far are exported, the exporter
    is shut down (tests; ``configure`` may then set it up anew)."""
    provider = _state["provider"]
    _state["on"], _state["tracer"], _state["provider"] = False, None, None
    if provider is not None:
        provider.shutdown()

"""Every sessionray metric, declared once, recorded through a swappable backend.

``runtime`` code records metrics without knowing where it runs: in the driver/ingress process the
default backend is prometheus-client's default registry (scraped at ``GET /metrics``); inside Ray
actors, ``actors`` installs a backend built on ``ray.util.metrics`` (exported by each node's
metrics agent, which prefixes names with ``ray_`` and adds a ``WorkerId`` label).

Naming follows Prometheus conventions (``sessionray_`` prefix, ``_total`` counters, ``_seconds``
and ``_bytes`` units). Label values are bounded sets (platform, api, outcome, tier, reason) —
never a session key, user id or free text.

Usage::

    from runtime import metrics
    metrics.STRUCTURED_REPLIES.inc(mode="native", outcome="first_try")
    metrics.TURN_LATENCY.observe(0.42, platform="console")
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # imported where used: Ray actors record through ray.util.metrics and never need it
    import prometheus_client

__all__ = [
    "ALL_METRICS",
    "Counter",
    "Gauge",
    "Histogram",
    "MetricsBackend",
    "PrometheusBackend",
    "set_backend",
]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class MetricsBackend(Protocol):
    """Creates the concrete metric objects; one instance per process."""

    def make(self, kind: str, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Any:
        """Return an object with ``record(value, labels: dict[str, str])`` for ``kind``
        ∈ counter | gauge_set | gauge_inc | histogram (one object per metric)."""
        ...


class _PromMetric:
    def __init__(self, metric: Any, kind: str, labels: Sequence[str]) -> None:
        self.metric, self.kind, self.labels = metric, kind, tuple(labels)

    def record(self, value: float, labels: dict[str, str], op: str) -> None:
        m = self.metric.labels(**labels) if self.labels else self.metric
        if op == "inc":
            m.inc(value)
        elif op == "set":
            m.set(value)
        else:
            m.observe(value)


class PrometheusBackend:
    """prometheus-client objects in ``registry`` (default: the process-wide default registry)."""

    def __init__(self, registry: prometheus_client.CollectorRegistry | None = None) -> None:
        self._registry = registry
        self._made: dict[str, Any] = {}

    @property
    def registry(self) -> prometheus_client.CollectorRegistry:
        """The registry the metrics live in (prometheus-client's default one unless given)."""
        if self._registry is None:
            import prometheus_client

            self._registry = prometheus_client.REGISTRY
        return self._registry

    def make(self, kind: str, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Any:
        # A backend put back with set_backend(previous) must reuse its collectors: registering the
        # same name twice in one registry raises DuplicateTimeseries.
        if name in self._made:
            return self._made[name]
        self._made[name] = made = self._create(kind, name, doc, labels, buckets)
        return made

    def _create(self, kind: str, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]) -> Any:
        import prometheus_client

        cls: Any
        kwargs: dict[str, Any] = {"registry": self.registry}
        if kind == "counter":
            cls = prometheus_client.Counter
            name = name.removesuffix("_total")
        elif kind == "gauge":
            cls = prometheus_client.Gauge
        else:
            cls = prometheus_client.Histogram
            kwargs["buckets"] = buckets
        return _PromMetric(cls(name, doc, labelnames=list(labels), **kwargs), kind, labels)


_lock = threading.Lock()
_backend: MetricsBackend = PrometheusBackend()
_generation = 0


def set_backend(backend: MetricsBackend) -> None:
    """Route every metric recorded from now on in this process to ``backend``."""
    global _backend, _generation
    with _lock:
        _backend = backend
        _generation += 1


def get_backend() -> MetricsBackend:
    """Return the backend in force in this process."""
    return _backend


class _Metric:
    kind = ""

    def __init__(
        self, name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] = ()
    ) -> None:
        self.name, self.doc, self.labels, self.buckets = name, doc, tuple(labels), tuple(buckets)
        self._impl: Any = None
        self._gen = -1
        ALL_METRICS.append(self)

    def _get(self) -> Any:
        if self._gen != _generation:
            with _lock:
                if self._gen != _generation:
                    self._impl = _backend.make(self.kind, self.name, self.doc, self.labels, self.buckets)
                    self._gen = _generation
        return self._impl

    def _labels(self, labels: dict[str, str]) -> dict[str, str]:
        if set(labels) != set(self.labels):
            raise ValueError(f"{self.name} takes labels {self.labels}, got {tuple(labels)}")
        return {k: str(v) for k, v in labels.items()}


class Counter(_Metric):
    """A monotonically increasing count (name ends in ``_total``)."""

    kind = "counter"

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` (≥ 0) to the series selected by ``labels``.

        Raises:
            ValueError: the label names differ from the declared ones.
        """
        self._get().record(amount, self._labels(labels), "inc")


class Gauge(_Metric):
    """A value that goes up and down (live sessions, pool size)."""

    kind = "gauge"

    def set(self, value: float, **labels: str) -> None:
        """Set the series to ``value``."""
        self._get().record(value, self._labels(labels), "set")


class Histogram(_Metric):
    """A distribution of observations (latencies in seconds, sizes in bytes)."""

    kind = "histogram"

    def __init__(
        self, name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] = LATENCY_BUCKETS
    ):
        super().__init__(name, doc, labels, buckets)

    def observe(self, value: float, **labels: str) -> None:
        """Record one observation."""
        self._get().record(value, self._labels(labels), "observe")


ALL_METRICS: list[_Metric] = []

# --------------------------------------------------------------------------- the catalogue
# Ingress (prometheus-client in the ingress process)
INBOUND = Counter(
    "sessionray_inbound_messages_total",
    "Inbound platform events by outcome (accepted, duplicate, queued, ignored, untriggered, "
    "bad_signature, malformed, backpressure, unavailable, error).",
    ("platform", "outcome"),
)
HTTP_REQUESTS = Counter(
    "sessionray_http_requests_total",
    "Ingress HTTP requests by route template and status.",
    ("route", "status"),
)
ONEBOT_WS_CONNECTED = Gauge(
    "sessionray_onebot_ws_connected",
    "1 while this ingress process holds an open OneBot WebSocket of the bot, else 0 (bots with "
    "transport ws-reverse or ws-forward; bot is the configured self_id).",
    ("bot",),
)
ONEBOT_WS_RESUBMITS = Counter(
    "sessionray_onebot_ws_resubmits_total",
    "OneBot WebSocket events answered busy/unavailable and submitted again in the background, by "
    "outcome (retry: one more attempt, done, gave_up, overflow: too many waiting).",
    ("outcome",),
)
HTTP_LATENCY = Histogram("sessionray_http_request_duration_seconds", "Ingress request latency.", ("route",))
# Sessions, pool (router level)
LIVE_SESSIONS = Gauge("sessionray_live_sessions", "Live sessions (each a SessionCore in a SessionHost).")
HOSTS = Gauge("sessionray_hosts", "Session hosts running (SessionHost actors).")
HOST_LIVE_SESSIONS = Gauge(
    "sessionray_host_live_sessions", "Live sessions of one session host, by its slot index.", ("host",)
)
HOST_MEMORY = Gauge(
    "sessionray_host_memory_bytes", "Unique set size (USS) of one session host process, in bytes.", ("host",)
)
ACTIVATIONS = Counter(
    "sessionray_activations_total",
    "Session activations by source (host; cold: a host created for it).",
    ("source",),
)
ACTIVATION_LATENCY = Histogram(
    "sessionray_activation_latency_seconds", "Time to load a session into a host.", ("source",)
)
PASSIVATIONS = Counter(
    "sessionray_passivations_total",
    "Session passivations by reason (idle, lru, memory, admin, shutdown).",
    ("reason",),
)
HOSTS_CREATED_ON_DEMAND = Counter(
    "sessionray_hosts_cold_total", "Session hosts created while an activation waited (no host had room)."
)
# Turns and the agent
TURNS = Counter(
    "sessionray_turns_total", "Agent turns by outcome (ok, error, aborted).", ("platform", "outcome")
)
TURN_LATENCY = Histogram(
    "sessionray_turn_latency_seconds", "Inbound accepted to reply handed to delivery.", ("platform",)
)
COALESCED_BATCH = Histogram(
    "sessionray_coalesced_batch_size",
    "Messages one turn of a coalescing chat answered (1: a message alone; "
    "docs/decisions.md#session-hot-chat-coalescing).",
    ("platform",),
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
)
BUSY_NOTICES = Counter(
    "sessionray_busy_notices_total",
    "Messages over a coalescing chat's queue, by outcome (sent: the busy notice went out; "
    "suppressed: the chat had one within busy_notice_interval_s).",
    ("platform", "outcome"),
)
CONTROL = Counter(
    "sessionray_control_total", "steer / follow_up / abort requests by outcome.", ("kind", "outcome")
)
TOOL_CALLS = Counter(
    "sessionray_tool_calls_total", "Tool executions by outcome (ok, error, blocked).", ("outcome",)
)
# LLM
LLM_REQUESTS = Counter("sessionray_llm_requests_total", "LLM calls by api and outcome.", ("api", "outcome"))
LLM_TOKENS = Counter(
    "sessionray_llm_tokens_total",
    "Tokens by api, kind (input, output, cache_read, cache_write) and model (provider/id as configured).",
    ("api", "kind", "model"),
)
LLM_COST = Counter(
    "sessionray_llm_cost_usd_total", "USD spent on LLM calls (models[].cost prices), by model.", ("model",)
)
QUOTA_EXCEEDED = Counter(
    "sessionray_quota_exceeded_total",
    "Turns refused before they started because a quota was used up, by scope (user, chat, bot, global).",
    ("scope",),
)
USAGE_LEDGER_FAILURES = Counter(
    "sessionray_usage_ledger_failures_total", "LLM calls whose usage row could not be written."
)
LLM_ERRORS = Counter("sessionray_llm_errors_total", "LLM errors by api and reason.", ("api", "reason"))
LLM_RETRIES = Counter("sessionray_llm_retries_total", "LLM transport retries before first content.", ("api",))
LLM_CONTEXT_TOKENS = Histogram(
    "sessionray_llm_context_tokens",
    "Estimated input tokens of each agent LLM call (system prompt, tools, summary, history window, "
    "current turn; the calibrated estimate of docs/decisions.md#agent-context-budget), by model "
    "(provider/id from the configuration).",
    ("model",),
    buckets=(250, 500, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000),
)
LLM_HISTORY_LEFT_OUT = Counter(
    "sessionray_llm_history_left_out_total",
    "History messages left out of agent LLM calls by the context budget (they stay in SQL), by model.",
    ("model",),
)
LLM_CONTEXT_OVER_BUDGET = Counter(
    "sessionray_llm_context_over_budget_total",
    "Agent LLM calls whose system prompt, tools, summary and current turn alone exceeded the context "
    "budget (sent anyway, with no history), by model.",
    ("model",),
)
# Structured replies (every outcome counted: docs/decisions.md#structured-every-outcome-counted)
STRUCTURED_REPLIES = Counter(
    "sessionray_structured_replies_total",
    "Structured outputs by mode (native, tool, prompt) and outcome (first_try, corrected, default, failed).",
    ("mode", "outcome"),
)
STRUCTURED_DOWNGRADES = Counter(
    "sessionray_structured_downgrades_total",
    "Capability downgrades (native to tool to prompt).",
    ("from_mode", "to_mode"),
)
STRUCTURED_SINK = Counter(
    "sessionray_structured_sink_total",
    "Validated custom-schema answers handed to a sink (url, transcript), by outcome (delivered, failed).",
    ("sink", "outcome"),
)
MEDIA_REJECTED = Counter(
    "sessionray_media_rejected_total", "Attachments replaced by a notice, by reason.", ("reason",)
)
LEAKS = Counter(
    "sessionray_leak_hits_total", "Outbound strings that matched a secret, by action.", ("action",)
)
SEGMENTS_DEGRADED = Counter(
    "sessionray_segments_degraded_total",
    "Segments a platform cannot send, degraded to text.",
    ("platform", "type"),
)
# Delivery
DELIVERIES = Counter(
    "sessionray_deliveries_total",
    "Replies by final state (ok, failed, uncertain) and replays of a final one (duplicate).",
    ("platform", "outcome"),
)
DELIVERY_FAILURES = Counter(
    "sessionray_delivery_failures_total",
    "Replies that ended failed, by reason (expired: older than delivery.max_age_s; rejected: a "
    "non-retryable platform answer; unconfigured: no such bot).",
    ("platform", "reason"),
)
DELIVERY_UNCERTAIN_STEPS = Counter(
    "sessionray_delivery_uncertain_steps_total",
    "Platform calls that may or may not have arrived (on the wire when their sender died, or "
    "written and never answered); not resent unless an operator retries.",
    ("platform",),
)
DELIVERY_BACKLOG = Gauge(
    "sessionray_delivery_backlog",
    "Replies in the delivery ledger by state (queued, pending, failed, uncertain), per delivery actor.",
    ("state",),
)
DELIVERY_LATENCY = Histogram(
    "sessionray_delivery_latency_seconds", "Platform API send latency.", ("platform",)
)
DELIVERY_RETRIES = Counter("sessionray_delivery_retries_total", "Platform send retries.", ("platform",))
# Memory
COMPACTIONS = Counter(
    "sessionray_compactions_total", "Context compactions by outcome (ok, failed).", ("outcome",)
)
# Agent features
TOOL_POLICY_BLOCKS = Counter(
    "sessionray_tool_policy_blocks_total",
    "Tool calls blocked by the turn's tool permissions, by reason (filtered, policy).",
    ("reason",),
)
MODEL_FALLBACKS = Counter(
    "sessionray_model_fallbacks_total",
    "Calls moved to the next model of ai.fallback_models before any content, by api and reason.",
    ("from_api", "to_api", "reason"),
)
VISION_ROUTES = Counter(
    "sessionray_vision_routes_total",
    "Turns carrying images, by route (vision_model, main_model, placeholder).",
    ("route",),
)
MCP_CONNECTS = Counter(
    "sessionray_mcp_connects_total",
    "MCP server connection attempts by outcome (ok, failed).",
    ("outcome",),
)
MEDIA_PROVENANCE_REJECTED = Counter(
    "sessionray_media_provenance_rejected_total",
    "Reply media references not found in the context, tool results or allowlist, by kind.",
    ("kind",),
)
CHAT_COMMANDS = Counter(
    "sessionray_chat_commands_total",
    "Chat commands handled before the agent, by command and outcome (ok, refused).",
    ("command", "outcome"),
)
SQL_RETRIES = Counter(
    "sessionray_sql_retries_total",
    "SQL write transactions re-run after a transient error (SQLite locked/busy, PostgreSQL "
    "serialization failure, deadlock or connection error before commit), by dialect.",
    ("dialect",),
)
# The durable inbox (docs/decisions.md#inbox-durable): each router shard's recovery loop
INBOX_PENDING = Gauge(
    "sessionray_inbox_pending",
    "Inbox rows stored or routed whose turn result has not come back, of one router shard's keys "
    "(the shard's last recovery pass), by shard index.",
    ("shard",),
)
INBOX_RECOVERY = Counter(
    "sessionray_inbox_recovery_total",
    "Inbox rows the recovery loop dealt with, by outcome (resubmitted: a host accepted it again; "
    "handled: the host already had it; expired: older than runtime.replay_window_s and never "
    "handled, not replayed; failed: given up after 3 accepted re-submissions).",
    ("outcome",),
)
# Telegram long polling (the TelegramPoller actor, one per polling bot)
TELEGRAM_POLL_ERRORS = Counter(
    "sessionray_telegram_poll_errors_total",
    "Failed Telegram getUpdates/deleteWebhook calls of a polling bot, by reason (conflict: 409, "
    "another poller or a webhook; rate_limited: 429; server_error: 5xx; network; http_error: "
    "other 4xx or a bad answer).",
    ("reason",),
)
TELEGRAM_POLL_CONFLICT = Gauge(
    "sessionray_telegram_poll_conflict",
    "1 while a polling Telegram bot's last getUpdates answered 409 Conflict (another getUpdates "
    "poller or a webhook is set for its token), else 0; by the configured bot id.",
    ("bot_id",),
)
# Provider limits shared by the cluster (docs/decisions.md#spend-provider-limits); alias is a
# configured provider alias (a bounded set)
PROVIDER_LEASE_WAIT = Histogram(
    "sessionray_provider_lease_wait_seconds",
    "Seconds an LLM call waited for its provider lease, by provider alias.",
    ("alias",),
)
PROVIDER_QUEUE_DEPTH = Gauge(
    "sessionray_provider_queue_depth",
    "LLM calls waiting for a provider lease, by provider alias.",
    ("alias",),
)
PROVIDER_429S = Counter(
    "sessionray_provider_429_total", "HTTP 429 answers reported to the provider gate, by alias.", ("alias",)
)
PROVIDER_REFUSALS = Counter(
    "sessionray_provider_refusals_total",
    "LLM calls refused after waiting max_wait_s for a provider lease (the turn got the busy reply).",
    ("alias",),
)

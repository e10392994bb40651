"""``tracing:`` of ``sessionray.yaml``: traces of every step of a message (OpenTelemetry).

Off by default, and then free (docs/decisions.md#ops-traces).
"""

from __future__ import annotations

import os

from pydantic import Field, field_validator

from runtime.config.ai import _Closed

__all__ = ["TracingConfig"]


class TracingConfig(_Closed):
    """``tracing``: one trace per inbound message across processes (docs/decisions.md#ops-traces)."""

    enabled: bool = False
    """Make spans in every process (ingress, routers, hosts, delivery actors). Off: nothing of
    OpenTelemetry is imported."""
    otlp_endpoint: str | None = None
    """OTLP/HTTP traces URL of a collector, e.g. ``http://127.0.0.1:4318/v1/traces`` (needs the
    ``otlp`` extra). None: spans are written as JSON lines under :attr:`spans_dir`."""
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)
    """Share of messages traced (decided at the webhook, kept by every later step)."""
    spans_dir: str = Field("./data/traces", validate_default=True)
    """Directory of the JSON-lines span files (``spans-<process>-<pid>.jsonl``), read by
    ``sessionray trace``. A relative one is made absolute against the working directory of the
    process that loads the configuration (actors may run elsewhere)."""

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("otlp_endpoint must be an http:// or https:// URL (OTLP/HTTP)")
        return v

    @field_validator("spans_dir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return os.path.abspath(os.path.expanduser(v))

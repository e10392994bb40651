"""What a provider failure is and when to try again: the provider's own error text, the bounded
reason label of ``sessionray_llm_errors_total``, the retryable statuses and the retry delay
(docs/decisions.md#llm-transport). Used by :mod:`providers.transport`, which re-exports these names.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import json
import math
import random
import time

import httpx

from runtime.llm.limits import BUSY_PREFIX

__all__ = [
    "BACKOFF_BASE_S",
    "MAX_RETRY_DELAY_S",
    "RETRYABLE_STATUS",
    "error_message_from_body",
    "error_reason",
    "retry_delay_s",
]

MAX_RETRY_DELAY_S = 60.0
"""Longest single wait between retries, even if ``Retry-After`` asks for more (seconds)."""
BACKOFF_BASE_S = 0.5
"""First backoff delay; doubles per attempt, with up to 25 % jitter (seconds)."""
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


def error_message_from_body(status: int, body: bytes) -> str:
    """Build ``HTTP <status>: <provider message>`` from an error response body.

    Understands OpenAI/Gemini ``{"error": {"message": ...}}`` and Anthropic
    ``{"type": "error", "error": {"type": ..., "message": ...}}``; otherwise quotes the first
    500 characters of the body.
    """
    text = body.decode("utf-8", "replace").strip()
    message = text[:500]
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, list) and payload and isinstance(payload[0], dict):
        payload = payload[0]  # Gemini sometimes wraps the error in a list
    if isinstance(payload, dict):
        err = payload.get("error", payload)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            kind = err.get("type") or err.get("status")
            message = f"{kind}: {err['message']}" if isinstance(kind, str) and kind else err["message"]
        elif isinstance(err, str):
            message = err
    return f"HTTP {status}: {message}" if message else f"HTTP {status}"


def retry_delay_s(attempt: int, headers: httpx.Headers | None = None) -> float:
    """Seconds to wait before retry number ``attempt + 1``.

    ``retry-after-ms`` (ms) or ``Retry-After`` (seconds or an HTTP date) win when present;
    otherwise ``BACKOFF_BASE_S * 2**attempt`` plus up to 25 % jitter. Capped at
    :data:`MAX_RETRY_DELAY_S`.
    """
    if headers is not None:
        asked = _header_delay_s(headers)
        if asked is not None:
            return min(max(asked, 0.0), MAX_RETRY_DELAY_S)
    delay = BACKOFF_BASE_S * (2**attempt)
    return min(delay * (1.0 + random.random() * 0.25), MAX_RETRY_DELAY_S)


def _header_delay_s(headers: httpx.Headers) -> float | None:
    """The server's requested delay in seconds, or ``None`` when absent or unreadable.

    Garbage, ``nan`` and dates without a zone are ignored rather than trusted (a header must
    never crash the call or make it sleep for an undefined time); ``inf`` is capped by the caller.
    """
    ms = headers.get("retry-after-ms", "").strip()
    if ms:
        with contextlib.suppress(ValueError):
            value = float(ms)
            if not math.isnan(value):
                return value / 1000.0
    ra = headers.get("retry-after", "").strip()
    if not ra:
        return None
    try:
        value = float(ra)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(ra)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT; treat a zone-less one as UTC
            when = when.replace(tzinfo=datetime.UTC)
        return when.timestamp() - time.time()
    return None if math.isnan(value) else value


def error_reason(error_message: str | None, stop_reason: str) -> str:
    """Bounded label for ``sessionray_llm_errors_total``: ``aborted``, ``http_4xx``, ``http_429``,
    ``http_5xx``, ``timeout``, ``connection``, ``malformed`` (bad events, a body that is no event
    stream), ``busy`` (no provider lease within ``max_wait_s``) or ``provider`` (in-stream errors,
    refusals, safety stops). Redirects count as ``http_4xx``."""
    if stop_reason == "aborted":
        return "aborted"
    text = error_message or ""
    if text.startswith("HTTP 429"):
        return "http_429"
    if text.startswith(("HTTP 4", "HTTP 3")):  # a redirect is a client-side configuration error too
        return "http_4xx"
    if text.startswith("HTTP "):
        return "http_5xx"
    for prefix, reason in (
        (BUSY_PREFIX, "busy"),
        ("timeout", "timeout"),
        ("connection", "connection"),
        ("malformed", "malformed"),
        ("expected", "malformed"),
    ):
        if text.startswith(prefix):
            return reason
    return "provider"

"""Where a custom-schema session's validated answers go (config ``ai.agent.output_schema`` /
``ai.agent.output_sink``; docs/decisions.md#structured-custom-schema).

The configured schema becomes a :class:`~runtime.reply.custom_output.OutputSpec` in
:func:`actors.placement.hosts.setup.output_schema` (start-up hard fail on a bad one);
:class:`OutputSink` delivers one validated answer: an HTTP ``POST`` of the answer's JSON to
``url`` and/or a ``structured_output`` record in the session's transcript (``agent_messages``,
through the session's single writer; never shown to the model).

The HTTP callback uses a **simple bounded retry**, not the delivery ledger: the answer already
lives in the session's records (the turn's assistant message; with ``transcript: true`` also the
validated value) and a turn cut off by a crash is retried by the session (its ``im_reply`` marker is
missing), so a durable second queue would buy little; the receiver dedupes with the
``Idempotency-Key`` header (the same for a retried turn). Each attempt is bounded by
``timeout_s``; a transport error, a timeout, HTTP 429 or 5xx is retried up to ``attempts`` in all
with ``backoff_s · 2^n`` between them; any other 4xx is final (the receiver refused the body). A
failure is logged and counted (``sessionray_structured_sink_total{sink, outcome}``), never raised:
the turn's bookkeeping goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from runtime import metrics
from runtime.llm.types import AgentMessage, CustomMessage
from runtime.reply.custom_output import OutputSpec

__all__ = [
    "STRUCTURED_OUTPUT_MARKER",
    "OutputSink",
    "SinkName",
]

log = logging.getLogger("sessionray.output_sink")

STRUCTURED_OUTPUT_MARKER = "structured_output"
"""``CustomMessage.custom_type`` of a validated custom-schema answer in the session's transcript:
``data = {"message_id", "idempotency_key", "schema", "tier", "outcome", "value"}``."""

SinkName: TypeAlias = Literal["url", "transcript"]
RecordFn: TypeAlias = Callable[[Sequence[AgentMessage]], Awaitable[Any]]


@dataclass
class OutputSink:
    """Delivery of validated custom-schema answers (see the module docstring for the retry rule).

    Attributes:
        url: HTTP(S) callback that gets ``POST`` of the answer's JSON (``None``: no callback).
        transcript: Record the answer in the session's transcript.
        timeout_s: Bound of each HTTP attempt in seconds.
        attempts: HTTP attempts in all (≥ 1).
        backoff_s: Pause before the second attempt (doubles each time), seconds.
        sleep: Timer of the pauses (injectable for tests).
    """

    url: str | None = None
    transcript: bool = True
    timeout_s: float = 10.0
    attempts: int = 3
    backoff_s: float = 1.0
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep

    async def deliver(
        self,
        spec: OutputSpec,
        value: Any,
        *,
        key: str,
        message_id: str,
        session_key: str,
        tier: str,
        outcome: str,
        record: RecordFn | None,
        recorded: bool = False,
    ) -> dict[SinkName, bool]:
        """Deliver one validated ``value`` (an instance of ``spec.output_type``).

        Args:
            key: Idempotency key (stable across the session's retry of the turn).
            message_id / session_key: The turn's inbound message and session.
            tier / outcome: How the answer was obtained (``first_try`` / ``corrected``).
            record: The session writer's append (``None``: no transcript record possible).
            recorded: The transcript already holds this answer (a retried turn): not written twice.

        Returns:
            ``{sink: delivered}`` for each configured sink. Never raises for a sink failure.
        """
        body = spec.dump(value)
        done: dict[SinkName, bool] = {}
        if self.transcript:
            done["transcript"] = recorded or await self._record(
                record, body, key=key, message_id=message_id, spec=spec, tier=tier, outcome=outcome
            )
        if self.url:
            headers = {
                "Idempotency-Key": key,
                "X-Sessionray-Session": session_key,
                "X-Sessionray-Message-Id": message_id,
                "X-Sessionray-Schema": spec.name,
            }
            done["url"] = await self.post(body, headers)
        for sink, ok in done.items():
            metrics.STRUCTURED_SINK.inc(sink=sink, outcome="delivered" if ok else "failed")
        return done

    async def _record(
        self, record: RecordFn | None, body: Any, *, key: str, message_id: str, spec: OutputSpec, **how: str
    ) -> bool:
        if record is None:
            log.warning("custom output of %s: no session writer, transcript record skipped", message_id)
            return False
        data = {"message_id": message_id, "idempotency_key": key, "schema": spec.name, **how, "value": body}
        try:
            await record([CustomMessage(custom_type=STRUCTURED_OUTPUT_MARKER, data=data)])
        except Exception:
            log.warning("custom output of %s: transcript record failed", message_id, exc_info=True)
            return False
        return True

    async def post(self, body: Any, headers: dict[str, str]) -> bool:
        """``POST`` ``body`` as JSON to :attr:`url` with the bounded retry; True once a 2xx came back."""
        import httpx  # only custom-schema sessions with a callback need it

        assert self.url is not None
        why = ""
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            for attempt in range(max(1, self.attempts)):
                if attempt:
                    await self.sleep(self.backoff_s * 2 ** (attempt - 1))
                try:
                    resp = await client.post(self.url, json=body, headers=headers)
                except httpx.HTTPError as exc:
                    why = f"{type(exc).__name__}: {exc}"
                    continue
                if resp.is_success:
                    return True
                why = f"HTTP {resp.status_code}"
                if resp.status_code != 429 and resp.status_code < 500:
                    break  # the receiver refused this body: a retry would not change that
        log.warning(
            "custom output POST to %s failed: %s",
            self.url,
            why,
            extra={"structured": {"sink": "url", "reason": why, "key": headers.get("Idempotency-Key")}},
        )
        return False

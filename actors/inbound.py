"""The inbound pipeline every transport shares: decode → size + storability checks →
(persist inbound transcript ‖ submit) → an :class:`InboundOutcome`.

The HTTP webhook (:mod:`actors.ingress`) runs it after its own steps (read the body, check the
content type, verify the platform's secret) and turns the outcome into an HTTP answer; the
Telegram poller (:mod:`actors.telegram_poll`) runs it for each ``getUpdates`` update and advances
its offset by the outcome (docs/decisions.md#platform-telegram-polling). One pipeline, so a polled
update is decoded, checked, stored, deduplicated and counted exactly as a webhook POST is.

Outcomes (``outcome`` is the label of ``sessionray_inbound_messages_total{platform, outcome}``,
counted here once per run):

* ``ignored`` — the codec accepts and drops the event (heartbeats, edited messages…);
* ``untriggered`` — stored in the transcripts, no turn; ``accepted`` / ``duplicate`` — the
  runtime's answer (``duplicate``: the session host already took this message id);
* ``malformed`` — a decode error, a text over ``server.max_text_chars`` (HTTP 413) or a message
  that cannot be stored (``actors.ingress_guard.storage_problem``): nothing stored or routed;
* ``error`` — the codec failed with ``TypeError``/``AttributeError``/``KeyError``/``IndexError``/
  ``OverflowError`` (a codec bug): answered like ``malformed`` (400), logged with its traceback;
* ``backpressure`` / ``unavailable`` — the session's mailbox is full, or SQL / a router shard is
  momentarily down: :attr:`InboundOutcome.retry` is True, the sender must deliver the same event
  again after ``retry_after_s`` (the transcript row is stored once, the host dedups the id).

Anything else raises (the webhook answers 500; the poller backs off and re-reads the update).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError
from sqlalchemy.exc import OperationalError

from actors.http_input import text_too_long
from actors.ingress_guard import storage_problem
from runtime import metrics
from runtime.memory.transcripts import TranscriptStore
from runtime.platforms.base import InboundMessage, MalformedEvent, PlatformCodec

__all__ = ["DECODE_IN_THREAD_BYTES", "InboundOutcome", "InboundPipeline"]

log = logging.getLogger("sessionray.ingress")

DECODE_IN_THREAD_BYTES = 64 * 1024
"""An event body larger than this (bytes) is decoded in a worker thread (``asyncio.to_thread``)."""


@dataclass(frozen=True)
class InboundOutcome:
    """What became of one event (see the module docstring).

    Attributes:
        outcome: The metric label (``accepted`` | ``duplicate`` | ``ignored`` | ``untriggered`` |
            ``malformed`` | ``error`` | ``backpressure`` | ``unavailable``).
        http_status: The webhook's answer: 200, 400, 413 or 503.
        body: The webhook's JSON body (``{"status": ...}`` or ``{"error": ...}``, never exception
            text).
        retry_after_s: For a 503: whole seconds ≥ 1 before the event should come again.
    """

    outcome: str
    http_status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    retry_after_s: int | None = None

    @property
    def retry(self) -> bool:
        """True when the event was not taken and must be delivered again (503)."""
        return self.http_status == 503


def _refused(outcome: str, error: str, status: int = 400) -> InboundOutcome:
    return InboundOutcome(outcome, status, {"error": error})


def _again(status: str, retry_after_s: float | None) -> InboundOutcome:
    retry_after = max(1, math.ceil(float(retry_after_s or 1)))
    outcome = "backpressure" if status == "busy" else status
    return InboundOutcome(outcome, 503, {"status": status, "retry_after_s": retry_after}, retry_after)


class InboundPipeline:
    """Decode, check, store and submit events of configured bots.

    Args:
        runtime: Anything with ``async submit(InboundMessage)`` answering an object (or string)
            whose ``status`` is ``accepted`` | ``duplicate`` | ``busy`` (with ``retry_after_s``);
            it may raise ``RayActorError`` / ``ActorUnavailableError`` (shard restarting).
        transcripts: Where inbound rows go (``record_inbound``).
        max_text_chars: Longest decoded text accepted (``server.max_text_chars``).
    """

    def __init__(self, runtime: Any, transcripts: TranscriptStore, max_text_chars: int) -> None:
        self.runtime = runtime
        self.transcripts = transcripts
        self.max_text_chars = max_text_chars

    async def run(
        self,
        platform: str,
        codec: PlatformCodec,
        headers: Mapping[str, str],
        body: bytes,
        *,
        via: str = "webhook",
    ) -> InboundOutcome:
        """Run one event through the pipeline (its signature or secret already verified) and count
        it in ``sessionray_inbound_messages_total``. ``via`` names the transport in log lines
        (``webhook`` | ``polling``).

        Raises:
            Exception: anything none of the steps expects (the caller answers 500 / retries).
        """
        result = await self._run(codec, headers, body, f"{via} {platform}")
        metrics.INBOUND.inc(platform=platform, outcome=result.outcome)
        return result

    async def _run(
        self, codec: PlatformCodec, headers: Mapping[str, str], body: bytes, where: str
    ) -> InboundOutcome:
        try:
            msg = await self._decode(codec, headers, body)
        except MalformedEvent as exc:
            return _refused("malformed", f"malformed event: {exc}")
        except (RecursionError, ValueError):  # nesting too deep, bad JSON, bad UTF-8 (UnicodeError)
            return _refused("malformed", "malformed event: the body could not be decoded")
        except (TypeError, AttributeError, KeyError, IndexError, OverflowError):
            # A codec bug, maybe on a legitimate payload: still 400 (a 5xx would make the platform
            # redeliver it forever and hold back the chat's later updates), but counted as
            # `error` and logged with the traceback so the bug is seen
            # (docs/decisions.md#security-input-limits).
            log.exception("%s: the codec failed on the event (codec bug)", where)
            return _refused("error", "malformed event: the body could not be decoded")
        if msg is None:
            return InboundOutcome("ignored", 200, {"status": "ignored"})
        if len(msg.text) > self.max_text_chars:
            return _refused(
                "malformed", text_too_long("message text", len(msg.text), self.max_text_chars), 413
            )
        problem = storage_problem(msg)
        if problem is not None:
            return _refused("malformed", f"malformed event: {problem}")
        try:
            if not msg.triggered:
                await self._persist(msg)
                return InboundOutcome("untriggered", 200, {"status": "untriggered"})
            # Persist and route at once; the answer waits for both (persist before acknowledging).
            # Should either fail, the event comes again: the host then answers "duplicate" for a
            # message it already took, and the transcript row is stored once.
            both: list[Any] = list(
                await asyncio.gather(self._persist(msg), self.runtime.submit(msg), return_exceptions=True)
            )
            for outcome in both:
                if isinstance(outcome, BaseException):
                    raise outcome
            result = both[1]
        except (OperationalError, RayActorError, ActorUnavailableError) as exc:
            # SQLite lock timeout, database down, or a router shard restarting: the event must come
            # again (the host dedups the message id, the transcript row is stored once).
            log.warning("%s/%s unavailable: %r", where, msg.bot_id, exc)
            return _again("unavailable", 1.0)
        status = str(getattr(result, "status", result))
        if status == "busy":
            return _again("busy", getattr(result, "retry_after_s", None))
        return InboundOutcome(status, 200, {"status": status})

    async def _decode(
        self, codec: PlatformCodec, headers: Mapping[str, str], body: bytes
    ) -> InboundMessage | None:
        """``codec.parse``; in a worker thread for a body over :data:`DECODE_IN_THREAD_BYTES`, so a
        large body (e.g. a 1 MB OneBot CQ-code string) does not stall the event loop
        (docs/decisions.md#platform-linear-parsing)."""
        if len(body) > DECODE_IN_THREAD_BYTES:
            return await asyncio.to_thread(codec.parse, headers, body)
        return codec.parse(headers, body)

    async def _persist(self, msg: InboundMessage) -> None:
        """Inbound transcript row, written when the event is accepted
        (docs/decisions.md#memory-transcripts)."""
        await self.transcripts.record_inbound(
            message_id=msg.message_id,
            platform=msg.platform,
            bot_id=msg.bot_id,
            scene_id=msg.scene_id,
            scene_type=msg.scene_type,
            sender_id=msg.sender.id,
            sender_name=msg.sender.name,
            sender_role=",".join(msg.sender.roles),
            segments=msg.segments,
            text=msg.text,
            time_ms=msg.time_ms,
        )

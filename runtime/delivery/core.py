"""The Ray-free core of a delivery actor: the result model and :class:`DeliverySender` (ledger
claim → media check → render → send with retries → ledger → outbound transcript) of a
:class:`~runtime.delivery.job.DeliveryJob` (re-exported here).

:mod:`actors.delivery` wraps it in the ``DeliveryActor`` and re-exports the models; read that
module's docstring for the flow and the crash-safety rules. Nothing here imports Ray.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, Field

from runtime import metrics
from runtime.delivery import ledger as ledger
from runtime.delivery.job import DeliveryJob
from runtime.memory.db import Database
from runtime.memory.transcripts import TranscriptStore
from runtime.platforms.base import ApiCall, PlatformCodec, RenderTarget, SendResult, get_codec
from runtime.platforms.common import setting
from runtime.reply.leak import LeakPolicy, scan_reply
from runtime.reply.media import MediaPolicy, check_reply_media
from runtime.reply.segments import AudioSegment, FileSegment, ImageSegment, Reply, VideoSegment

SocketSender = Callable[[PlatformCodec, str, ApiCall, float], Awaitable[SendResult]]
"""Sends one call of a bot whose transport is a socket: ``(codec, bot_id, call, timeout_s) →
SendResult`` (a never-sent call is a retryable failure; a sent, unanswered one is not)."""

__all__ = [
    "DeliveryJob",
    "DeliveryResult",
    "DeliverySender",
    "DeliverySettings",
    "SocketSender",
    "bot_media_policy",
    "partition_of",
]

log = logging.getLogger("sessionray.delivery")


def partition_of(session_key: str, size: int) -> int:
    """``crc32(session_key) % size``: the delivery actor index of a session (stable across processes).

    Raises:
        ValueError: ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"delivery pool size must be >= 1, got {size}")
    return zlib.crc32(session_key.encode("utf-8")) % size


class DeliveryResult(BaseModel):
    """What happened to one :class:`DeliveryJob`.

    ``outcome``: ``sent`` (every step confirmed or skipped as uncertain), ``empty`` (the reply had
    no segments: nothing to send), ``failed`` (a step failed permanently or retries ran out; the
    steps before it were sent), ``duplicate`` (the ledger already had a terminal row: nothing sent
    now; ``message_ids``/``error`` are the recorded ones), ``busy`` (another live actor owns it).
    """

    reply_id: str
    outcome: Literal["sent", "empty", "failed", "duplicate", "busy"]
    message_ids: list[str | None] = Field(default_factory=list)
    """The platform's message id per step (``None``: none returned, or a skipped uncertain step)."""
    attempts: int = 0
    """HTTP calls made by this invocation (retries included)."""
    waits_s: list[float] = Field(default_factory=list)
    """Each back-off this invocation waited before a retry, in seconds."""
    error: str | None = None


class DeliverySettings(BaseModel):
    """Everything a DeliveryActor needs (picklable; built from ``runtime.config`` by
    :meth:`from_config`)."""

    database_url: str | None = None
    """SQL URL of the ledger and transcripts (None: the default SQLite file)."""
    bots: list[Any] = Field(default_factory=list)
    """The ``bots:`` config entries (anything :func:`runtime.platforms.base.get_codec` accepts)."""
    max_attempts: int = 5
    """HTTP attempts per step, the first included."""
    backoff_base_s: float = 0.5
    """First back-off in seconds; doubles per retry, with full jitter in [½, 1]× of it."""
    backoff_max_s: float = 30.0
    """Cap of one back-off (and of an honoured Retry-After), in seconds."""
    timeout_s: float = 30.0
    """HTTP timeout of one platform call, in seconds."""
    lease_s: float = 60.0
    """How long a job stays owned by an actor without progress before another may take it over
    (raised to ``max_attempts × (timeout_s + backoff_max_s) + 10`` s so a step's retries fit)."""
    media: Any = None
    """Media settings passed to ``runtime.reply.media`` (a ``MediaPolicy``; None: its defaults). A bot's
    own ``media_dir`` (``bots[].media_dir``) replaces its ``media_dir`` for that bot's replies."""
    leak: LeakPolicy = Field(default_factory=LeakPolicy)
    """Outbound leak check (outbound text, Markdown and nested strings pass the leak check:
    docs/decisions.md#security-leak-check); :meth:`from_config` fills it with the values of every
    secret variable the config names."""

    @classmethod
    def from_config(cls, config: Any) -> DeliverySettings:
        """Build settings from a ``runtime.config.Config`` (``database.url``, ``bots``)."""
        database = getattr(config, "database", None)
        return cls(
            database_url=getattr(database, "url", None),
            bots=list(getattr(config, "bots", []) or []),
            media=getattr(config, "media", None),
            leak=LeakPolicy.from_config(config),
        )


def _has_media(reply: Reply) -> bool:
    """The reply carries an attachment (image, audio, video, file): its media check may fetch it."""
    media = ImageSegment | AudioSegment | VideoSegment | FileSegment
    return any(isinstance(s, media) for s in reply.segments)


def _bot_key(platform: str, bot_id: str) -> tuple[str, str]:
    return platform, str(bot_id)


def _bot_id_of(bot: Any) -> str:
    return str(getattr(bot, "self_id", None) or getattr(bot, "bot_id", None) or getattr(bot, "id", ""))


def bot_media_policy(base: Any, bot: Any) -> MediaPolicy:
    """The media policy of one bot's replies: ``base`` (a ``MediaPolicy``; anything else: the
    defaults) with ``media_dir`` set to the bot's ``media_dir`` when it has one
    (``bots[].media_dir`` confines that bot's ``path`` media, per bot:
    docs/decisions.md#security-media-references)."""
    policy = base if isinstance(base, MediaPolicy) else MediaPolicy()
    media_dir = setting(bot, "media_dir", None)
    return replace(policy, media_dir=Path(media_dir)) if media_dir else policy


class DeliverySender:
    """The Ray-free part of a DeliveryActor: sends jobs of partition ``partition`` as ``owner``.

    Args:
        settings: :class:`DeliverySettings`.
        partition: Index of the delivery actor (``crc32(session_key) % M``).
        owner: ``"{partition}:{incarnation}"``, the ledger owner id.
        socket_sender: How calls of bots with ``transport: ws-reverse | ws-forward`` are sent
            (``actors.onebot_link.LinkSender``); None: over HTTP like every other bot.
    """

    def __init__(
        self,
        settings: DeliverySettings,
        partition: int,
        owner: str,
        socket_sender: SocketSender | None = None,
    ) -> None:
        self.settings = settings
        self.partition = partition
        self.owner = owner
        # As the ingress: a 15 s SQLite lock wait, so a busy file does not fail a send under load.
        self.db = Database(settings.database_url, busy_timeout_ms=15_000, max_overflow=0)
        ledger.create_ledger_table(self.db)
        self.transcripts = TranscriptStore(self.db)
        self.codecs: dict[tuple[str, str], PlatformCodec] = {}
        self.media_policies: dict[tuple[str, str], MediaPolicy] = {}
        self.socket_bots: set[tuple[str, str]] = set()
        self.socket_sender = socket_sender
        for bot in settings.bots:
            key = _bot_key(str(bot.platform), _bot_id_of(bot))
            self.codecs[key] = get_codec(bot)
            self.media_policies[key] = bot_media_policy(settings.media, bot)
            if setting(bot, "transport", "http") != "http":
                self.socket_bots.add(key)
        self.client = httpx.AsyncClient(timeout=settings.timeout_s)
        self._running: dict[str, asyncio.Future[DeliveryResult]] = {}
        # A step's lease must outlast all of its retries (no ledger write happens between them),
        # or a sweeping actor could take the job over while we still retry it.
        worst_step_s = settings.max_attempts * (settings.timeout_s + settings.backoff_max_s) + 10
        self._lease_ms = int(max(settings.lease_s, worst_step_s) * 1000)

    # ------------------------------------------------------------------ public

    async def deliver(self, job: DeliveryJob) -> DeliveryResult:
        """Send ``job`` once (see module docstring). Concurrent calls for one reply_id share one send."""
        running = self._running.get(job.reply_id)
        if running is not None:
            return await asyncio.shield(running)
        fut: asyncio.Future[DeliveryResult] = asyncio.get_running_loop().create_future()
        self._running[job.reply_id] = fut
        try:
            result = await self._deliver(job)
            fut.set_result(result)
            return result
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            self._running.pop(job.reply_id, None)

    async def resume_unfinished(self) -> list[DeliveryResult]:
        """Finish the pending jobs of this partition left by a dead incarnation, and any job whose
        lease expired (start-up and periodic sweep)."""
        entries = await self.db.run(lambda: ledger.resumable(self.db, self.partition, self.owner))
        results = []
        for entry in entries:
            if entry.reply_id in self._running:
                continue
            job = DeliveryJob.model_validate_json(entry.job_json)
            log.warning("resuming delivery %s of %s left by %s", job.reply_id, job.session_key, entry.owner)
            results.append(await self.deliver(job))
        return results

    async def close(self) -> None:
        """Close the HTTP client and the database."""
        await self.client.aclose()
        self.db.dispose()

    # ------------------------------------------------------------------ one job

    async def _deliver(self, job: DeliveryJob) -> DeliveryResult:
        started = time.perf_counter()
        platform = job.platform
        codec = self.codecs.get(_bot_key(platform, job.bot_id))
        target = RenderTarget(scene_type=job.scene_type, scene_id=job.scene_id, reply_to=job.reply_to)
        # A reply without attachments is checked (leak scan: no I/O) and rendered before the claim,
        # so a fresh reply's claim also marks step 0 in flight (ledger.claim_and_begin: one ledger
        # write before the first send). A reply with attachments keeps the order claim → checks
        # (a duplicate never fetches its media again), as does one whose check or render failed.
        reply: Reply | None = None
        calls: list[ApiCall] | None = None
        if codec is not None and not _has_media(job.reply):  # a media check may fetch: after the claim
            try:
                reply = await self._checked(job.reply, platform, job.bot_id)
                calls = list(codec.render(reply, target))
            except Exception:
                reply, calls = None, None
        fields: dict[str, Any] = {
            "reply_id": job.reply_id,
            "session_key": job.session_key,
            "platform": platform,
            "bot_id": job.bot_id,
            "partition": self.partition,
            "job_json": job.model_dump_json(),
            "owner": self.owner,
            "lease_ms": self._lease_ms,
        }
        if calls:
            n_calls = len(calls)
            claim = await self.db.run_write(
                lambda: ledger.claim_and_begin(self.db, **fields, steps_total=n_calls)
            )
        else:
            claim = await self.db.run_write(lambda: ledger.claim(self.db, **fields))
        if claim.state == "done":
            metrics.DELIVERIES.inc(platform=platform, outcome="duplicate")
            return DeliveryResult(
                reply_id=job.reply_id,
                outcome="duplicate",
                message_ids=claim.entry.message_ids,
                error=claim.entry.error,
            )
        if claim.state == "busy":
            return DeliveryResult(
                reply_id=job.reply_id, outcome="busy", error=f"owned by {claim.entry.owner}"
            )
        entry = claim.entry
        if codec is None:
            error = f"no bot configured for {platform}/{job.bot_id}"
            return await self._close(job, "failed", [], 0, [], error)
        if reply is None or calls is None:
            reply = await self._checked(job.reply, platform, job.bot_id)
            calls = codec.render(reply, target)
        if not calls:
            return await self._close(job, "empty", [], 0, [], None)
        ids: list[str | None] = list(entry.message_ids)
        step = entry.steps_done
        # Its owner died with this call on the wire (not our own claim_and_begin mark of step 0).
        if not claim.begun and entry.in_flight >= 0 and entry.in_flight == step:
            await self.db.run_write(lambda: ledger.skip_uncertain_step(self.db, job.reply_id, self.owner))
            log.warning(
                "delivery %s step %d was on the wire when its owner died: not resent (at most once)",
                job.reply_id,
                step,
            )
            metrics.DELIVERIES.inc(platform=platform, outcome="uncertain")
            ids.append(None)
            step += 1
        attempts, waits, closed = 0, [], False
        total = len(calls)
        for i in range(step, total):
            if not (i == 0 and claim.begun):  # claim_and_begin already marked step 0 in flight
                await self.db.run_write(
                    lambda i=i: ledger.begin_step(  # type: ignore[misc]
                        self.db, job.reply_id, self.owner, i, total, self._lease_ms
                    )
                )
            result, n, w = await self._send_with_retries(codec, calls[i], platform, job.bot_id)
            attempts += n
            waits += w
            if not result.ok:
                return await self._close(job, "failed", ids, attempts, waits, result.error, started)
            last = i == len(calls) - 1
            await self.db.run_write(
                lambda i=i, mid=result.message_id, last=last: ledger.finish_step(  # type: ignore[misc]
                    self.db, job.reply_id, self.owner, i, mid, last=last
                )
            )
            ids.append(result.message_id)
            closed = last
        return await self._close(job, "sent", ids, attempts, waits, None, started, reply, closed=closed)

    async def _close(
        self,
        job: DeliveryJob,
        outcome: Literal["sent", "empty", "failed"],
        ids: list[str | None],
        attempts: int,
        waits: list[float],
        error: str | None,
        started: float | None = None,
        reply: Reply | None = None,
        *,
        closed: bool = False,
    ) -> DeliveryResult:
        status: Literal["sent", "failed"] = "failed" if outcome == "failed" else "sent"
        if not closed:  # the last step's write already closed it otherwise
            await self.db.run_write(lambda: ledger.finish(self.db, job.reply_id, self.owner, status, error))
        if outcome != "empty":
            metrics.DELIVERIES.inc(platform=job.platform, outcome="ok" if outcome == "sent" else "failed")
        if started is not None:
            metrics.DELIVERY_LATENCY.observe(time.perf_counter() - started, platform=job.platform)
        if outcome == "sent" and reply is not None:
            await self._transcript(job, reply, ids)
        if error:
            log.warning("delivery %s to %s failed: %s", job.reply_id, job.session_key, error)
        return DeliveryResult(
            reply_id=job.reply_id,
            outcome=outcome,
            message_ids=ids,
            attempts=attempts,
            waits_s=waits,
            error=error,
        )

    # ------------------------------------------------------------------ pieces

    async def _checked(self, reply: Reply, platform: str, bot_id: str) -> Reply:
        """The leak check (a secret is redacted or the reply blocked, and counted:
        docs/decisions.md#security-leak-check), then the media and link checks with the bot's media
        policy (unusable attachments and non-http(s) share links become a notice text segment:
        docs/decisions.md#security-media-bytes). The leak check runs first so a
        URL carrying a secret is never fetched."""
        reply = scan_reply(reply, self.settings.leak).reply
        policy = self.media_policies.get(_bot_key(platform, bot_id)) or bot_media_policy(
            self.settings.media, None
        )
        return (await check_reply_media(reply, policy, platform)).reply

    async def _transcript(self, job: DeliveryJob, reply: Reply, ids: list[str | None]) -> None:
        """Outbound transcript row after the platform confirmed
        (docs/decisions.md#memory-transcripts): one row per reply, keyed by the platform's first
        message id (else the reply id)."""
        message_id = next((i for i in ids if i), None) or job.reply_id
        try:
            await self.transcripts.record_outbound(
                message_id=message_id,
                platform=job.platform,
                bot_id=job.bot_id,
                scene_id=job.scene_id,
                scene_type=job.scene_type,
                sender_id=job.bot_id,
                sender_name="",
                sender_role="bot",
                segments=reply.segments,
            )
        except Exception:  # a transcript must never turn a confirmed send into a failure
            log.exception("outbound transcript of %s not written", job.reply_id)

    async def _send_with_retries(
        self, codec: PlatformCodec, call: ApiCall, platform: str, bot_id: str = ""
    ) -> tuple[SendResult, int, list[float]]:
        """One step: retry 429/5xx/connection failures with backoff; returns (result, attempts, waits).
        A bot with a socket transport sends through :attr:`socket_sender` (same retry rules)."""
        waits: list[float] = []
        attempt = 0
        over_socket = (platform, str(bot_id)) in self.socket_bots
        while True:
            attempt += 1
            if over_socket:
                result = await self._send_over_socket(codec, str(bot_id), call)
            else:
                result = await self._send_once(codec, call)
            if result.ok or not result.retryable or attempt >= self.settings.max_attempts:
                return result, attempt, waits
            delay = self._backoff(attempt, result.retry_after_s)
            waits.append(delay)
            metrics.DELIVERY_RETRIES.inc(platform=platform)
            log.info("platform %s answered %s; retry %d in %.2f s", platform, result.error, attempt, delay)
            await asyncio.sleep(delay)

    def _backoff(self, attempt: int, retry_after_s: float | None) -> float:
        """Retry-After when the platform gave one (capped), else base·2^(attempt-1) with jitter
        (docs/decisions.md#delivery-retries)."""
        cap = self.settings.backoff_max_s
        if retry_after_s is not None and retry_after_s >= 0:
            return min(float(retry_after_s), cap)
        full = min(cap, self.settings.backoff_base_s * (2 ** (attempt - 1)))
        return full * (0.5 + random.random() / 2)

    async def _send_over_socket(self, codec: PlatformCodec, bot_id: str, call: ApiCall) -> SendResult:
        """One call of a socket-transport bot; without a ``socket_sender`` a retryable failure."""
        if self.socket_sender is None:
            return SendResult(ok=False, error="connect: no socket sender in this process", retryable=True)
        return await self.socket_sender(codec, bot_id, call, self.settings.timeout_s)

    async def _send_once(self, codec: PlatformCodec, call: ApiCall) -> SendResult:
        kwargs: dict[str, Any] = {"headers": call.headers}
        if call.json_body is not None:
            kwargs["json"] = call.json_body
        if call.form is not None:
            kwargs["data"] = call.form
        if call.files:
            kwargs["files"] = {k: (f.filename, f.data, f.content_type) for k, f in call.files.items()}
        try:
            resp = await self.client.request(call.method, call.url, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # Never reached the platform: safe to retry.
            return SendResult(ok=False, error=f"connect: {exc!r}", retryable=True)
        except httpx.HTTPError as exc:
            # The request may have reached the platform: do not retry (at most once).
            return SendResult(ok=False, error=f"transport: {exc!r}", retryable=False)
        result = codec.parse_send_result(resp.status_code, resp.headers, resp.content)
        if not result.ok and result.retry_after_s is None and "retry-after" in resp.headers:
            retry_after = _parse_retry_after(resp.headers["retry-after"])
            result = result.model_copy(update={"retry_after_s": retry_after})
        return result


def _parse_retry_after(value: str) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds, possibly fractional; dates unsupported)."""
    try:
        return max(0.0, float(value))
    except ValueError:
        return None

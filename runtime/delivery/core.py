"""The Ray-free core of a delivery actor: :class:`DeliverySender` takes a chat's replies from the
ledger (or straight from a caller) and sends them — media and leak checks → render → each step:
in flight → platform call (retried through an outage) → done → outbound transcript; a reply is
claimed before its checks (one with attachments, one worked on before, one handed straight to
the actor) or by the mark of its step 0 in flight (a queued row nobody worked on yet)
(docs/decisions.md#delivery-outbox, docs/decisions.md#delivery-outage,
docs/decisions.md#delivery-uncertain).

* A session host records a reply as ``queued`` (:mod:`runtime.delivery.outbox`) and calls
  :meth:`DeliverySender.wake`, with the reply's job when it is its chat's only unfinished one;
  the sweep (:meth:`DeliverySender.sweep`) finds the rows nobody woke
  it for (a notification lost with a dead actor, a dead owner's ``pending`` row).
* Each chat's work runs in its own chain (:class:`runtime.delivery.chains.ChatChains`): its
  replies go out in ledger order, and a reply waiting out an outage holds back only its chat.
* A retryable failure (429, 5xx, connect) is retried until the reply is ``delivery.max_age_s``
  old (:func:`runtime.delivery.send.retry_step`), renewing the lease meanwhile; then ``failed``.
  A call cut off on the wire is ``uncertain``: recorded, not resent, the next steps go on.

:mod:`actors.delivery.pool` wraps it in the ``DeliveryActor``. The settings and result models live in
:mod:`runtime.delivery.settings` and are re-exported here. Nothing here imports Ray.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from sqlalchemy import Connection

from runtime import metrics, tracing
from runtime.delivery import ledger as ledger
from runtime.delivery import outbox
from runtime.delivery.chains import ChatChains
from runtime.delivery.claimed import Lease, Sending
from runtime.delivery.clients import PlatformClients
from runtime.delivery.drain import ChatDrain
from runtime.delivery.job import DeliveryJob
from runtime.delivery.send import OnWire, StepOutcome, retry_step, send_http, unanswered
from runtime.delivery.settings import (
    DeliveryResult,
    DeliverySettings,
    SocketSender,
    bot_id_of,
    bot_key,
    bot_media_policy,
    has_media,
    partition_of,
)
from runtime.llm.types import now_ms
from runtime.memory.db import DEFAULT_SQL_THREADS, Database, is_transient_write_error
from runtime.memory.transcripts import TranscriptStore
from runtime.platforms.base import ApiCall, PlatformCodec, RenderTarget, SendResult, get_codec
from runtime.platforms.common import setting
from runtime.reply.leak import scan_reply
from runtime.reply.media import MediaPolicy, check_reply_media
from runtime.reply.segments import Reply

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

Final = Literal["sent", "empty", "failed", "uncertain"]
WIRE_MARK_LOCK_WAIT_S = 0.02
"""Longest wait for the SQLite writer lock of an on-the-wire mark written on the event loop's
thread (it blocks the loop meanwhile); past it the mark waits on the SQL pool instead, in seconds."""


class DeliverySender:
    """The Ray-free part of a DeliveryActor: sends the replies of partition ``partition`` as
    ``owner`` (create and use on one event loop).

    Args:
        settings: :class:`DeliverySettings`.
        partition: Index of the delivery actor (``crc32(session_key) % M``).
        owner: ``"{partition}:{incarnation}"``, the ledger owner id.
        socket_sender: How calls of bots with ``transport: ws-reverse | ws-forward`` are sent
            (``actors.delivery.onebot_link.LinkSender``); None: over HTTP like every other bot.
        db: The database to use (a session host's own, which sends its chats' head replies:
            docs/decisions.md#delivery-in-host; it must keep one connection beyond its SQL
            threads for the on-the-wire mark, and is not disposed by :meth:`close`); None: a
            database of the sender's own on ``settings.database_url``.
    """

    def __init__(
        self,
        settings: DeliverySettings,
        partition: int,
        owner: str,
        socket_sender: SocketSender | None = None,
        db: Database | None = None,
    ) -> None:
        self.settings = settings
        self.partition = partition
        self.owner = owner
        self._own_db = db is None
        # As the ingress: a 15 s SQLite lock wait, so a busy file does not fail a send under load.
        # 7 SQL threads + 1 connection for the on-the-wire mark written on the event loop's
        # thread (write_here): 8 connections at most on PostgreSQL, as before; SQLite keeps one
        # more for inline writes (docs/decisions.md#memory-connection-budget, #memory-sql-off-loop)
        self.db = db or Database(
            settings.database_url, busy_timeout_ms=15_000, threads=DEFAULT_SQL_THREADS - 1, max_overflow=1
        )
        if self._own_db:
            ledger.create_ledger_table(self.db)
        self._mark_here = self._own_db or self.db.is_sqlite
        """The on-the-wire mark is written on the event loop's thread; not in a session host on
        PostgreSQL, where a server round trip there would hold up every session
        (docs/decisions.md#delivery-in-host)."""
        self.transcripts = TranscriptStore(self.db)
        self.codecs: dict[tuple[str, str], PlatformCodec] = {}
        self.media_policies: dict[tuple[str, str], MediaPolicy] = {}
        self.socket_bots: set[tuple[str, str]] = set()
        self.socket_sender = socket_sender
        for bot in settings.bots:
            key = bot_key(str(bot.platform), bot_id_of(bot))
            self.codecs[key] = get_codec(bot)
            self.media_policies[key] = bot_media_policy(settings.media, bot)
            if setting(bot, "transport", "http") != "http":
                self.socket_bots.add(key)
        self.clients = PlatformClients(settings, self.socket_bots)
        """One HTTP client per bot over HTTP (docs/decisions.md#delivery-connections)."""
        self._running: dict[str, asyncio.Future[DeliveryResult]] = {}
        self.drain = ChatDrain(self.db, partition, self._deliver_traced, self._running, self.wake)
        """What of a chat to send next, in order (a drain runs in the chat's chain)."""
        self.chains = ChatChains(self.drain)
        self.lease_ms = int(max(settings.lease_s, settings.timeout_s + 10) * 1000)
        """A claim's lease in ms: it outlasts one call; a wait for a retry renews it."""

    # ------------------------------------------------------------------ public

    async def deliver(self, job: DeliveryJob) -> DeliveryResult:
        """Send ``job`` now, in its chat's chain (after what is queued there), and return what
        happened; the ledger makes a replay a ``duplicate``. Concurrent calls for one reply_id
        share one send."""
        running = self._running.get(job.reply_id)
        if running is not None:
            return await asyncio.shield(running)
        fut: asyncio.Future[DeliveryResult] = asyncio.get_running_loop().create_future()
        self._running[job.reply_id] = fut
        try:
            result = await self.chains.run(job.session_key, lambda: self._deliver_traced(job, queued=False))
            fut.set_result(result)
            return result
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        finally:
            self._running.pop(job.reply_id, None)

    def wake(self, session_key: str, head: DeliveryJob | None = None) -> None:
        """A reply of ``session_key`` was queued in the ledger: send the chat's unfinished replies
        in ledger order (returns at once). ``head``: that reply, when its row was the chat's only
        unfinished one as it was written (``head.head_at`` set): it is sent without a read of the
        chat's queue — nothing of the chat came before it, and what comes after it is notified
        on its own; its mark on the wire claims it only while its row is still the one notified
        (an operator's retry moves a row in the chat's order: docs/decisions.md#delivery-outbox)."""
        self.drain.note(session_key, head)
        self.chains.wake(session_key)

    async def sweep(self) -> int:
        """Wake every chat with work for this actor (:func:`runtime.delivery.outbox.chats_to_resume`)
        and report this partition's backlog gauge; returns how many chats were woken."""
        keys = await self.db.run(lambda: outbox.chats_to_resume(self.db, self.partition, self.owner))
        for key in keys:
            self.wake(key)
        backlog = await self.db.run(lambda: outbox.counts(self.db, self.partition))
        for state, n in backlog.items():
            metrics.DELIVERY_BACKLOG.set(n, state=state)
        if keys:
            log.info(
                "delivery sweep of partition %d: %d chat(s) with unfinished replies",
                self.partition,
                len(keys),
            )
        return len(keys)

    async def close(self) -> None:
        """Stop the chains, close the HTTP clients and the database (when it is the sender's own)."""
        await self.chains.close()
        await self.clients.aclose()
        if self._own_db:
            self.db.dispose()

    # ------------------------------------------------------------------ one reply

    async def _deliver_traced(
        self,
        job: DeliveryJob,
        *,
        queued: bool,
        fresh: ledger.LedgerEntry | None = None,
        read_at: tuple[int, int] | None = None,
    ) -> DeliveryResult:
        """:meth:`_deliver` as the span ``delivery`` of the message's trace (``job.traceparent``,
        docs/decisions.md#ops-traces), starting with the drain's read of the chat's queue, from
        ``read_at[0]`` to ``read_at[1]`` (``time.time_ns()``), the first step of the reply's
        ``delivery.claim`` (:meth:`_deliver`)."""
        start_ns = read_at[0] if read_at is not None else None
        with tracing.span(
            "delivery", parent=job.traceparent, reply_id=job.reply_id, queued=queued, start_ns=start_ns
        ) as step:
            result = await self._deliver(job, queued=queued, fresh=fresh, read_at=read_at)
            step.set(outcome=result.outcome)
            return result

    async def _deliver(
        self,
        job: DeliveryJob,
        *,
        queued: bool,
        fresh: ledger.LedgerEntry | None = None,
        read_at: tuple[int, int] | None = None,
    ) -> DeliveryResult:
        """One reply, step by step: claim → check → render → send → close. Returns its
        :class:`DeliveryResult` (``duplicate`` and ``busy`` without sending). A ``fresh`` queued
        row (as the drain read it) of a bot over HTTP that renders to calls without fetching
        media is claimed by the mark of its step 0 on the wire instead
        (docs/decisions.md#delivery-outbox); its span ``delivery.claim`` is then the drain's read
        (``read_at``: ``time.time_ns()`` at its start and end; without one, a head sent unread, an
        instant) with the attribute ``at_wire``, else the claim's write, from the read's start
        when there was one. Raises
        :class:`runtime.delivery.ledger.LostLeaseError` when another owner took the reply over,
        and whatever the check or render of a claimed reply raises (the reply stays claimed)."""
        started = time.perf_counter()
        codec = self.codecs.get(bot_key(job.platform, job.bot_id))
        early = await self._render_early(job, codec)
        over_socket = bot_key(job.platform, job.bot_id) in self.socket_bots
        at_wire = fresh if early is not None and early[1] and not over_socket else None
        if at_wire is not None:
            now_ns = time.time_ns()  # a head sent without a read: the claim is decided here
            with_read = True if read_at is not None else None
            tracing.past_span(
                "delivery.claim", *(read_at or (now_ns, now_ns)), with_read=with_read, at_wire=True
            )
            claim = ledger.ClaimOutcome("claimed", at_wire)
        else:
            start_ns, with_read = (read_at[0], True) if read_at is not None else (None, None)
            with tracing.span("delivery.claim", start_ns=start_ns, with_read=with_read):
                claim = await self._claim(job, queued, self._steps_marked_at_claim(job, early))
        if claim.state != "claimed":
            return self._settled(job, claim)
        lease = Lease(self.db, job.reply_id, self.owner, self.lease_ms, self.settings.timeout_s)
        if codec is None:
            return await self._close(
                job, "failed", [], error=f"no bot configured for {job.platform}/{job.bot_id}"
            )
        reply, calls = early or await self._render(job, codec)
        if not calls:
            return await self._close(job, "empty", [])
        unclaimed = at_wire.created_at if at_wire is not None else None
        sending = Sending(job, codec, calls, lease, started, reply, over_socket, claim_at_wire=unclaimed)
        return await self._send_all(await self._resume(job, claim, sending))

    # --------------------------------------------------- one reply: claim, check, render

    async def _render_early(
        self, job: DeliveryJob, codec: PlatformCodec | None
    ) -> tuple[Reply, list[ApiCall]] | None:
        """The checked reply and its calls before the claim, for a reply without attachments
        (the leak scan does no I/O), so that a claim over a socket also marks step 0 in flight
        (one ledger write before the first send). None for a reply with attachments (claim →
        checks: a duplicate never fetches its media again), without a codec, or whose check or
        render failed (done again after the claim, where the failure is reported)."""
        if codec is None or has_media(job.reply):
            return None
        try:
            return await self._render(job, codec)
        except Exception:
            return None

    async def _render(self, job: DeliveryJob, codec: PlatformCodec) -> tuple[Reply, list[ApiCall]]:
        """The checked reply (:meth:`_checked`) and the platform calls ``codec`` renders it to
        (one a step; an empty list sends nothing). Raises what the checks or the codec raise."""
        reply = await self._checked(job.reply, job.platform, job.bot_id)
        target = RenderTarget(scene_type=job.scene_type, scene_id=job.scene_id, reply_to=job.reply_to)
        return reply, list(codec.render(reply, target))

    def _steps_marked_at_claim(
        self, job: DeliveryJob, early: tuple[Reply, list[ApiCall]] | None
    ) -> int | None:
        """How many steps the claim records (marking step 0 in flight), or None. Only over a
        socket: over HTTP a step is marked on the wire when its request is written (send_http's
        ``on_wire``), so a sender killed while connecting leaves a step that is sent again, not an
        uncertain one (docs/decisions.md#delivery-uncertain)."""
        if early is None or not early[1] or bot_key(job.platform, job.bot_id) not in self.socket_bots:
            return None
        return len(early[1])

    async def _claim(self, job: DeliveryJob, queued: bool, n_calls: int | None) -> ledger.ClaimOutcome:
        """Claim the reply's ledger row for this owner (one write): its ``queued`` row, else a new
        row from ``job``; with ``n_calls`` the same write marks step 0 in flight
        (docs/decisions.md#delivery-outbox)."""
        if queued:
            found = await self.db.run_write(
                lambda: ledger.claim_queued(self.db, job.reply_id, self.owner, self.lease_ms, n_calls)
            )
            if found is not None:
                return found
        fields: dict[str, Any] = {
            "reply_id": job.reply_id,
            "session_key": job.session_key,
            "platform": job.platform,
            "bot_id": job.bot_id,
            "partition": self.partition,
            "job_json": job.model_dump_json(),
            "owner": self.owner,
            "lease_ms": self.lease_ms,
        }
        if n_calls:
            return await self.db.run_write(
                lambda: ledger.claim_and_begin(self.db, **fields, steps_total=n_calls)
            )
        return await self.db.run_write(lambda: ledger.claim(self.db, **fields))

    def _settled(self, job: DeliveryJob, claim: ledger.ClaimOutcome) -> DeliveryResult:
        """The answer for a reply not claimed: ``duplicate`` (final already: its recorded ids
        and error, counted) or ``busy`` (another live owner holds its lease)."""
        entry = claim.entry
        if claim.state == "done":
            metrics.DELIVERIES.inc(platform=job.platform, outcome="duplicate")
            return DeliveryResult(
                reply_id=job.reply_id, outcome="duplicate", message_ids=entry.message_ids, error=entry.error
            )
        return DeliveryResult(reply_id=job.reply_id, outcome="busy", error=f"owned by {entry.owner}")

    async def _resume(self, job: DeliveryJob, claim: ledger.ClaimOutcome, run: Sending) -> Sending:
        """Where sending starts: after the steps done, the steps an operator asked to resend
        first; a step its dead owner left on the wire is recorded ``uncertain`` and skipped
        (docs/decisions.md#delivery-uncertain). Returns ``run`` with its plan set."""
        entry = claim.entry
        run.ids, run.uncertain, run.begun = list(entry.message_ids), bool(claim.uncertain), claim.begun
        step, resend = entry.steps_done, list(claim.resend)
        if not claim.begun and entry.in_flight >= 0:  # its owner died with this call on the wire
            cut = entry.in_flight
            await self.db.run_write(lambda: ledger.record_uncertain(self.db, job.reply_id, self.owner))
            self._uncertain(job, cut, f"on the wire when its owner {entry.owner} died")
            _put(run.ids, cut, None)
            step, run.uncertain = max(step, cut + 1), True
            resend = [s for s in resend if s != cut]
        run.plan = [s for s in resend if s < len(run.calls)] + list(range(step, len(run.calls)))
        if claim.resend:  # a resend after a retry: its transcript exists
            run.record = None
        run.transcript = self._transcript_writer(job, run.record)
        run.deadline_s = (entry.created_at or now_ms()) / 1000 + self.settings.max_age_s
        return run

    # --------------------------------------------------- one reply: send, close

    async def _send_all(self, run: Sending) -> DeliveryResult:
        """Send the planned steps in order, each recorded as it ends (done, or uncertain and
        passed over), then close the reply; the first step that fails closes it ``failed``."""
        for n, i in enumerate(run.plan):
            last = n == len(run.plan) - 1
            out = await self._send_marked(run, i)
            run.attempts += out.attempts
            run.waits += out.waits
            if unanswered(out.result):
                await self._step_uncertain(run, i, last, out.result.error or "no answer")
            elif not out.result.ok:
                return await self._fail(run, out)
            else:
                await self._step_done(run, i, last, out.result.message_id)
        outcome: Final = "uncertain" if run.uncertain else "sent"
        job, closed = run.job, bool(run.plan)  # the last step's write closed the reply
        return await self._close(
            job, outcome, run.ids, run.attempts, run.waits, None, run.started, run.record, closed=closed
        )

    async def _send_marked(self, run: Sending, i: int) -> StepOutcome:
        """Step ``i`` with its retries, marked in flight in the ledger: over HTTP as its request
        is written, over a socket before it is sent (unless the claim marked step 0)."""
        on_wire = self._wire_mark(run, i)
        if run.over_socket and not (i == 0 and run.begun):
            await on_wire()

        async def before_wait(wait_s: float) -> None:  # a retry's wait: the lease must outlast it
            await self._claimed(run)
            await run.lease.cover(wait_s)

        with tracing.span("delivery.send", step=i, path=run.calls[i].path) as span:
            out = await self._send_step(
                run.codec,
                run.calls[i],
                run.job,
                run.deadline_s,
                before_wait,
                None if run.over_socket else on_wire,
            )
            span.set(ok=out.result.ok, attempts=out.attempts)
            return out

    def _wire_mark(self, run: Sending, i: int) -> OnWire:
        """The write that marks step ``i`` in flight (:func:`runtime.delivery.ledger.begin_step`;
        for a reply not claimed yet :func:`runtime.delivery.ledger.claim_fresh`, which claims it
        in the same statement), renewing the lease: on the event loop's thread, so no thread hop
        stands between the mark and the first byte; on the SQL pool when the writer lock stays
        busy past :data:`WIRE_MARK_LOCK_WAIT_S`."""
        job, total = run.job, len(run.calls)

        def mark() -> None:
            if run.claim_at_wire is not None:
                ledger.claim_fresh(self.db, job.reply_id, self.owner, self.lease_ms, run.claim_at_wire, total)
            else:
                ledger.begin_step(self.db, job.reply_id, self.owner, i, total, self.lease_ms)

        async def on_wire() -> None:
            if not self._mark_here:  # a session host on PostgreSQL: its loop runs the sessions
                await self.db.run_write(mark)
            else:
                try:
                    self.db.write_here(mark, lock_wait_s=WIRE_MARK_LOCK_WAIT_S)
                except Exception as exc:
                    if not is_transient_write_error(exc):
                        raise
                    await self.db.run_write(mark)  # the writer lock is busy: wait off the loop
            run.claim_at_wire = None
            run.lease.refreshed()

        return on_wire

    async def _claimed(self, run: Sending) -> None:
        """Claim a reply still waiting for its step 0's mark (:attr:`Sending.claim_at_wire`)
        before anything else is written of it: a wait for a retry (its lease must cover it) or
        a close after step 0 failed before its mark.

        Raises:
            runtime.delivery.ledger.LostLeaseError: someone else claimed it since it was read.
        """
        created_at = run.claim_at_wire
        if created_at is None:
            return
        reply_id = run.job.reply_id
        await self.db.run_write(
            lambda: ledger.claim_fresh(self.db, reply_id, self.owner, self.lease_ms, created_at)
        )
        run.claim_at_wire = None
        run.lease.refreshed()

    async def _step_uncertain(self, run: Sending, i: int, last: bool, why: str) -> None:
        """Step ``i`` was written and not answered: recorded ``uncertain`` (closing the reply
        ``uncertain`` when it is the last), not resent; the next steps go on."""
        job = run.job
        await self.db.run_write(
            lambda: ledger.record_uncertain(
                self.db, job.reply_id, self.owner, i, last=last, final="uncertain"
            )
        )
        self._uncertain(job, i, why)
        _put(run.ids, i, None)
        run.uncertain = True

    async def _step_done(self, run: Sending, i: int, last: bool, message_id: str | None) -> None:
        """Step ``i`` was sent: recorded done with the platform's ``message_id``; the last step's
        write also closes the reply and writes its outbound transcript row."""
        job = run.job
        final: Literal["sent", "uncertain"] = "uncertain" if run.uncertain else "sent"
        with tracing.span("delivery.close" if last else "delivery.record", step=i, status=final):
            await self.db.run_write(
                lambda: ledger.finish_step(
                    self.db,
                    job.reply_id,
                    self.owner,
                    i,
                    message_id,
                    last=last,
                    final=final,
                    also=run.transcript,
                ),
                inline=True,
            )
        _put(run.ids, i, message_id)
        if last:  # the transcript row went in the same transaction
            run.record = None

    async def _fail(self, run: Sending, out: StepOutcome) -> DeliveryResult:
        """Close the reply ``failed`` after a step the platform refused (``rejected``) or that
        kept failing until the reply was ``delivery.max_age_s`` old (``expired``)."""
        await self._claimed(run)  # step 0 may have failed before its mark claimed the reply
        error = out.result.error or "failed"
        if out.expired:
            age = time.time() - (run.deadline_s - self.settings.max_age_s)
            error = f"gave up after {age:.0f} s (delivery.max_age_s={self.settings.max_age_s:g}): {error}"
        reason = "expired" if out.expired else "rejected"
        return await self._close(
            run.job, "failed", run.ids, run.attempts, run.waits, error, run.started, reason=reason
        )

    async def _close(
        self,
        job: DeliveryJob,
        outcome: Final,
        ids: list[str | None],
        attempts: int = 0,
        waits: list[float] | None = None,
        error: str | None = None,
        started: float | None = None,
        reply: Reply | None = None,
        *,
        closed: bool = False,
        reason: str = "unconfigured",
    ) -> DeliveryResult:
        status: ledger.FinalStatus = "sent" if outcome == "empty" else outcome
        if not closed:
            with tracing.span("delivery.close", status=status):
                await self.db.run_write(
                    lambda: ledger.finish(self.db, job.reply_id, self.owner, status, error), inline=True
                )
        if outcome != "empty":
            metrics.DELIVERIES.inc(platform=job.platform, outcome="ok" if outcome == "sent" else outcome)
        if started is not None:
            metrics.DELIVERY_LATENCY.observe(time.perf_counter() - started, platform=job.platform)
        if outcome in ("sent", "uncertain") and reply is not None:
            await self._transcript(job, reply, ids)
        if outcome == "failed":
            metrics.DELIVERY_FAILURES.inc(platform=job.platform, reason=reason)
            log.error(
                "delivery %s to %s failed (%s): %s; see GET /admin/deliveries?state=failed",
                job.reply_id,
                job.session_key,
                reason,
                error,
            )
        return DeliveryResult(
            reply_id=job.reply_id,
            outcome=outcome,
            message_ids=ids,
            attempts=attempts,
            waits_s=waits or [],
            error=error,
        )

    def _uncertain(self, job: DeliveryJob, step: int, why: str) -> None:
        metrics.DELIVERY_UNCERTAIN_STEPS.inc(platform=job.platform)
        log.warning(
            "delivery %s to %s: step %d is uncertain (%s); not resent unless retried "
            "(POST /admin/deliveries/{reply_id}/retry)",
            job.reply_id,
            job.session_key,
            step,
            why,
        )

    # ------------------------------------------------------------------ pieces

    async def _checked(self, reply: Reply, platform: str, bot_id: str) -> Reply:
        """The leak check (a secret is redacted or the reply blocked, and counted:
        docs/decisions.md#security-leak-check), then the media and link checks with the bot's media
        policy (unusable attachments and non-http(s) share links become a notice text segment:
        docs/decisions.md#security-media-bytes). The leak check runs first so a
        URL carrying a secret is never fetched."""
        reply = scan_reply(reply, self.settings.leak).reply
        policy = self.media_policies.get(bot_key(platform, bot_id)) or bot_media_policy(
            self.settings.media, None
        )
        return (await check_reply_media(reply, policy, platform)).reply

    def _transcript_fields(self, job: DeliveryJob, reply: Reply, ids: list[str | None]) -> dict[str, Any]:
        """The outbound transcript row of a confirmed reply (docs/decisions.md#memory-transcripts),
        keyed by the platform's first message id (else the reply id)."""
        first = next((i for i in ids if i), None) or job.reply_id
        scene = {"platform": job.platform, "scene_id": job.scene_id, "scene_type": job.scene_type}
        bot = {"bot_id": job.bot_id, "sender_id": job.bot_id, "sender_name": "", "sender_role": "bot"}
        return {"message_id": first, **scene, **bot, "segments": reply.segments}

    async def _transcript(self, job: DeliveryJob, reply: Reply, ids: list[str | None]) -> None:
        # its own transaction: a reply closed without a last step's write (its last step uncertain)
        try:
            await self.transcripts.record_outbound(**self._transcript_fields(job, reply, ids))
        except Exception:  # a transcript must never turn a confirmed send into a failure
            log.exception("outbound transcript of %s not written", job.reply_id)

    def _transcript_writer(self, job: DeliveryJob, reply: Reply | None) -> ledger.StepExtra | None:
        """The transcript row in the last step's transaction, in a savepoint: a row that cannot be
        written is logged and rolled back alone, never failing the send. ``None`` without ``reply``."""
        if reply is None:
            return None

        def write(conn: Connection, ids: list[str | None]) -> None:
            try:
                fields = self._transcript_fields(job, reply, ids)
                if (row := self.transcripts.prepare(direction="outbound", **fields)) is not None:
                    with conn.begin_nested():
                        row.execute(conn)
            except Exception:  # a transcript must never turn a confirmed send into a failure
                log.exception("outbound transcript of %s not written", job.reply_id)

        return write

    async def _send_step(
        self,
        codec: PlatformCodec,
        call: ApiCall,
        job: DeliveryJob,
        deadline_s: float,
        before_wait: Callable[[float], Awaitable[None]],
        on_wire: OnWire | None,
    ) -> StepOutcome:
        """One step with its retries (:func:`runtime.delivery.send.retry_step`) over HTTP, marked
        on the wire by ``on_wire`` as each attempt is written; ``on_wire`` None: a bot with a
        socket transport, sent through :attr:`socket_sender` (same rules; marked by the caller).
        ``before_wait(wait_s)`` is awaited before each wait for a retry (the lease's renewal)."""
        platform = job.platform

        async def once() -> SendResult:
            if on_wire is not None:
                client = self.clients.get(bot_key(platform, job.bot_id))
                if client is None:
                    return SendResult(ok=False, error=f"no HTTP client for bot {job.bot_id}", retryable=False)
                return await send_http(client, codec, call, on_wire)
            if self.socket_sender is None:
                return SendResult(ok=False, error="connect: no socket sender in this process", retryable=True)
            return await self.socket_sender(codec, str(job.bot_id), call, self.settings.timeout_s)

        def on_retry(result: SendResult, wait: float) -> None:
            metrics.DELIVERY_RETRIES.inc(platform=platform)
            log.info(
                "platform %s answered %s for %s; retry in %.2f s", platform, result.error, job.reply_id, wait
            )

        return await retry_step(
            once,
            deadline_s=deadline_s,
            base_s=self.settings.backoff_base_s,
            cap_s=self.settings.backoff_max_s,
            before_wait=before_wait,
            on_retry=on_retry,
        )


def _put(ids: list[str | None], step: int, message_id: str | None) -> None:
    """Set the id of ``step`` in ``ids`` (appending when it is the next one)."""
    if step < len(ids):
        ids[step] = message_id
    else:
        ids.extend([None] * (step - len(ids)))
        ids.append(message_id)

"""Which of a chat's replies a delivery actor sends next, and in what order
(docs/decisions.md#delivery-outbox): first the replies notified as the chat's head, with their job
(``DeliveryJob.head_at``: sent without reading the chat's queue), then — when a notification
without a head or the sweep asked for it, or a head could not be sent without it — the chat's
queue, read from the ledger without a write, in ledger order.

A drain of one chat runs in that chat's chain (:class:`runtime.delivery.chains.ChatChains`); the
sending of each reply is the caller's (:meth:`runtime.delivery.core.DeliverySender._deliver_traced`).
Nothing here imports Ray.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Container
from typing import Protocol

from runtime.delivery import ledger, outbox
from runtime.delivery.job import DeliveryJob
from runtime.delivery.settings import DeliveryResult
from runtime.memory.db import Database

__all__ = ["ChatDrain", "SendOne"]

log = logging.getLogger("sessionray.delivery")

QUEUE_BATCH = 50
"""Rows of a chat's queue read at once."""


class SendOne(Protocol):
    """Send one reply of a drain: ``fresh`` is its ``queued`` row as read or notified when nobody
    worked on it yet (claimed by its step 0's mark on the wire), ``read_at`` the queue read's
    ``time.time_ns()`` start and end (the reply's trace starts with it).

    Raises:
        runtime.delivery.ledger.LostLeaseError: another owner has the reply (or it is not the row
            read any more).
    """

    def __call__(
        self,
        job: DeliveryJob,
        *,
        queued: bool,
        fresh: ledger.LedgerEntry | None = None,
        read_at: tuple[int, int] | None = None,
    ) -> Awaitable[DeliveryResult]: ...


class ChatDrain:
    """The drains of one delivery actor's chats (create and use on one event loop).

    Args:
        db: The ledger's database.
        partition: The actor's partition (a notified head's ledger ``partition``).
        send: Sends one reply (:class:`SendOne`).
        running: The reply ids a direct call is sending or waiting with (never sent by a drain).
        wake: Queues another drain of a chat (the replies after one a direct call waits with).
    """

    def __init__(
        self,
        db: Database,
        partition: int,
        send: SendOne,
        running: Container[str],
        wake: Callable[[str], None],
    ) -> None:
        self.db, self.partition = db, partition
        self._send, self._running, self._wake = send, running, wake
        self._heads: dict[str, list[tuple[DeliveryJob, ledger.LedgerEntry]]] = {}
        """Per chat, the jobs notified as its head (``DeliveryJob.head_at``) not sent yet, each
        with its ``queued`` row as the hand-over wrote it."""
        self._reads: set[str] = set()
        """The chats whose queue the next drain reads (a wake-up without a head)."""

    def note(self, session_key: str, head: DeliveryJob | None) -> None:
        """Remember what the next drain of ``session_key`` must do: send ``head`` (a job with
        ``head_at``), else read the chat's queue."""
        if head is not None and head.head_at is not None:
            entry = outbox.queued_entry(head, self.partition, head.head_at)
            self._heads.setdefault(session_key, []).append((head, entry))
        else:
            self._reads.add(session_key)

    async def __call__(self, session_key: str) -> None:
        """Send the chat's heads noted since the last drain, in the order they came, then — when
        a wake-up without a head asked for it, or a head could not be sent without it — the
        chat's queue (:meth:`_drain_queue`)."""
        heads = self._heads.pop(session_key, [])
        read = session_key in self._reads
        self._reads.discard(session_key)
        for job, entry in heads:
            if not await self.send_head(job, entry):
                read = True
        if read:
            await self._drain_queue(session_key)

    async def send_head(self, job: DeliveryJob, entry: ledger.LedgerEntry) -> bool:
        """Send ``job``, notified as its chat's head, as the fresh ``queued`` row ``entry`` it was
        written as (claimed by its step 0's mark on the wire). False when the chat's queue must
        be read instead: a direct call of it waits in this chain, or someone claimed it since
        (the read finds it owned or final), or a live owner holds it."""
        if job.reply_id in self._running:
            return False
        try:
            result = await self._send(job, queued=True, fresh=entry)
        except ledger.LostLeaseError as exc:
            log.info("%s; reading the chat's queue", exc)
            return False
        return result.outcome != "busy"

    async def _drain_queue(self, session_key: str) -> None:
        """Send the chat's ``queued``/``pending`` replies in ledger order until none is left, or
        one is owned by another live actor (the sweep comes back for it). The queue is read
        without a write: a queued row nobody worked on yet is claimed by the mark of its first
        step on the wire (:func:`runtime.delivery.ledger.claim_fresh`), any other by its claim
        before it is sent (docs/decisions.md#delivery-outbox)."""
        while True:
            started = time.time_ns()
            read = functools.partial(outbox.chat_queue, self.db, session_key, QUEUE_BATCH)
            entries = await self.db.run(read)
            read_at = (started, time.time_ns())
            for i, entry in enumerate(entries):
                if entry.reply_id in self._running:  # a direct call of it waits in this chain
                    self._wake(session_key)  # the rest after it
                    return
                job = DeliveryJob.model_validate_json(entry.job_json)
                try:
                    result = await self._send(
                        job,
                        queued=True,
                        fresh=entry if ledger.fresh(entry) else None,
                        read_at=read_at if i == 0 else None,
                    )
                except ledger.LostLeaseError as exc:
                    log.warning("%s; leaving it to its new owner", exc)
                    return
                if result.outcome == "busy":
                    return
            if len(entries) < QUEUE_BATCH:  # a reply queued meanwhile came with its own wake-up
                return

"""A session host's own sending of its chats' head replies (docs/decisions.md#delivery-in-host).

With ``runtime.deliver_in_host`` (on in the single-machine profile on SQLite), a reply whose ledger row was
its chat's only unfinished one when the turn wrote it (``DeliveryJob.head_at`` set), of a bot
over HTTP and without attachments, is sent by the session host that wrote it, in its own process,
as the chat's delivery actor would send it (the same :class:`~runtime.delivery.core.DeliverySender`
and :meth:`runtime.delivery.drain.ChatDrain.send_head`: claimed by its step 0's mark on the wire,
the same ledger, retries and close). That is one Ray
call less on the message's path. Every other reply goes to the chat's delivery actor as before.

Order of a chat's replies: a reply handed over while one of the same chat is being sent here is
not its chat's head (that one is unfinished), and its chat's delivery actor is told about it
only when the sends here of that chat have ended; a head the sender here could not send (someone
claimed it since, or it could not be sent without reading the chat's queue) is left to the
delivery actor the same way. A host that dies mid-send leaves a ``pending`` row under its owner
id, ``host:<its supervisor's incarnation>:<its Ray actor id>``
(:func:`runtime.delivery.owners.host_owner`): the host supervisor hands the replies of a dead
host's owner to the delivery actors (``DeliveryPool.take_over``).

Nothing here imports Ray.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.delivery.job import DeliveryJob, partition_of
from runtime.delivery.owners import HOST_OWNER_PREFIX, host_owner

if TYPE_CHECKING:
    from runtime.delivery.core import DeliverySender
    from runtime.memory.db import Database

__all__ = ["HOST_OWNER_PREFIX", "HostSender", "host_owner", "open_sender"]

log = logging.getLogger("sessionray.delivery")

Notify = Callable[[str, "DeliveryJob | None"], None]
"""``notify(session_key, head)``: tell the chat's delivery actor, without waiting
(``DeliveryPool.notify``)."""


class HostSender:
    """The head replies a session host sends itself (create and use on the sessions' loop).

    Args:
        make_sender: Builds the host's :class:`~runtime.delivery.core.DeliverySender` on the
            first reply it sends (the sender's HTTP client and codecs are not loaded before).
        notify: Tells a chat's delivery actor about its replies (:data:`Notify`).
        partitions: Delivery actors in the pool (a chat's ledger ``partition`` is
            ``crc32(session_key) % partitions``).
    """

    def __init__(self, make_sender: Callable[[], DeliverySender], notify: Notify, partitions: int) -> None:
        self._make_sender = make_sender
        self._sender: DeliverySender | None = None
        self._notify = notify
        self._partitions = partitions
        self._sending: dict[str, int] = {}
        """Per chat, its replies being sent here now."""
        self._told_after: set[str] = set()
        """Chats whose delivery actor is told once their sends here have ended."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def sending(self) -> int:
        """Replies being sent here now."""
        return sum(self._sending.values())

    def hand_over(self, job: DeliveryJob) -> None:
        """A turn queued ``job`` in the ledger: send it here when it is its chat's head and may
        be (:meth:`_here`), else tell its chat's delivery actor — once the chat's sends here
        have ended, when there are any (module docstring). Returns at once."""
        key = job.session_key
        try:
            here = not self._closed and self._here(job)
        except Exception:  # the sender could not be built: the chat's delivery actor sends it
            log.exception("the host's sender could not start; %s goes to its delivery actor", job.reply_id)
            here = False
        if here:
            self._sending[key] = self._sending.get(key, 0) + 1
            task = asyncio.ensure_future(self._send(job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif key in self._sending:
            self._told_after.add(key)
        else:
            self._notify(key, job if job.head_at is not None else None)

    def _here(self, job: DeliveryJob) -> bool:
        """``job`` is its chat's head, of a bot over HTTP, without attachments."""
        if job.head_at is None:
            return False
        from runtime.delivery.settings import bot_key, has_media

        sender = self._sender_now()
        return bot_key(job.platform, job.bot_id) not in sender.socket_bots and not has_media(job.reply)

    def _sender_now(self) -> DeliverySender:
        if self._sender is None:
            self._sender = self._make_sender()
        return self._sender

    async def _send(self, job: DeliveryJob) -> None:
        key = job.session_key
        sent = False
        try:
            sent = await self._send_head(job, partition_of(key, self._partitions))
        except Exception:
            log.exception("delivery of %s in its host failed; its delivery actor takes it", job.reply_id)
            await self._release(job.reply_id)
        finally:
            left = self._sending.pop(key, 1) - 1
            if left > 0:
                self._sending[key] = left
            if not sent:
                self._told_after.add(key)
            if left == 0 and key in self._told_after:
                self._told_after.discard(key)
                self._notify(key, None)
            elif left == 0:
                await self._tell_if_queued(key)

    async def _release(self, reply_id: str) -> None:
        """End the lease of ``reply_id`` when this host holds it (its send raised after its
        claim), so the chat's delivery actor, told next, takes it at once."""
        from runtime.delivery import ledger

        sender = self._sender_now()
        db, owner = sender.db, sender.owner
        try:
            await db.run_write(lambda: ledger.release_owner(db, owner, reply_id=reply_id))
        except Exception:  # its lease runs out instead
            log.warning("could not end the lease of %s; it runs out", reply_id, exc_info=True)

    async def _tell_if_queued(self, key: str) -> None:
        """After the last send here of chat ``key``: tell its delivery actor when the chat still has
        unfinished replies that were not handed over here — an operator's retry, or a reply of
        the session on another host it moved to — which its actor, finding the head owned by
        this host, left for later (one read, after the reply reached the platform)."""
        from runtime.delivery import outbox

        sender = self._sender_now()
        try:
            waiting = await sender.db.run(lambda: outbox.chat_queue(sender.db, key, 1))
        except Exception:  # the actor's sweep finds them
            log.warning(
                "could not read the queue of %s after its send; the sweep finds it", key, exc_info=True
            )
            return
        if waiting and key not in self._sending:  # a head sent here since does this itself
            self._notify(key, None)

    async def _send_head(self, job: DeliveryJob, partition: int) -> bool:
        """Send ``job`` (``head_at`` set) in its chat's chain of the host's sender, claimed by its
        step 0's mark on the wire as the fresh ``queued`` row of ledger ``partition`` it was
        written as; returns once it is final or given up. False when the chat's delivery actor
        must read the chat's queue instead: someone claimed the reply since, or it could not be
        sent (:meth:`runtime.delivery.drain.ChatDrain.send_head`)."""
        from runtime.delivery import outbox

        if job.head_at is None:  # not its chat's head: never sent here (_here)
            return False
        sender = self._sender_now()
        entry = outbox.queued_entry(job, partition, job.head_at)
        return await sender.chains.run(job.session_key, lambda: sender.drain.send_head(job, entry))

    async def close(self, timeout_s: float) -> None:
        """Send nothing more here (later replies go to their delivery actors), wait at most
        ``timeout_s`` seconds for the sends here, end the leases of the rows this host still holds
        (so the next sweep takes them at once: docs/decisions.md#delivery-in-host), then stop the
        sends left and close the sender's HTTP clients (the database is the host's)."""
        self._closed = True
        sender = self._sender
        if sender is None:
            return
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        from runtime.delivery import ledger

        db, owner = sender.db, sender.owner
        try:
            await db.run_write(lambda: ledger.release_owner(db, owner))
        except Exception:  # the database is gone: the leases run out instead
            log.warning("could not end the leases of %s; they run out", owner, exc_info=True)
        await sender.close()


def open_sender(settings_source: object, db: Database, owner: str) -> DeliverySender:
    """A :class:`~runtime.delivery.core.DeliverySender` for a session host: the delivery settings
    of ``settings_source`` (a ``runtime.config.Config``), the host's database ``db``, owner id
    ``owner`` (:func:`host_owner`), no socket sender (the host sends to bots over HTTP only)."""
    from runtime.delivery.core import DeliverySender, DeliverySettings

    return DeliverySender(DeliverySettings.from_config(settings_source), -1, owner, db=db)

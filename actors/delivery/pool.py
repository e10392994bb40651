"""The delivery pool: M ``DeliveryActor``s that send validated replies to the platforms
(docs/decisions.md#delivery-partitioned).

How a reply gets here (docs/decisions.md#delivery-outbox): a session's turn records it in the
ledger as ``queued`` (in the transaction of its ``im_reply`` record) and calls
:meth:`DeliveryPool.notify` without waiting — a fire-and-forget ``notify`` to the chat's actor,
which drains that chat's unfinished ledger rows in order. A notification lost with a dead actor
costs nothing: every incarnation sweeps its partition's ``queued``/``pending`` rows when it starts
(and every ``delivery.sweep_s``). :meth:`DeliveryPool.deliver` still sends a job and awaits the
result (ingress notices, tests).

Flow of one reply (``runtime.delivery.core.DeliverySender``)::

    ledger claim (reply_id)          ── final already → outcome "duplicate", nothing sent
    media check (runtime.reply.media)      ── unusable attachments (the bot's own media_dir confines
                                        ``path`` media) and non-http(s) share links become a
                                        short notice text
    codec.render(reply, target)      ── N ApiCalls, in order
    for each step: ledger in_flight (over HTTP as the request is written; over a socket the
                   claim marks step 0) → HTTP call (a OneBot bot on a WebSocket: through its
                   ``OneBotLink`` actor, actors.delivery.onebot_link) → codec.parse_send_result → ledger done
                   429/5xx/connect error: retried with exponential backoff + full jitter, or
                   exactly the platform's Retry-After, until the reply is delivery.max_age_s old
                   (then "failed"); written but unanswered: "uncertain", not resent
    ledger sent/failed/uncertain — "sent" with the outbound transcript row in the same
                   transaction as the last step's done (a savepoint; docs/decisions.md#memory-transcripts)

Why M actors picked by a stable hash: one chat's replies always go through the same actor, so
they leave in order; ``zlib.crc32`` is stable across processes (Python's ``hash()`` of a str is
salted per process, so two ingress replicas would disagree; docs/decisions.md#delivery-partitioned).
Inside an actor each chat has its own chain, so one chat waiting out an outage holds back only
its own later replies (docs/decisions.md#delivery-outage).

Crash safety (docs/decisions.md#delivery-ledger): delivery actors run with ``max_restarts=-1`` and
``max_task_retries=0`` (a send is not idempotent by accident). The ledger holds each job, so the
restarted incarnation of a dead actor resumes its partition's unfinished replies at start-up, and
any actor resumes one whose lease expired; a step that was on the wire when its owner died is
recorded ``uncertain`` and not sent again (docs/decisions.md#delivery-uncertain). A caller whose
``deliver`` call failed because the actor died may call again: the ledger turns it into a no-op or
a resume, never a second send.

Actors are named ``sessionray-delivery-{i}`` in namespace ``sessionray`` (detached, so a Ray
Serve ingress replica finds them by name).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Callable
from typing import Any

import ray

from actors.delivery.handles import NAMESPACE, DeliveryPool, delivery_actor_name
from actors.raylife.self_kick import kick_self
from runtime import tracing
from runtime.delivery.core import DeliveryJob, DeliveryResult, DeliverySettings, partition_of

__all__ = [
    "NAMESPACE",
    "DeliveryActor",
    "DeliveryJob",
    "DeliveryPool",
    "DeliveryResult",
    "DeliverySettings",
    "create_pool",
    "delivery_actor_name",
    "partition_of",
]

log = logging.getLogger("sessionray.delivery")


@ray.remote(max_restarts=-1, max_task_retries=0, num_cpus=0)
class DeliveryActor:
    """One member of the delivery pool (async Ray actor; see module docstring).

    Args:
        index: This actor's partition (``0 <= index < size``).
        settings: :class:`DeliverySettings`.
        sweep_s: Period of the sweep for unfinished replies nobody woke it for, in seconds (0:
            only once, at start-up); None: ``settings.sweep_s``.
    """

    def __init__(self, index: int, settings: DeliverySettings, sweep_s: float | None = None) -> None:
        # Imported here, not named as module globals by the class: Ray ships an actor class by
        # value and every process that gets a handle on it loads the globals its methods name
        # (docs/decisions.md#ops-lazy-exports) — the sender's HTTP client and SQL stay here.
        from actors.delivery.onebot_link import LinkSender
        from actors.raylife.metrics import install_ray_metrics
        from runtime.delivery.core import DeliverySender

        install_ray_metrics()
        tracing.configure(settings.tracing, "delivery")
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per platform call is noise
        self.index = index
        self.owner = f"{index}:{uuid.uuid4().hex[:12]}"
        # Bots on a OneBot WebSocket are reached through their link actor (actors.delivery.onebot_link).
        self.sender = DeliverySender(settings, index, self.owner, socket_sender=LinkSender())
        self.sweep_s = settings.sweep_s if sweep_s is None else sweep_s
        self._tasks: list[asyncio.Task[Any]] = []
        # Start the sweep as soon as this incarnation runs (a restarted actor resumes the replies
        # its dead predecessor left, and the queued ones it was never told about, at once).
        kick_self("ready", f"delivery actor {self.owner} (its sweep)")

    async def _start(self) -> None:
        if not self._tasks:
            self._tasks.append(asyncio.create_task(self._sweep_loop()))

    async def _sweep_loop(self) -> None:
        while True:
            try:
                await self.sender.sweep()
            except Exception:
                log.exception("delivery sweep failed")
            if self.sweep_s <= 0:
                return
            await asyncio.sleep(self.sweep_s)

    async def deliver(self, job: DeliveryJob) -> DeliveryResult:
        """Send ``job`` (idempotent per ``job.reply_id``); see :class:`DeliveryResult`."""
        await self._start()
        return await self.sender.deliver(job)

    async def notify(self, session_key: str, head: DeliveryJob | None = None) -> None:
        """A reply of ``session_key`` was queued in the ledger: send the chat's unfinished replies
        in order (returns at once; callers do not wait for it). ``head``: the reply, when its row
        was the chat's only unfinished one: sent without a read of the chat's queue
        (:meth:`runtime.delivery.core.DeliverySender.wake`)."""
        await self._start()
        self.sender.wake(session_key, head)

    async def take_over(self, owner: str) -> int:
        """``owner`` (a session host's ledger owner id) is dead: take its ``pending`` rows of this
        partition over (this actor holds them now, so no other actor's sweep takes them) and
        sweep, so its replies are resumed at once (docs/decisions.md#delivery-in-host); returns
        how many rows were taken."""
        from runtime.delivery import ledger

        return await self._take(owner, functools.partial(ledger.release_owner, owner=owner))

    async def take_over_orphans(self, keep: str) -> int:
        """:meth:`take_over` of every session host's rows whose owner id does not start with
        ``keep``: the host supervisor (re)started, and the hosts of its previous incarnation died
        with it (``runtime.delivery.owners.incarnation_prefix``); returns how many rows were taken."""
        from runtime.delivery import ledger

        return await self._take(
            "hosts that are gone", functools.partial(ledger.release_dead_hosts, keep=keep)
        )

    async def _take(self, whose: str, release: Callable[..., int]) -> int:
        """``release(db, partition=, to=, lease_ms=)`` (a ledger release) of this actor's
        partition, to this actor, then a sweep."""
        await self._start()
        db, partition, lease_ms = self.sender.db, self.sender.partition, self.sender.lease_ms
        released = await db.run_write(
            lambda: release(db, partition=partition, to=self.owner, lease_ms=lease_ms)
        )
        if released:
            log.info("delivery actor %s takes over %d reply(ies) of %s", self.owner, released, whose)
        await self.sender.sweep()
        return released

    async def sweep(self) -> int:
        """Wake every chat of this partition with unfinished replies now; returns how many."""
        await self._start()
        return await self.sender.sweep()

    async def ready(self) -> str:
        """Start the recovery sweep and return this incarnation's owner id (``"{index}:{hex}"``)."""
        await self._start()
        return self.owner

    async def pid(self) -> int:
        """This actor's OS process id (tests kill it with SIGKILL)."""
        import os

        return os.getpid()


def create_pool(
    settings: DeliverySettings,
    size: int,
    *,
    prefix: str = "sessionray-delivery",
    sweep_s: float | None = None,
) -> DeliveryPool:
    """Create (or attach to existing) ``size`` detached named :class:`DeliveryActor` s in namespace
    ``sessionray``; their :class:`~actors.delivery.handles.DeliveryPool`. Call its ``ready`` to wait
    until they run.

    Raises:
        ValueError: ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"runtime.delivery_actors must be >= 1, got {size}")
    handles = [
        DeliveryActor.options(  # type: ignore[attr-defined]
            name=delivery_actor_name(i, prefix),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
        ).remote(i, settings, sweep_s)
        for i in range(size)
    ]
    return DeliveryPool(handles, prefix)

"""Handing a session's replies to delivery, without Ray (docs/decisions.md#delivery-outbox).

A reply is handed over in one write transaction — the records that go with it (a turn's final
answer and ``im_reply`` markers) and the reply's ``queued`` row in the delivery ledger — then
delivery is notified without waiting for the platform.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from runtime import tracing
from runtime.delivery.job import DeliveryJob, partition_of
from runtime.delivery.outbox import queue_writer
from runtime.llm.types import AgentMessage, now_ms
from runtime.session.turn import DeliverFn, SessionWriter

__all__ = ["HandOver"]

log = logging.getLogger("sessionray.session")


class HandOver:
    """The hand-over of one session's replies.

    Args:
        session_key: The session's key (its ledger ``partition`` is
            ``crc32(session_key) % delivery_partitions``).
        writer: ``() -> SessionWriter``: the session's writer at the time of each hand-over.
        deliver: ``() -> DeliverFn``: the notification of delivery in force.
        delivery_partitions: ``runtime.delivery_actors``.
    """

    def __init__(
        self,
        session_key: str,
        writer: Callable[[], SessionWriter],
        deliver: Callable[[], DeliverFn],
        delivery_partitions: int,
    ) -> None:
        self._writer, self._deliver = writer, deliver
        self._partition = partition_of(session_key, delivery_partitions)

    async def __call__(self, job: DeliveryJob, records: list[AgentMessage]) -> None:
        """Append ``records`` and ``job``'s ``queued`` ledger row in one transaction, then notify
        delivery without waiting for the platform (docs/decisions.md#delivery-outbox). The ledger
        places the row after the chat's unfinished ones
        (``runtime.delivery.outbox.next_created_at``): the chat's order. When there were none, the
        notified job carries the row's ``created_at`` as ``head_at``, and the delivery actor sends
        it without reading the chat's queue.

        Raises:
            Whatever the append raises (then neither the records nor the row were written).
        """
        with tracing.span("handoff", reply_id=job.reply_id) as step:
            if (tp := step.traceparent()) is not None:  # delivery continues the trace from here
                job = job.model_copy(update={"traceparent": tp})
            row = queue_writer(job, self._partition, now_ms())
            await self._writer().append(records, also=row)
        if row.head_at is not None:  # the chat's only unfinished reply: sent without a read
            job = job.model_copy(update={"head_at": row.head_at})
        try:
            await self._deliver()(job)
        except Exception:  # the row is durable: the delivery actor's sweep sends it
            log.exception("notifying delivery of %s failed; its sweep will send it", job.reply_id)

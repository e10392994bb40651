"""A claimed reply on its way out (docs/decisions.md#delivery-ledger): its lease, renewed before a
wait it would not outlast (rule 3: ownership moves only once a lease expired), and its send plan,
the state :class:`runtime.delivery.core.DeliverySender` carries from the claim to the close."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.delivery import ledger
from runtime.delivery.job import DeliveryJob
from runtime.llm.types import now_ms
from runtime.memory.db import Database
from runtime.platforms.base import ApiCall, PlatformCodec
from runtime.reply.segments import Reply

__all__ = ["Lease", "Sending"]


class Lease:
    """``owner``'s lease on reply ``reply_id``.

    Args:
        db: Where the ledger is (a renewal is one write).
        reply_id / owner: The reply and its owner (``"{partition}:{incarnation}"``).
        lease_ms: A claim's lease in ms (what a claim or ``begin_step`` grants).
        call_timeout_s: One platform call's timeout in seconds (a renewal outlasts a wait plus one
            call plus 10 s).
    """

    def __init__(self, db: Database, reply_id: str, owner: str, lease_ms: int, call_timeout_s: float) -> None:
        self.db, self.reply_id, self.owner = db, reply_id, owner
        self.lease_ms, self.call_timeout_s = lease_ms, call_timeout_s
        self.until_ms = now_ms() + lease_ms

    def refreshed(self) -> None:
        """A ledger write just renewed it (claim, begin_step)."""
        self.until_ms = now_ms() + self.lease_ms

    async def cover(self, wait_s: float) -> None:
        """Make the lease outlast a wait of ``wait_s`` plus one call (one ledger write when it
        would not).

        Raises:
            runtime.delivery.ledger.LostLeaseError: another owner took the reply over.
        """
        need_ms = int((wait_s + self.call_timeout_s + 10) * 1000)
        if self.until_ms - now_ms() < need_ms:
            lease_ms = need_ms + self.lease_ms
            self.until_ms = await self.db.run_write(
                lambda: ledger.renew(self.db, self.reply_id, self.owner, lease_ms)
            )


@dataclass
class Sending:
    """One claimed reply on its way out: its calls (one a step), the steps still to send in order
    (``plan``), the platform's message id of each step so far (``ids``, None for an uncertain one)
    and what its ``DeliveryResult`` reports."""

    job: DeliveryJob
    codec: PlatformCodec
    calls: list[ApiCall]
    lease: Lease
    started: float
    """``time.perf_counter()`` when the delivery began, in seconds (the latency metric)."""
    record: Reply | None
    """The reply whose outbound transcript row is still to be written; None once it is, or for a
    resend (its row exists)."""
    over_socket: bool
    """The bot sends over a socket (``transport: ws-*``), not HTTP."""
    begun: bool = False
    """The claim marked step 0 in flight."""
    claim_at_wire: int | None = None
    """Not None while the reply is still the fresh ``queued`` row it was read (or notified) as, not
    claimed: that row's ``created_at`` (Unix ms). The mark of step 0 on the wire claims it
    (:func:`runtime.delivery.ledger.claim_fresh`), or a claim before a wait or a close does when
    step 0 failed before its mark (docs/decisions.md#delivery-outbox)."""
    ids: list[str | None] = field(default_factory=list)
    plan: list[int] = field(default_factory=list)
    uncertain: bool = False
    transcript: ledger.StepExtra | None = None
    deadline_s: float = 0.0
    """Unix time in seconds after which a retryable failure is final (``delivery.max_age_s``)."""
    attempts: int = 0
    waits: list[float] = field(default_factory=list)

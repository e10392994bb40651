"""Handles on the delivery pool (:class:`DeliveryPool`): the M named ``DeliveryActor`` s
(:mod:`actors.delivery.pool`), picked by a stable hash of the session key
(docs/decisions.md#delivery-partitioned).

Apart from the actor's module so that a process which only holds or passes on a pool — the host
supervisor hands it to every session host it starts — does not import the sender's HTTP client
and SQL with it (docs/decisions.md#ops-lazy-exports); a pickled pool names this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray

from runtime.delivery.job import DeliveryJob, partition_of

if TYPE_CHECKING:
    from runtime.delivery.core import DeliveryResult

__all__ = ["NAMESPACE", "DeliveryPool", "delivery_actor_name"]

log = logging.getLogger("sessionray.delivery")

NAMESPACE = "sessionray"
"""Ray namespace of every named sessionray actor (actor interfaces, contract 4)."""


def delivery_actor_name(index: int, prefix: str = "sessionray-delivery") -> str:
    """``sessionray-delivery-{index}`` (actor interfaces, contract 4)."""
    return f"{prefix}-{index}"


class DeliveryPool:
    """Handles of the M named DeliveryActors; ``pick(session_key)`` chooses by stable hash.

    Create once with :func:`actors.delivery.pool.create_pool` (the runtime start), or attach from
    another process (a Ray Serve replica) with :meth:`lookup`.
    """

    def __init__(self, handles: Sequence[Any], prefix: str = "sessionray-delivery") -> None:
        if not handles:
            raise ValueError("a delivery pool needs at least one actor")
        self.handles = list(handles)
        self.prefix = prefix

    @property
    def size(self) -> int:
        """M, the number of delivery actors."""
        return len(self.handles)

    @classmethod
    def lookup(cls, size: int, *, prefix: str = "sessionray-delivery") -> DeliveryPool:
        """Attach to the running named actors. Raises ``ValueError`` when one is missing."""
        names = [delivery_actor_name(i, prefix) for i in range(size)]
        return cls([ray.get_actor(name, namespace=NAMESPACE) for name in names], prefix)

    async def ready(self) -> list[str]:
        """Wait until every actor runs; returns their owner ids."""
        return list(await asyncio.gather(*[h.ready.remote() for h in self.handles]))

    def pick(self, session_key: str) -> Any:
        """The actor handle for ``session_key``: ``handles[crc32(session_key) % M]``."""
        return self.handles[partition_of(session_key, self.size)]

    def partition(self, session_key: str) -> int:
        """``crc32(session_key) % M``: the ledger ``partition`` of the chat's replies."""
        return partition_of(session_key, self.size)

    def notify(self, session_key: str, head: DeliveryJob | None = None) -> None:
        """Tell the chat's actor that a reply of ``session_key`` was queued in the ledger, without
        waiting (fire and forget: a lost notification is made good by the actor's sweep). ``head``:
        the reply, when its row was the chat's only unfinished one (``DeliveryJob.head_at`` set):
        the actor sends it without reading the chat's queue (docs/decisions.md#delivery-outbox)."""
        try:
            self.pick(session_key).notify.remote(session_key, head)
        except Exception as exc:  # e.g. the actor is being restarted: its start-up sweep finds it
            log.warning("delivery notification for %s not sent (%r); the sweep finds it", session_key, exc)

    def take_over(self, owner: str) -> None:
        """``owner``, a session host's ledger owner id, is dead: every actor ends the leases of
        that owner's ``pending`` rows of its partition and sweeps (``DeliveryActor.take_over``),
        without waiting (docs/decisions.md#delivery-in-host). A call that cannot be sent is
        logged: the rows' leases run out and the periodic sweep takes them."""
        self._each("take_over", owner)

    def take_over_orphans(self, keep: str) -> None:
        """:meth:`take_over` of every session host's rows whose owner id does not start with
        ``keep`` (``DeliveryActor.take_over_orphans``): the host supervisor whose incarnation
        ``keep`` names (``runtime.delivery.owners.incarnation_prefix``) started, and the hosts of
        its previous incarnation (or of an earlier Ray instance) are gone."""
        self._each("take_over_orphans", keep)

    def _each(self, method: str, arg: Any) -> None:
        for handle in self.handles:
            try:
                getattr(handle, method).remote(arg)
            except Exception as exc:
                log.warning("%s(%r) not sent (%r); the replies' leases run out", method, arg, exc)

    async def deliver(self, job: DeliveryJob, *, restart_wait_s: float = 60.0) -> DeliveryResult:
        """``pick(job.session_key).deliver(job)``; if the actor died mid-call, call again until its
        restarted incarnation answers (it resumes from the ledger, so nothing is sent twice).

        Args:
            restart_wait_s: How long to keep calling a dead/restarting actor, in seconds
                (a restart takes ≈ 1.4 s idle, much longer on a loaded machine).

        Raises:
            ray.exceptions.RayActorError: the actor did not come back within ``restart_wait_s``.
        """
        handle = self.pick(job.session_key)
        deadline = time.monotonic() + restart_wait_s
        delay = 0.25
        while True:
            try:
                result: DeliveryResult = await handle.deliver.remote(job)
                return result
            except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError) as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning(
                    "delivery actor for %s unavailable (%s); calling its restart",
                    job.session_key,
                    type(exc).__name__,
                )
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)

    def stop(self) -> None:
        """Kill every delivery actor (no restart)."""
        for h in self.handles:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(h, no_restart=True)

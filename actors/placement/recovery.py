"""The inbox recovery loop of one router shard (docs/decisions.md#inbox-durable).

Every router shard (:class:`actors.placement.router.RouterActor`) runs one :class:`InboxRecovery` for its
own keys (``key_hash % shards == shard``), from the moment its incarnation starts — so the first
pass after a start-up or a restart of the shard comes at once — and then every :data:`PERIOD_S`
seconds. A pass that finds no open row of its keys is one read (no write, no writer lock); else:

1. **expires** every open row (``stored`` / ``routed``) older than ``runtime.replay_window_s``:
   never replayed, each logged at WARNING and counted
   (``sessionray_inbox_recovery_total{outcome="expired"}``);
2. reads the open rows older than :data:`GRACE_S` (the ingress that stored a row is still sending
   it meanwhile) and younger than the window, in inbox order, and re-submits them **per session
   key, one after another in that order** (keys in parallel), through the normal host path: the
   shard's own ``place``, then the host's streaming ``submit`` (:class:`actors.placement.submit.SubmitPath`,
   with its watch, crash retry and inbox marks). Each goes with ``attempt=1`` — also a row never
   marked ``routed``, whose mark may have been lost: a host that still has the message (in its
   mailbox or turn) answers ``duplicate``; a session re-activated after a crash resumes a started
   turn from its recorded inbound marker without re-running its tools, and one whose reply was
   already handed over answers ``already_done``; a message no turn ever started (no marker) runs
   as a first delivery does. ``accepted`` adds one to
   the row's ``attempts`` (outcome ``resubmitted``); ``duplicate`` of a message whose reply is
   recorded marks it handled (outcome ``handled``); ``duplicate`` of a turn still running on a
   live host, ``busy`` or an error stops the key until the next pass (order kept). An ingress
   that holds the key sends the same rows, in the same order, before the key's next message
   (:mod:`actors.inbound.inbox`): whichever sender comes second gets ``duplicate``;
3. a row a host accepted :data:`runtime.memory.inbox.MAX_ATTEMPTS` times without a result is
   ``failed`` instead of sent again: logged at ERROR, counted (outcome ``failed``);
4. sets ``sessionray_inbox_pending{shard}`` to the shard's open rows, and now and then deletes
   closed rows older than :data:`KEEP_CLOSED_S`.

The shard's :class:`~runtime.memory.db.Database` has one SQL thread and no overflow: one
connection at most, closed after a pass that found nothing open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from pydantic import ValidationError

from actors.placement.admission import KeyOrder
from actors.placement.submit import SubmitPath
from runtime import metrics, tracing
from runtime.llm.types import now_ms
from runtime.memory.db import Database
from runtime.memory.inbox import (
    MAX_ATTEMPTS,
    InboxEntry,
    backlog,
    create_inbox_table,
    expire,
    fail,
    note_attempt,
    pending,
    prune,
)
from runtime.memory.inbox_marks import InboxMarks
from runtime.platforms.base import InboundMessage

__all__ = ["BATCH", "GRACE_S", "KEEP_CLOSED_S", "KEYS_AT_ONCE", "PERIOD_S", "InboxRecovery"]

log = logging.getLogger("sessionray.inbox")

PERIOD_S = 2.0
"""Pause between two passes of one shard, in seconds."""
GRACE_S = 3.0
"""Age (seconds) an open row must reach before a pass re-submits it."""
BATCH = 500
"""Rows one pass reads at most (the rest wait for the next)."""
KEYS_AT_ONCE = 16
"""Session keys one pass re-submits concurrently."""
KEEP_CLOSED_S = 86_400.0
"""Closed rows (handled, expired, failed) are deleted this long after their last change, in seconds
(meanwhile a redelivery of one is answered ``duplicate`` by the inbox itself)."""
PRUNE_EVERY = 300
"""Passes between two prunes."""


class _LocalPlace:
    """``router_of(key)`` for a :class:`SubmitPath` inside the shard: ``place.remote(...)`` calls
    the shard's own ``place`` coroutine (no Ray call to itself)."""

    def __init__(self, place: Callable[..., Awaitable[Any]]) -> None:
        self.place = self
        self._place = place

    def remote(self, *args: Any) -> Awaitable[Any]:
        return self._place(*args)


class InboxRecovery:
    """The recovery loop of shard ``shard`` of ``shards`` (see the module docstring).

    Args:
        database_url: ``database.url``.
        place: The shard's ``place(session_key, stale_epoch, dead_host)`` coroutine function.
        shard / shards: This shard's index and the number of shards.
        replay_window_s: ``runtime.replay_window_s``.
        grace_s / period_s: See :data:`GRACE_S` / :data:`PERIOD_S`.
    """

    def __init__(
        self,
        database_url: str,
        place: Callable[..., Awaitable[Any]],
        *,
        shard: int,
        shards: int,
        replay_window_s: float,
        grace_s: float = GRACE_S,
        period_s: float = PERIOD_S,
    ) -> None:
        self.db = Database(database_url, threads=1, max_overflow=0, write_retry_s=10.0)
        self.marks = InboxMarks(self.db)
        self.path = SubmitPath(_router_of(place), KeyOrder(), self.marks)
        self.shard, self.shards = shard, shards
        self.window_ms = int(replay_window_s * 1000)
        self.grace_ms = int(grace_s * 1000)
        self.period_s = period_s
        self._ready = False
        self._passes = 0
        self._lock = asyncio.Lock()
        self.counts = {"passes": 0, "resubmitted": 0, "handled": 0, "expired": 0, "failed": 0, "errors": 0}

    async def run(self) -> None:
        """Pass after pass until cancelled; a failed pass is logged and the loop goes on."""
        while True:
            try:
                await self.pass_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.counts["errors"] += 1
                log.warning("inbox recovery pass of shard %d failed: %r", self.shard, exc)
            await asyncio.sleep(self.period_s)

    async def pass_once(self) -> dict[str, int]:
        """One pass now (passes of one shard never overlap); returns the counters so far."""
        async with self._lock:
            await self._pass()
        return dict(self.counts)

    async def _pass(self) -> None:
        db = self.db
        if not self._ready:
            await db.run_write(lambda: create_inbox_table(db))
            self._ready = True
        shard, shards = self.shard, self.shards
        open_rows = await db.run(lambda: backlog(db, shard, shards))
        if open_rows:  # an idle pass is this one read: no write, no writer lock
            await self._expire_and_replay()
            open_rows = await db.run(lambda: backlog(db, shard, shards))
        metrics.INBOX_PENDING.set(open_rows, shard=str(shard))
        self._passes += 1
        self.counts["passes"] = self._passes
        if self._passes % PRUNE_EVERY == 1:
            await db.run_write(lambda: prune(db, now_ms() - int(KEEP_CLOSED_S * 1000)))
        if open_rows == 0:
            await db.run(db.release_connections)

    async def _expire_and_replay(self) -> None:
        db, shard, shards = self.db, self.shard, self.shards
        now = now_ms()
        for row in await db.run_write(lambda: expire(db, shard, shards, now - self.window_ms)):
            self.counts["expired"] += 1
            metrics.INBOX_RECOVERY.inc(outcome="expired")
            log.warning(
                "inbox: message %s of %s expired unanswered (older than runtime.replay_window_s = %g s)",
                row.message_id, row.session_key, self.window_ms / 1000,
            )  # fmt: skip
        rows = await db.run(
            lambda: pending(
                db, shard, shards, before_ms=now - self.grace_ms, after_ms=now - self.window_ms, limit=BATCH
            )
        )
        by_key: dict[str, list[InboxEntry]] = {}
        for row in rows:
            by_key.setdefault(row.session_key, []).append(row)
        gate = asyncio.Semaphore(KEYS_AT_ONCE)
        await asyncio.gather(*(self._replay(key_rows, gate) for key_rows in by_key.values()))

    async def _replay(self, rows: list[InboxEntry], gate: asyncio.Semaphore) -> None:
        """Re-submit one key's rows in inbox order; stop at the first that is not taken."""
        db = self.db
        async with gate:
            for row in rows:
                if row.attempts >= MAX_ATTEMPTS:
                    await self._give_up(row, f"a host accepted it {row.attempts} times without a turn result")
                    continue
                try:
                    inbound = InboundMessage.model_validate_json(row.message_json)
                except ValidationError as exc:
                    await self._give_up(row, f"its stored message cannot be read: {exc}")
                    continue
                try:
                    answer = await self._resubmit(inbound)
                except Exception as exc:  # a host or the placement failed: the next pass tries again
                    log.info("inbox: %s of %s not re-submitted yet: %r", row.message_id, row.session_key, exc)
                    return
                status = answer["status"]
                if status == "accepted":
                    await db.run_write(partial(note_attempt, db, row.id))
                elif status != "duplicate" or not answer.get("done"):
                    # busy, or its turn still runs on a live host: keep the key's order, next pass
                    return
                outcome = "resubmitted" if status == "accepted" else "handled"
                self.counts[outcome] += 1
                metrics.INBOX_RECOVERY.inc(outcome=outcome)

    async def _resubmit(self, inbound: InboundMessage) -> Any:
        """Submit a stored message again (``attempt=1``) as a new trace whose root ``replay``
        links to the first attempt's span, the ``traceparent`` kept in its inbox row
        (docs/decisions.md#ops-traces)."""
        first = inbound.traceparent
        with tracing.span("replay", links=(first,) if first else ()) as step:
            if (tp := step.traceparent()) is not None:
                inbound = inbound.model_copy(update={"traceparent": tp})
            return await self.path.submit(inbound, attempt=1)

    async def _give_up(self, row: InboxEntry, why: str) -> None:
        db = self.db
        if await db.run_write(lambda: fail(db, row.id)):
            self.counts["failed"] += 1
            metrics.INBOX_RECOVERY.inc(outcome="failed")
            log.error("inbox: message %s of %s failed: %s", row.message_id, row.session_key, why)

    def status(self) -> dict[str, Any]:
        """The loop's counters plus its submit path's (``submit``)."""
        return {**self.counts, "submit": self.path.status()}

    async def close(self) -> None:
        """Stop watching, write the buffered marks and close the database."""
        with contextlib.suppress(Exception):
            await self.path.close()
        self.db.dispose()


def _router_of(place: Callable[..., Awaitable[Any]]) -> Callable[[str], _LocalPlace]:
    local = _LocalPlace(place)
    return lambda _key: local

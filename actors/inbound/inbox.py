"""The ingress's durable-inbox step for a triggered message that passed the bot's policy
(docs/decisions.md#inbox-durable): store first, then route.

:meth:`InboxGate.take`:

1. writes the message's inbox row and its inbound transcript row in **one** write transaction
   (:class:`runtime.memory.inbox.InboxStore`) — when that fails (SQLite locked, database down) the
   exception propagates and the webhook answers 503: nothing was stored;
2. an inbox conflict (the same platform, bot id and message id stored before) is ``duplicate``:
   the runtime is not called;
3. submits the message (``runtime.submit``) and answers with its status (``accepted`` /
   ``duplicate``); **any** failure from here on — the runtime not started yet, a router shard
   down, a Ray error, the session's mailbox full (``busy``), no answer within
   :data:`SUBMIT_WAIT_S` — is ``queued``: the row is stored, and a router shard's recovery loop
   (:mod:`actors.placement.recovery`) routes it a few seconds later;
4. keeps per-chat order and gets a chat back to the direct path: once a key had a ``queued``
   message here (keys with open rows at start-up — an earlier ingress process died or stopped —
   start out that way), its next message reads, in its store transaction, the key's earlier rows
   that are still open, re-sends them in inbox order (``attempt=1``) and then submits itself,
   all through the runtime's per-key order, so the host stamps them first; when all were taken
   the key is no longer held and its later messages take the plain direct path. An earlier row
   the host does not take (``busy``, an error, no answer in time), more than
   :data:`runtime.memory.inbox.EARLIER_LIMIT` of them, or one the recovery loop is about to give
   up leaves the new message ``queued`` behind them. Such messages of one key pass one at a time.

The inbox marks (``routed`` / ``handled``) are written by the runtime's submit path, batched,
off the answer path (:meth:`actors.placement.runtime.SessionRuntime.attach_inbox`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from functools import partial
from typing import Any

from ray.exceptions import ActorUnavailableError, RayActorError

from actors.placement.admission import KeyOrder
from runtime import tracing
from runtime.memory.db import Database
from runtime.memory.inbox import (
    MAX_ATTEMPTS,
    InboxEntry,
    InboxStore,
    create_inbox_table,
    note_attempts,
    pending_keys,
)
from runtime.memory.transcripts import TranscriptStore
from runtime.platforms.base import InboundMessage

__all__ = ["QUEUED_KEYS", "SUBMIT_WAIT_S", "InboxGate"]

log = logging.getLogger("sessionray.ingress")

SUBMIT_WAIT_S = 2.5
"""How long the webhook waits for the host's first answer before it answers ``queued`` (the
submit goes on in the background; its acceptance is marked as usual), in seconds. Below the 5 s a
OneBot v11 implementation usually waits for a webhook's answer and never redelivers: a host that
is slow to answer (a cold host process in strict mode, a host being replaced after ``kill -9``)
must not turn a stored message into a client-side timeout (docs/decisions.md#inbox-durable)."""
QUEUED_KEYS = 100_000
"""Session keys with queued messages one ingress process remembers (least recently queued dropped)."""
_EXPECTED = (RayActorError, ActorUnavailableError, TimeoutError, RuntimeError)
"""Submit failures that are part of the weather (logged as a warning, not with a traceback)."""


class InboxGate:
    """Store → submit for one ingress process (see the module docstring).

    Args:
        runtime: The session runtime (``submit(msg)``; ``attach_inbox(db)`` when it has one).
        transcripts: The inbound transcript store; the inbox lives on its database.
        replay_window_s: ``runtime.replay_window_s``: open rows younger than this mark their key
            as queued at start-up.
        submit_wait_s: See :data:`SUBMIT_WAIT_S`.

    Raises:
        sqlalchemy.exc.OperationalError: the database is unreachable (creating ``inbox``).
    """

    def __init__(
        self,
        runtime: Any,
        transcripts: TranscriptStore,
        *,
        replay_window_s: float = 600.0,
        submit_wait_s: float = SUBMIT_WAIT_S,
    ) -> None:
        self.transcripts = transcripts
        db: Database = transcripts.db
        create_inbox_table(db)
        self.store = InboxStore(db)
        self._runtime: Any = None
        self.submit_wait_s = submit_wait_s
        self._late: set[asyncio.Future[Any]] = set()
        self._queued: OrderedDict[str, None] = OrderedDict()
        self._order = KeyOrder()
        try:
            since = int((time.time() - replay_window_s) * 1000)
            for key in sorted(pending_keys(db, since)):
                self._queue(key)
        except Exception as exc:  # the recovery loop still routes them; only the order check is lost
            log.warning("inbox: keys with open rows not read at start-up: %r", exc)
        self.runtime = runtime

    @property
    def runtime(self) -> Any:
        """The session runtime messages are submitted to (None: not connected yet — everything
        stored is ``queued``). Setting it also has it mark this process's submissions in the
        inbox (its ``attach_inbox(db)``, when it has one)."""
        return self._runtime

    @runtime.setter
    def runtime(self, runtime: Any) -> None:
        self._runtime = runtime
        attach = getattr(runtime, "attach_inbox", None)
        if callable(attach):
            attach(self.store.db)

    def queued(self, session_key: str) -> bool:
        """Whether later messages of ``session_key`` are held behind a queued one."""
        return session_key in self._queued

    def _queue(self, key: str) -> None:
        self._queued[key] = None
        self._queued.move_to_end(key)
        while len(self._queued) > QUEUED_KEYS:
            self._queued.popitem(last=False)

    async def take(self, msg: InboundMessage, transcript: Mapping[str, Any]) -> str:
        """Store ``msg`` (with its inbound transcript row from the ``record_inbound`` fields
        ``transcript``), then submit it; returns ``accepted`` | ``duplicate`` | ``queued``.

        Messages of a held key (:meth:`queued`) pass one at a time, in arrival order.

        Raises:
            sqlalchemy.exc.OperationalError: the rows could not be stored (answer 503).
        """
        key = msg.session_key
        row = self.transcripts.prepare(direction="inbound", **transcript)
        if key not in self._queued and not self._order.waiting(key):
            return await self._take(msg, row, held=False)
        async with self._order.turn(key):
            return await self._take(msg, row, held=key in self._queued)

    async def _take(self, msg: InboundMessage, row: Any, *, held: bool) -> str:
        key = msg.session_key
        with tracing.span("inbox.store", held=held):
            stored = await self.store.store(
                platform=msg.platform,
                bot_id=msg.bot_id,
                message_id=msg.message_id,
                session_key=key,
                message_json=msg.model_dump_json(),
                with_rows=() if row is None else (row,),
                check_order=held,
            )
        if not stored.stored:
            return "duplicate"
        if stored.more or any(e.attempts >= MAX_ATTEMPTS for e in stored.earlier):
            self._queue(key)  # a long backlog, or one the recovery loop is to give up: its job
            return "queued"
        try:
            with tracing.span("submit") as step:
                if (tp := step.traceparent()) is not None:  # the host's steps are children of this one
                    msg = msg.model_copy(update={"traceparent": tp})
                status = await self._submit(msg, stored.earlier)
                step.set(status=status)
        except Exception as exc:
            self._queue(key)
            if isinstance(exc, _EXPECTED):
                log.warning("message %s of %s queued: %r", msg.message_id, key, exc)
            else:
                log.error(
                    "message %s of %s queued after an unexpected error", msg.message_id, key, exc_info=exc
                )
            return "queued"
        if status not in ("accepted", "duplicate"):  # busy: the mailbox is full, or no host had room
            self._queue(key)
            return "queued"
        self._queued.pop(key, None)
        return status

    async def _submit(self, msg: InboundMessage, earlier: tuple[InboxEntry, ...] = ()) -> str:
        """:meth:`_send`'s status; after :attr:`submit_wait_s` the call goes on in the background
        and this raises :class:`TimeoutError`."""
        if self._runtime is None:
            raise RuntimeError("no session runtime connected yet")
        call = asyncio.ensure_future(self._send(msg, earlier))
        done, _ = await asyncio.wait({call}, timeout=self.submit_wait_s)
        if not done:
            self._late.add(call)
            call.add_done_callback(_forget(self._late))
            raise TimeoutError(f"no answer from the session's host within {self.submit_wait_s:g} s")
        return call.result()

    async def _send(self, msg: InboundMessage, earlier: tuple[InboxEntry, ...]) -> str:
        """Re-send the key's ``earlier`` open rows in inbox order (``attempt=1``: a host that has
        one answers ``duplicate``, one whose turn was cut off resumes it) — but those this
        process's runtime still has in flight (at their host already) — then submit ``msg``;
        the first earlier row not taken (``busy``) is the answer and ``msg`` is not sent
        (docs/decisions.md#inbox-durable)."""
        mine = getattr(self._runtime, "in_flight_ids", None)
        running = mine(msg.session_key) if callable(mine) else set()
        accepted: list[int] = []
        try:
            for entry in earlier:
                if entry.message_id in running:  # accepted by this process: at its host already
                    continue
                inbound = InboundMessage.model_validate_json(entry.message_json)
                status = _status(await self._runtime.submit(inbound, attempt=1))
                if status == "accepted":
                    accepted.append(entry.id)
                elif status != "duplicate":
                    return status
            return _status(await self._runtime.submit(msg))
        finally:
            if accepted:  # one transaction for the drain (docs/decisions.md#inbox-durable)
                db = self.store.db
                await db.run_write(partial(note_attempts, db, accepted))


def _status(result: Any) -> str:
    return str(getattr(result, "status", result))


def _forget(late: set[asyncio.Future[Any]]) -> Any:
    def done(fut: asyncio.Future[Any]) -> None:
        late.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            log.info("a late submit failed (its inbox row stays queued): %r", fut.exception())

    return done

"""Batched state marks of the durable inbox (docs/decisions.md#inbox-durable).

Whoever submits messages to session hosts (the ingress's ``actors.placement.submit.SubmitPath``, a
router shard's recovery loop) marks each row ``routed`` when a host accepted its message and
``handled`` when its ``TurnResult`` came back. Writing each mark at once would add a SQL write per
message to the answer path; :class:`InboxMarks` collects them and writes every :data:`FLUSH_S`
(100 ms) at most one transaction with all of them (:func:`runtime.memory.inbox.mark`), in the
background. A mark lost with its process only makes the recovery loop send the message once more,
which the host answers ``duplicate`` / ``already_done``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from runtime.memory.db import Database
from runtime.memory.inbox import MessageRef, mark, message_ref

__all__ = ["FLUSH_S", "MAX_BUFFERED", "InboxMarks"]

log = logging.getLogger("sessionray.inbox")

FLUSH_S = 0.1
"""Longest time a mark waits before it is written, in seconds."""
MAX_BUFFERED = 100_000
"""Marks kept for a later try when a write fails; beyond this they are dropped (logged)."""


class InboxMarks:
    """Buffers ``routed`` / ``handled`` marks and writes them in one transaction per flush.

    Args:
        db: The :class:`Database` holding ``inbox``.
        flush_s: Pause between a first buffered mark and its write, in seconds.

    The flush task runs on the event loop of the first mark after the previous one ended (a
    caller that changes loops, e.g. tests, gets a new task on its own loop).
    """

    def __init__(self, db: Database, flush_s: float = FLUSH_S) -> None:
        self.db = db
        self.flush_s = flush_s
        self._routed: set[MessageRef] = set()
        self._handled: set[MessageRef] = set()
        self._task: asyncio.Task[None] | None = None
        self.counts = {"routed": 0, "handled": 0, "flushes": 0, "failed_flushes": 0}

    def routed(self, platform: str, bot_id: str, message_id: str) -> None:
        """A host accepted the message (buffered)."""
        self._routed.add(message_ref(platform, bot_id, message_id))
        self.counts["routed"] += 1
        self._schedule()

    def handled(self, platform: str, bot_id: str, message_id: str) -> None:
        """The message's turn result came back, or a host already had it (buffered)."""
        self._handled.add(message_ref(platform, bot_id, message_id))
        self.counts["handled"] += 1
        self._schedule()

    def _schedule(self) -> None:
        task = self._task
        if task is not None and not task.done():
            try:
                if task.get_loop() is asyncio.get_running_loop():
                    return
            except RuntimeError:  # no running loop: nothing can flush now; the next mark will
                return
        try:
            self._task = asyncio.get_running_loop().create_task(self._flush_later())
        except RuntimeError:
            self._task = None

    async def _flush_later(self) -> None:
        # marks that arrive while a flush writes (or that a failed flush kept) go in the next one
        while True:
            await asyncio.sleep(self.flush_s)
            await self.flush()
            if not self._routed and not self._handled:
                return

    async def flush(self) -> None:
        """Write every buffered mark now (one transaction). A failed write is logged and its
        marks kept for the next flush (up to :data:`MAX_BUFFERED`)."""
        routed, handled = self._routed, self._handled
        self._routed, self._handled = set(), set()
        if not routed and not handled:
            return
        db = self.db
        try:
            await db.run_write(lambda: mark(db, routed - handled, handled))
            self.counts["flushes"] += 1
        except Exception as exc:
            self.counts["failed_flushes"] += 1
            if len(self._routed) + len(self._handled) + len(routed) + len(handled) <= MAX_BUFFERED:
                self._routed |= routed
                self._handled |= handled
                log.warning("inbox marks not written, kept for the next try: %r", exc)
            else:
                log.warning("inbox marks not written and dropped (buffer full): %r", exc)

    async def close(self) -> None:
        """Write what is buffered and stop the flush task."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                if task.get_loop() is asyncio.get_running_loop():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        await self.flush()

"""A session's ordered inbox, without Ray (docs/decisions.md#session-ordered-inbox,
docs/decisions.md#session-hot-chat-coalescing).

Entries are keyed by their router-assigned ``seq``; :meth:`TurnQueue.take` hands them out strictly
in ``seq`` order — one at a time, or, where the chat coalesces, the next entry with the batchable
entries right after it (up to ``max_batch``). A ``seq`` answered without a turn (the busy notice)
is :meth:`TurnQueue.skip` ped, so the order goes on past it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runtime.session.turn import TurnInput, TurnResult

__all__ = ["Entry", "TurnQueue"]

Entry = tuple[TurnInput, "asyncio.Future[TurnResult]"]
"""A queued turn input and the future its submitter waits on."""


class TurnQueue:
    """The entries of one session waiting for a turn.

    Args:
        next_seq: The first ``seq`` expected.
    """

    def __init__(self, next_seq: int) -> None:
        self.next_seq = next_seq
        self._entries: dict[int, Entry] = {}
        self._skipped: set[int] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def check(self, turn: TurnInput, session_key: str) -> None:
        """Raises:
        ValueError: ``turn.seq`` was already taken, queued or skipped (the router never sends one
            twice to the same activation)."""
        seq = turn.seq
        if seq < self.next_seq or seq in self._entries or seq in self._skipped:
            raise ValueError(f"seq {seq} of {session_key} was already submitted (next {self.next_seq})")

    def put(self, entry: Entry) -> None:
        """Queue ``entry`` under its ``seq`` (after :meth:`check`)."""
        self._entries[entry[0].seq] = entry

    def twin(self, turn: TurnInput) -> asyncio.Future[TurnResult] | None:
        """The result of a queued entry with ``turn``'s kind and non-empty ``message_id`` (the same
        message delivered twice while it waits, e.g. a platform's webhook retry re-sent by the
        inbox), or ``None``."""
        if not turn.message_id:
            return None
        for queued, fut in self._entries.values():
            if queued.message_id == turn.message_id and queued.kind == turn.kind:
                return fut
        return None

    def skip(self, seq: int) -> None:
        """``seq`` is answered without a turn: the order goes on past it."""
        self._skipped.add(seq)

    def ready(self) -> bool:
        """Whether the next ``seq`` is queued (stepping over skipped ones)."""
        while self.next_seq in self._skipped:
            self._skipped.discard(self.next_seq)
            self.next_seq += 1
        return self.next_seq in self._entries

    def take(self, max_batch: int, batchable: Callable[[TurnInput], bool]) -> list[Entry]:
        """Pop the next entry (call when :meth:`ready`) and, when ``max_batch > 1`` and it is
        ``batchable``, the batchable entries that follow it in ``seq`` order, up to ``max_batch``
        in all."""
        entries = [self._pop()]
        if max_batch <= 1 or not batchable(entries[0][0]):
            return entries
        while len(entries) < max_batch and self.ready() and batchable(self._entries[self.next_seq][0]):
            entries.append(self._pop())
        return entries

    def _pop(self) -> Entry:
        entry = self._entries.pop(self.next_seq)
        self.next_seq += 1
        return entry

"""Which messages a growing context added since the last look
(docs/decisions.md#agent-incremental-convert).

A session's context only grows between two LLM calls, and between two turns, so work over the
whole context (its conversion for the model, the ids and media references a reply may use) can be
kept and extended with the new messages only. :class:`ContextGrowth` tells a keeper which messages
those are, or that the list is not an extension of the last one (then the keeper starts again).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

from runtime.llm.types import AgentMessage

__all__ = ["ContextGrowth"]


class ContextGrowth:
    """The messages of the last call, to compare the next call's with (kept by reference: the
    context's messages are never edited once added)."""

    def __init__(self) -> None:
        self._seen: list[AgentMessage] = []
        self.taken = 0
        """Messages handed out as new so far (all of them again after each new start)."""

    def new(self, messages: Sequence[AgentMessage]) -> tuple[bool, list[AgentMessage]]:
        """``(restart, new)``: ``new`` the messages after the last call's, when ``messages``
        starts with those (the same objects, in order); else ``restart`` is true and ``new`` is
        all of ``messages``. The cost is one identity comparison per kept message (C speed)."""
        k = len(self._seen)
        restart = k > len(messages) or not all(map(operator.is_, self._seen, messages))
        if restart:
            self._seen, k = [], 0
        new = list(messages[k:])
        self._seen.extend(new)
        self.taken += len(new)
        return restart, new

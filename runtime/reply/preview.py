"""The streaming preview of an IM reply: published only once the reply is validated, so half JSON
is never shown (docs/decisions.md#reply-final-output). Re-exported by :mod:`runtime.reply.im_reply`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from runtime.reply.segments import Reply

__all__ = ["ReplyPreview"]


class _Outcome(Protocol):
    """Anything with the validated ``reply`` (:class:`runtime.reply.im_reply.ReplyOutcome`)."""

    reply: Reply


class ReplyPreview:
    """Publishes a human-readable preview of the reply only after validation (no half JSON while
    streaming: docs/decisions.md#reply-final-output). Feed it agent events with :meth:`on_event`
    (text deltas are held back), then call :meth:`release` once with the :class:`ReplyOutcome`.

    Args:
        publish: ``(preview_text) -> None | Awaitable[None]``; called at most once.
    """

    def __init__(self, publish: Callable[[str], Awaitable[None] | None]) -> None:
        self._publish = publish
        self.held_deltas = 0
        self.released = False

    def on_event(self, event: Any) -> None:
        """Hold back streamed text (count only); nothing is published before :meth:`release`."""
        inner = getattr(event, "assistant_message_event", None) or getattr(event, "event", None)
        if getattr(inner, "type", None) == "text_delta":
            self.held_deltas += 1

    async def release(self, outcome: _Outcome) -> None:
        """Publish ``outcome.reply.preview_text()`` (nothing for an empty reply); idempotent."""
        if self.released:
            return
        self.released = True
        if outcome.reply.is_empty():
            return
        result = self._publish(outcome.reply.preview_text())
        if result is not None:
            await result

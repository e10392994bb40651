"""The streaming preview of an IM reply: published only once the reply is validated, so half JSON
is never shown (docs/decisions.md#reply-final-output). Re-exported by :mod:`runtime.reply.im_reply`.

Production use: the console's live-event sink (:class:`runtime.session.console_events.ConsoleEventSink`)
holds one per turn and turns the validated reply into the console's completed-reply line.
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

    A synchronous caller (an ``on_event`` hook, which must return at once) uses :meth:`take`
    instead of :meth:`release` and publishes the text itself.

    Args:
        publish: ``(preview_text) -> None | Awaitable[None]``; called at most once by
            :meth:`release` (``None``: only :meth:`take` is used).
    """

    def __init__(self, publish: Callable[[str], Awaitable[None] | None] | None = None) -> None:
        self._publish = publish
        self.held_deltas = 0
        self.released = False

    def on_event(self, event: Any) -> None:
        """Hold back streamed text (count only); nothing is published before :meth:`release`."""
        inner = getattr(event, "assistant_message_event", None) or getattr(event, "event", None)
        if getattr(inner, "type", None) == "text_delta":
            self.held_deltas += 1

    def take(self, outcome: _Outcome) -> str | None:
        """Mark the preview released and return the text to publish: ``outcome.reply.preview_text()``,
        or ``None`` when already released or the reply is empty (an aborted turn sends nothing)."""
        if self.released:
            return None
        self.released = True
        if outcome.reply.is_empty():
            return None
        return outcome.reply.preview_text()

    async def release(self, outcome: _Outcome) -> None:
        """Publish :meth:`take`'s text through ``publish`` (nothing for an empty reply); idempotent."""
        text = self.take(outcome)
        if text is None or self._publish is None:
            return
        result = self._publish(text)
        if result is not None:
            await result

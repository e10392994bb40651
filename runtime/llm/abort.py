"""Cancellation for streams, tools and agent loops: ``AbortController`` / ``AbortSignal``.

Modelled on the web platform's pair so hooks keep pi's shape: the owner holds the
controller and calls :meth:`AbortController.abort`; everything downstream receives the
read-only :class:`AbortSignal`, polls ``aborted`` between chunks, awaits :meth:`AbortSignal.wait`,
or registers a callback. Thread-safe enough for one event loop; callbacks run synchronously
in ``abort()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["AbortController", "AbortSignal"]


class AbortSignal:
    """Read-only view of a cancellation request.

    Attributes:
        aborted: True once the controller has fired.
        reason: The text passed to ``abort`` (``"aborted"`` by default).
    """

    def __init__(self) -> None:
        self.aborted = False
        self.reason: str | None = None
        self._callbacks: list[Callable[[], None]] = []
        self._events: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` once on abort (immediately if already aborted).

        Returns:
            A function that removes the listener.
        """
        if self.aborted:
            callback()
            return lambda: None
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    async def wait(self) -> None:
        """Return when the signal fires (immediately if it already has)."""
        if self.aborted:
            return
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        pair = (loop, event)
        self._events.append(pair)
        try:
            await event.wait()
        finally:
            if pair in self._events:
                self._events.remove(pair)

    def _fire(self, reason: str) -> None:
        if self.aborted:
            return
        self.aborted = True
        self.reason = reason
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb()
        for loop, event in list(self._events):
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                event.set()
            else:
                loop.call_soon_threadsafe(event.set)

    @staticmethod
    def any(*signals: AbortSignal | None) -> AbortSignal:
        """Return a signal that fires when any of ``signals`` fires (``None`` entries ignored)."""
        controller = AbortController()
        for s in signals:
            if s is not None:
                s.add_listener(_forward(s, controller))
        return controller.signal


def _forward(source: AbortSignal, target: AbortController) -> Callable[[], None]:
    def fire() -> None:
        target.abort(source.reason or "aborted")

    return fire


class AbortController:
    """Owner side of an :class:`AbortSignal`."""

    def __init__(self) -> None:
        self.signal = AbortSignal()

    def abort(self, reason: str = "aborted") -> None:
        """Fire the signal once; later calls are no-ops."""
        self.signal._fire(reason)

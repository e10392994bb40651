"""The web console's fan-out hub: the browsers' open SSE streams, by scene, in this process.

A reply delivered to ``/console/api/deliver``, an agent event posted to ``/console/api/events`` or a
group message echoed by ``/console/api/echo`` is queued to every browser whose scene it is (a
private scene to that user's tabs; a group scene to every member watching the group). The hub is
per process: with several ingress replicas a browser sees what reaches its own replica only.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

__all__ = ["QUEUE_MAX", "ConsoleHub", "Subscriber"]

log = logging.getLogger("sessionray.console")

QUEUE_MAX = 256
"""Events one browser stream may have waiting; a full queue drops its oldest event."""


@dataclass(eq=False)
class Subscriber:
    """One browser stream: its user, the group it follows (``None``: private chat only) and the
    queue of events waiting for it."""

    user: str
    group: str | None
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=lambda: asyncio.Queue(QUEUE_MAX))

    def wants(self, scene_type: str, scene_id: str) -> bool:
        """Whether an event of this scene belongs on this stream."""
        if scene_type == "private":
            return scene_id == self.user
        return self.group is not None and scene_id == self.group


class ConsoleHub:
    """In-process fan-out of console events to the browsers' SSE streams, by scene.

    A slow browser whose queue is full (256 events) loses the oldest event rather than blocking
    delivery (counted in the log).
    """

    def __init__(self) -> None:
        self._subs: set[Subscriber] = set()
        self._ids = itertools.count(1)
        self._prefix = f"console-{secrets.token_hex(4)}"

    def subscribe(self, user: str, group: str | None) -> Subscriber:
        """Register one browser stream."""
        sub = Subscriber(user, group)
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        """Forget a browser stream."""
        self._subs.discard(sub)

    def next_message_id(self) -> str:
        """A console message id for a delivered reply: ``console-<8 hex digits of this hub>-<n>``.

        Unique across restarts and replicas: the id keys the outbound transcript row (unique per
        platform, bot, message id and direction), so a counter that starts again at 1 would
        make every reply after a restart a "duplicate" that history never shows."""
        return f"{self._prefix}-{next(self._ids)}"

    def publish(self, scene_type: str, scene_id: str, event: dict[str, Any]) -> int:
        """Queue ``event`` to every subscriber of the scene; returns how many got it."""
        n = 0
        for sub in list(self._subs):
            if not sub.wants(scene_type, scene_id):
                continue
            if sub.queue.full():
                sub.queue.get_nowait()
                log.warning("console stream of %s is full: dropped its oldest event", sub.user)
            sub.queue.put_nowait(event)
            n += 1
        return n

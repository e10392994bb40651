"""A session host's record of one live session, and the errors of a host
(docs/decisions.md#session-hosts). Plain data, no Ray: :mod:`actors.host` keeps one
:class:`LiveSession` per live :class:`~runtime.session.core.SessionCore`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runtime.session.control import UnknownSessionError

__all__ = ["HostFullError", "LiveSession", "SessionNotBoundError"]


class SessionNotBoundError(UnknownSessionError):
    """A control call reached a host that does not hold the session (passivated or moved)."""


class HostFullError(RuntimeError):
    """The host is at its capacity (sessions or memory) and may not (or cannot) passivate an idle
    session for a new one."""


@dataclass
class LiveSession:
    core: Any
    epoch: int
    router: str
    """Name of the session's router shard (told on passivation)."""
    next_seq: int = 1
    pending: int = 0
    last_used: float = field(default_factory=time.monotonic)
    turns: int = 0
    fresh: bool = True
    """Activated and no message arrived yet: evicted only when no other session is idle (its
    first message is on the way from the caller that placed it)."""

    @property
    def idle(self) -> bool:
        return self.pending == 0 and bool(self.core.idle)

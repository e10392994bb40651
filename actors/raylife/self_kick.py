"""Start a restarted actor's background work without waiting for a caller.

A router shard's inbox recovery loop and a Telegram poller's polling loop must run as soon as an
incarnation starts — after a crash nobody may call it for a long time. Asking ``asyncio`` from
``__init__`` is not possible (no running loop yet), so the incarnation calls one of its own
methods. A single call made from ``__init__`` can fail: while Ray still counts the incarnation as
restarting it answers ``ActorUnavailableError`` ("the actor is restarting"), and with
``max_task_retries=0`` that call is lost. :func:`kick_self` therefore calls from a daemon thread
until the method answers once.
"""

from __future__ import annotations

import logging
import threading
import time

import ray

__all__ = ["KICK_WAIT_S", "kick_self"]

log = logging.getLogger("sessionray.actors")

KICK_WAIT_S = 600.0
"""How long a starting incarnation keeps calling itself, in seconds."""


def kick_self(method: str, what: str, wait_s: float = KICK_WAIT_S) -> bool:
    """From an actor's ``__init__``: call its own ``method`` (no arguments) from a daemon thread,
    once a second, until one call answers or ``wait_s`` seconds passed (then logged at ERROR).

    Args:
        method: The actor method that starts the background work (idempotent).
        what: Names the actor and its work in the log.

    Returns:
        False when not called inside a Ray actor (nothing is started: the owner starts its work
        on first use), else True.
    """
    try:
        me = ray.get_runtime_context().current_actor
    except RuntimeError:
        return False

    def kick() -> None:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                # the ref's future, not ray.get: Ray warns about ray.get in an async actor even
                # from another thread (a warning every `sessionray serve` printed at start)
                getattr(me, method).remote().future().result(timeout=60)
                return
            except Exception as exc:
                if time.monotonic() > deadline:
                    log.error("%s never started: %r", what, exc)
                    return
                time.sleep(1.0)

    threading.Thread(target=kick, name=f"kick-{method}", daemon=True).start()
    return True

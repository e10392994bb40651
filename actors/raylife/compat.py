"""Work-around for a start-up race of Ray's async actors with named concurrency groups.

Ray 2.60 (``CoreWorker.initialize_eventloops_for_actor_concurrency_group`` in ``_raylet.pyx``)
starts one event-loop thread per concurrency group in a ``for`` loop, and each thread's target is
``lambda: async_eventloop.run_forever()``. The lambda reads the loop *variable* when the thread
first runs, not when it is created. If the thread of group *i* has not run yet when the ``for``
loop rebinds ``async_eventloop`` to the loop of group *i+1* (a busy machine: many actor processes
starting on 2 cores), two threads run the same loop: one dies with ``RuntimeError: this event loop
is already running``, and the loop of group *i* never runs. The actor stays alive, and every call
to that group hangs forever. ``SessionHost`` has two groups (``turn``, ``control``), so a new
host could come up with a dead ``turn`` or ``control`` group (seen in ≈ 1 % of local Ray sessions).

:func:`install_group_loop_fix` wraps ``ray._raylet.get_new_event_loop`` (the factory that loop
calls for every group): before it builds a new loop, it waits until the loop it built just before
is running, i.e. until the previous group's thread has read its variable. A loop that is never run
(any other caller) costs that wait once, bounded by :data:`WAIT_S`, and only when the next loop is
requested within :data:`WINDOW_S` of it. The supervisor's readiness probe (``ping`` + ``ping_turn``,
:meth:`actors.placement.hosts.supervisor.HostSupervisor` readiness check) stays as a second line of defence.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["WAIT_S", "WINDOW_S", "guarded_loop_factory", "install_group_loop_fix"]

WAIT_S = 5.0
"""Longest wait, in seconds, for the previously built loop to start running."""
WINDOW_S = 1.0
"""Only a loop built less than this many seconds before the next request is waited for (Ray
builds the loops of all groups back to back)."""

_MARK = "__sessionray_group_loop_fix__"


def guarded_loop_factory(make_loop: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap an event-loop factory so that each new loop is built only once the loop built just
    before it runs (or :data:`WAIT_S` passed, or it is closed, or it is older than
    :data:`WINDOW_S`). Thread-safe. Returns the wrapper; it carries the attribute
    ``__sessionray_group_loop_fix__ = True``."""
    lock = threading.Lock()
    last: list[tuple[Any, float]] = []

    def factory() -> Any:
        with lock:
            if last:
                loop, built = last.pop()
                if time.monotonic() - built < WINDOW_S:
                    deadline = time.monotonic() + WAIT_S
                    while not (loop.is_running() or loop.is_closed()) and time.monotonic() < deadline:
                        time.sleep(0.0002)
            loop = make_loop()
            last.append((loop, time.monotonic()))
            return loop

    setattr(factory, _MARK, True)
    return factory


def install_group_loop_fix() -> bool:
    """Install :func:`guarded_loop_factory` around ``ray._raylet.get_new_event_loop`` in this
    process (idempotent). Must run before Ray initialises an actor's event loops: importing
    :mod:`actors.placement.hosts.support` does it, and Ray imports that module when it loads the
    class in the worker, before the loops are built.

    Returns:
        True when the wrapper is in place; False when this Ray has no such hook (then nothing
        changes; the supervisor's two-group readiness probe still catches a dead group).
    """
    try:
        import ray._raylet as raylet
    except ImportError:  # pragma: no cover - ray is a dependency
        return False
    current = getattr(raylet, "get_new_event_loop", None)
    if current is None:
        return False
    if not getattr(current, _MARK, False):
        setattr(raylet, "get_new_event_loop", guarded_loop_factory(current))  # noqa: B010 - not in its stubs
    return True

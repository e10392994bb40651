"""Counting the Ray actor calls a process makes, on a real run (docs/architecture.md, "The path of
one message").

:func:`count_calls` wraps ``ray.actor.ActorMethod._remote`` — the one place every
``handle.method.remote(...)`` and ``handle.method.options(...).remote(...)`` of a process passes
(Ray 2.60) — so each call is reported as ``"Class.method"``. :class:`CountingSetup` is the scripted
setup factory whose ``prepare`` (run in every session host's process) installs it there, appending
one line per call to ``<marker_dir>/raycalls-<pid>``.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.actors.session_scripts import ScriptedSetup

__all__ = ["CountingSetup", "count_calls", "host_calls"]

_installed: list[Callable[[str], None]] = []


def _name(method: Any) -> str:
    actor = method._actor
    if isinstance(actor, weakref.ref):
        actor = actor()
    descriptor = getattr(actor, "_ray_actor_creation_function_descriptor", None)
    return f"{getattr(descriptor, 'class_name', '?')}.{method._method_name}"


def count_calls(sink: Callable[[str], None]) -> Callable[[], None]:
    """Report every Ray actor call of this process to ``sink`` until the returned undo is called."""
    import ray.actor

    original = ray.actor.ActorMethod._remote

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        sink(_name(self))
        return original(self, *args, **kwargs)

    ray.actor.ActorMethod._remote = counted  # type: ignore[method-assign]

    def undo() -> None:
        ray.actor.ActorMethod._remote = original  # type: ignore[method-assign]

    return undo


def host_calls(marker_dir: Path) -> list[str]:
    """The calls every other process that ran :class:`CountingSetup` made so far, in file order."""
    lines: list[str] = []
    for f in sorted(marker_dir.glob("raycalls-*")):
        if f.name != f"raycalls-{os.getpid()}":
            lines += f.read_text().splitlines()
    return lines


class CountingSetup(ScriptedSetup):
    """:class:`ScriptedSetup` that also counts the Ray calls of each session host's process."""

    def prepare(self, *, database: Any = None) -> None:
        super().prepare(database=database)
        if _installed:
            return
        path = Path(self.marker_dir) / f"raycalls-{os.getpid()}"

        def append(name: str) -> None:
            with path.open("a") as f:
                f.write(name + "\n")

        _installed.append(append)
        count_calls(append)

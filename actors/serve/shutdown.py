"""How ``sessionray serve`` stops on SIGTERM or SIGINT (docs/decisions.md#ops-graceful-shutdown).

Phases, each printed as one ``sessionray: stopping: …`` line with its counts:

1. **listener** — the HTTP listener is closed (a new connection is refused, never answered 503)
   and the Telegram pollers stop; requests already being served are answered (at most
   :data:`REQUESTS_WAIT_S`);
2. **turns** — every turn in flight in the instance (``runtime.in_flight()``: the hosts' count,
   so turns the router shards' inbox recovery started are waited for too) may end, until
   ``runtime.shutdown_grace_s`` after the signal;
3. **deliveries** — the delivery actors may send the replies of this run that the ledger still
   holds unsent, until the same deadline;
4. **runtime** — the routers, the hosts, the delivery actors, then Ray are stopped (SIGINT); after
   SIGTERM they are left running for the next start (docs/decisions.md#ops-planned-restart).

What is left — a stored message whose turn did not end, a reply still queued in the ledger — is
replayed by the next start (the inbox's start-up recovery, the delivery actors' sweep). A second
signal skips what is left of the waits, a third exits at once. Nothing here starts or stops Ray
itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from sqlalchemy import bindparam, text

__all__ = [
    "EXIT_INTERRUPTED",
    "POLL_S",
    "REQUESTS_WAIT_S",
    "ServeRun",
    "ShutdownSignals",
    "drain",
    "keeps_ray",
    "open_replies",
    "say",
]

log = logging.getLogger("sessionray.serve")

POLL_S = 0.1
"""How often the waits look again (seconds)."""
REQUESTS_WAIT_S = 5
"""Longest wait for the HTTP requests in progress when the listener closes (seconds)."""

EXIT_INTERRUPTED = 130
"""Exit code after a third signal (the shell's code for an interrupted process)."""

_FINAL = ("sent", "failed", "uncertain")


def say(line: str) -> None:
    """One ``sessionray: …`` line on stdout (the serve command's own output)."""
    print(f"sessionray: {line}", flush=True)


class ShutdownSignals:
    """SIGTERM and SIGINT handlers on the running loop for the whole life of ``serve``.

    The first signal sets :attr:`requested` and calls the ``on_request`` callbacks; a second one
    sets :attr:`forced` (skip the waits); a third ends the process at once with
    :data:`EXIT_INTERRUPTED`, as a crash would. Handlers are removed by :meth:`close`.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.requested = asyncio.Event()
        self.forced = asyncio.Event()
        self.name: str | None = None
        self.at: float | None = None
        """``time.monotonic()`` of the first signal."""
        self._callbacks: list[Callable[[], None]] = []
        self.install()

    def install(self) -> None:
        """(Re)install the handlers. Call it again after ``ray.init``: Ray's core worker puts a
        handler of its own in front that logs every SIGTERM as a crash report, then calls ours."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.loop.add_signal_handler(sig, self._on_signal, sig)

    def on_request(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the first signal arrives (now, if it already did)."""
        self._callbacks.append(callback)
        if self.requested.is_set():
            callback()

    def request(self, name: str) -> None:
        """Start stopping as if signal ``name`` had arrived (idempotent)."""
        if self.requested.is_set():
            return
        self.name, self.at = name, time.monotonic()
        self.requested.set()
        for callback in self._callbacks:
            callback()

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if not self.requested.is_set():
            self.request(name)
        elif not self.forced.is_set():
            self.forced.set()
            say(f"{name} again: not waiting any longer (once more: exit at once)")
        else:  # the next start stops what is left of this process's Ray (actors.raylife.stale)
            say(f"{name} a third time: exiting now")
            os._exit(EXIT_INTERRUPTED)

    def close(self) -> None:
        """Remove the handlers (signals act by default again)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(Exception):
                self.loop.remove_signal_handler(sig)


def open_replies(db: Any, since_ms: int) -> tuple[int, int]:
    """``(open, on_the_wire)``: delivery-ledger rows created since ``since_ms`` (Unix ms) that are
    not final yet (not sent, failed or uncertain), and how many of them have a platform call in
    flight. Blocking; run it through ``db.run``. ``(0, 0)`` when there is no ledger table yet."""
    query = text(
        "SELECT COUNT(*), SUM(CASE WHEN in_flight >= 0 THEN 1 ELSE 0 END) FROM delivery_ledger "
        "WHERE created_at >= :since AND status NOT IN :final"
    ).bindparams(bindparam("since", since_ms), bindparam("final", list(_FINAL), expanding=True))
    try:
        with db.connection() as conn:
            row = conn.execute(query).one()
    except Exception as exc:  # no ledger table yet, or the database is gone: nothing to wait for
        if "delivery_ledger" in str(exc):
            return 0, 0
        raise
    return int(row[0] or 0), int(row[1] or 0)


async def _until(done: Callable[[], Any], deadline: float, forced: asyncio.Event) -> Any:
    """Poll the coroutine function ``done`` until it returns a falsy value, ``deadline``
    (``time.monotonic()``) passes or ``forced`` is set; returns its last value."""
    value = await done()
    while value and time.monotonic() < deadline and not forced.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(forced.wait(), POLL_S)
        value = await done()
    return value


async def drain(
    runtime: Any, db: Any, *, deadline: float, since_ms: int, forced: asyncio.Event
) -> dict[str, int]:
    """Phases 2 and 3 (module docstring): wait for ``await runtime.in_flight()`` to reach 0, then for the
    ledger rows of this run (:func:`open_replies` on ``db``) to be final, both until ``deadline``
    (``time.monotonic()``). Prints one line per phase; returns their counts
    ``{"turns", "turns_left", "replies", "replies_left", "on_the_wire"}``. A database error in
    phase 3 is printed and ends it."""

    async def turns() -> int:
        return int(await runtime.in_flight())

    started_turns = await turns()
    left_turns = await _until(turns, deadline, forced)
    ended = max(0, started_turns - left_turns)
    say(
        f"stopping: turns: {started_turns} in flight, {ended} ended, {left_turns} cut off (their messages "
        "are replayed by the next start)"
    )

    async def replies() -> tuple[int, int] | None:
        counts = await db.run(lambda: open_replies(db, since_ms))
        return counts if counts[0] else None

    try:
        first = await replies() or (0, 0)
        last = await _until(replies, deadline, forced) or (0, 0)
    except Exception as exc:
        say(f"stopping: deliveries: not waited for (the delivery ledger cannot be read: {exc!r})")
        first = last = (0, 0)
    else:
        wire = f" ({last[1]} with a call on the wire)" if last[1] else ""
        say(
            f"stopping: deliveries: {first[0]} replies of this run unsent, {max(0, first[0] - last[0])} "
            f"sent meanwhile, {last[0]} left for the next start{wire}"
        )
    return {
        "turns": started_turns,
        "turns_left": left_turns,
        "replies": first[0],
        "replies_left": last[0],
        "on_the_wire": last[1],
    }


def keeps_ray(signal_name: str | None, address: str | None, up: bool) -> bool:
    """A planned restart (docs/decisions.md#ops-planned-restart): SIGTERM — what service managers
    and ``docker stop`` send — leaves a local Ray that is up, with its runtime, for the next serve to
    join (its keeper stops it if none does within ``runtime.orphaned_ray_keep_s``); SIGINT (Ctrl-C
    of ``make run``), a failed start and a cluster joined with ``--address`` stop as before."""
    return signal_name == "SIGTERM" and address is None and up


@dataclass
class ServeRun:
    """What the start and the stop of one ``serve`` share."""

    config: Any
    signals: ShutdownSignals
    server: uvicorn.Server
    """The ingress's server (``actors.serve.main.IngressServer``)."""
    serving: asyncio.Future[Any]
    """``server.serve()``."""
    gate: Any
    """The :class:`~actors.serve.gate.RuntimeGate` the ingress was built over."""
    runtime: Any
    db: Any
    """The ingress's database (the delivery ledger is read there while stopping)."""
    starting: asyncio.Future[Any]
    """Ray's and the runtime's start."""
    stop_pollers: Callable[[Any], Awaitable[Any]]
    pollers: bool = False
    listening: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the port listens (uvicorn's start-up is done)."""
    shown: str = ""
    """The URL of the port as the banner shows it."""
    since_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    async def stop(self, *, keep_runtime: bool = False) -> None:
        """The phases above (Ray itself is stopped by the caller);
        ``keep_runtime``: the runtime's actors are left running (:func:`keeps_ray`)."""
        grace = float(self.config.runtime.shutdown_grace_s)
        deadline = (self.signals.at or time.monotonic()) + grace
        self.gate.phase = "stopping"
        what = "turns and deliveries"
        say(f"stopping ({self.signals.name}): closing the listener; up to {grace:g} s for {what}")
        self.server.should_exit = True
        open_requests = len(self.server.server_state.connections)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self.serving), REQUESTS_WAIT_S + 5)
        if self.pollers:
            with contextlib.suppress(Exception):
                await self.stop_pollers(self.config)
        say(f"stopping: listener closed, {open_requests} open connection(s) answered or closed")
        if not self.starting.done():
            self.starting.cancel()
            with contextlib.suppress(BaseException):
                await self.starting
        if self.gate.ready and self.db is not None:
            await drain(
                self.runtime, self.db, deadline=deadline, since_ms=self.since_ms, forced=self.signals.forced
            )
        if keep_runtime:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.runtime.detach(), timeout=30)
            say(
                "stopping: runtime and Ray left running for the next start (SIGTERM: a planned restart; "
                "SIGINT stops them too)"
            )
            return
        begun = time.monotonic()
        try:
            await asyncio.wait_for(self.runtime.stop(), timeout=30)
        except Exception as exc:  # still shut Ray down
            log.warning("runtime stop failed: %r", exc)
        say(f"stopping: runtime stopped ({time.monotonic() - begun:.1f} s); stopping Ray")

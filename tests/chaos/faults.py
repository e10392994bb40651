"""Faults of the chaos suite and their schedule while the load runs.

A :class:`Fault` is one action at ``at_s`` seconds after the load started, repeated every
``every_s`` seconds while the load runs (counted from the previous action's end):

* ``kill:<ActorClass>`` — SIGKILL one Ray worker of the topology running that actor
  (``SessionHost``, ``DeliveryActor``, ``RouterActor``, ``HostSupervisor``; picked at random
  among the live ones, found by process title: :mod:`tests.chaos.procs`; when none is live, e.g.
  still restarting after the previous kill, it waits for one up to :data:`KILL_WAIT_S`);
* ``driver:kill`` — SIGKILL the ``sessionray serve`` process only (its Ray instance lingers as
  after a crash), then start a new serve on the same data directory, again and again until one
  is ready (as a process supervisor would);
* ``driver:term`` — SIGTERM the serve, wait until it exits, start a new one the same way;
* ``outage:<500|429|refused>`` — the platform API of bot ``target`` (every bot's when None)
  fails for ``seconds`` (:meth:`tests.chaos.platform.FaultyPlatform.outage`).

Every action is logged as a dict (``t``: seconds after the load start, ``fault``, and what it
did: ``pid``, ``ready_s`` …) in the list :func:`run_faults` fills.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from dataclasses import dataclass
from typing import Any

from tests.chaos.platform import FaultyPlatform
from tests.chaos.serve import Topology

__all__ = ["KILL_WAIT_S", "Fault", "run_faults"]

KILL_WAIT_S = 60.0
"""A kill waits this long for a live worker of its actor class (e.g. the router killed a moment
ago and not restarted yet: "kill the router twice" kills the restarted one)."""


@dataclass(frozen=True)
class Fault:
    """One scheduled fault (module docstring)."""

    action: str
    at_s: float
    every_s: float | None = None
    seconds: float = 0.0
    """Length of an outage."""
    target: int | None = None
    """The bot (index) whose platform API an outage hits; None: every bot's."""

    def end_s(self, duration_s: float) -> float:
        """Seconds after the load start when this fault's last window ends as scheduled (an
        outage's end; a kill's own moment); a late action's real end is in the fault log."""
        last = self.at_s
        if self.every_s:
            while last + self.every_s < duration_s:
                last += self.every_s
        return last + self.seconds


def _restart(topo: Topology, how: str, ready_timeout_s: float) -> dict[str, Any]:
    """Kill (``kill``) or stop (``term``) the driver and start serve until ready (blocking)."""
    t0 = time.monotonic()
    rec: dict[str, Any] = {"pid": topo.driver_pid()}
    if how == "kill":
        topo.kill9()
    else:
        rec["stop_s"], rec["exit_code"] = topo.terminate()
        rec["stop_s"] = round(rec["stop_s"], 2)
    try:
        _, attempts, codes = topo.start_until_ready(ready_timeout_s)
        rec |= {"ready_s": round(time.monotonic() - t0, 2), "attempts": attempts, "failed_exit_codes": codes}
    except TimeoutError as exc:
        rec |= {"ready_s": None, "error": str(exc)[:300]}
    return rec


async def _act(
    fault: Fault, topo: Topology, platforms: list[FaultyPlatform], rng: random.Random, ready_timeout_s: float
) -> dict[str, Any]:
    kind, _, what = fault.action.partition(":")
    if kind == "kill":
        waited = time.monotonic()
        while not (pids := await asyncio.to_thread(topo.pids, what)):
            if time.monotonic() - waited > KILL_WAIT_S:
                return {"pid": None, "note": f"no live {what} for {KILL_WAIT_S:.0f} s"}
            await asyncio.sleep(0.1)
        pid = rng.choice(pids)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return {"pid": pid, "note": "gone before the kill"}
        return {"pid": pid, "of": len(pids), "waited_s": round(time.monotonic() - waited, 2)}
    if kind == "driver":
        return await asyncio.to_thread(_restart, topo, what, ready_timeout_s)
    if kind == "outage":
        for platform in platforms if fault.target is None else [platforms[fault.target]]:
            platform.outage(what, fault.seconds)
        return {
            "seconds": fault.seconds,
            "bot": "all" if fault.target is None else topo.bot_ids[fault.target],
        }
    raise ValueError(f"unknown fault action {fault.action!r}")


async def run_faults(
    faults: tuple[Fault, ...],
    topo: Topology,
    platforms: list[FaultyPlatform],
    *,
    t0: float,
    duration_s: float,
    log: list[dict[str, Any]],
    ready_timeout_s: float = 300.0,
    seed: int = 16,
) -> None:
    """Run every fault of ``faults`` on its schedule from ``t0`` (``time.monotonic()``) while
    ``t0 + duration_s`` has not passed (a first action always runs), appending one dict per
    action to ``log``."""
    rng = random.Random(seed)

    async def one(fault: Fault) -> None:
        at = fault.at_s
        while True:
            if (wait := t0 + at - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            started = time.monotonic()
            rec = await _act(fault, topo, platforms, rng, ready_timeout_s)
            log.append({"t": round(started - t0, 2), "fault": fault.action, **rec})
            # the next one a period after this one (a kill that waited for a restarting actor
            # does not make the next ones come in a burst)
            at = max(at, time.monotonic() - t0) + (fault.every_s or 0.0)
            if not fault.every_s or at >= duration_s:
                return

    await asyncio.gather(*(one(f) for f in faults))

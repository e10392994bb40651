"""The chaos scenarios, their sizes, and running one against a topology.

A scenario is a set of :class:`tests.chaos.faults.Fault` run while the open-loop load
(:func:`tests.chaos.load.open_loop`) is offered, in ``packed`` mode (``runtime.sessions_per_host``
2000, the default) or ``strict`` mode (1: a process per session). :func:`run_on` runs one on a
started :class:`tests.chaos.serve.Topology` (the CI subset shares one serve between scenarios);
:func:`run_fresh` gives a scenario a serve of its own (``make chaos``).

After the load — every message accepted or its redeliveries spent — and the last fault, the
drain waits until every accepted message has a reply and no reply came for ``quiet_s`` (a late
duplicate would show), or until ``drain_timeout_s`` has passed.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from tests.chaos.faults import Fault, run_faults
from tests.chaos.figures import figures, restart_recovery
from tests.chaos.load import Sent, open_loop
from tests.chaos.platform import FaultyPlatform
from tests.chaos.serve import Topology

__all__ = [
    "CI",
    "CI_BOTS",
    "FULL",
    "Scenario",
    "Size",
    "ci_scenarios",
    "full_scenarios",
    "knobs",
    "merged_replies",
    "run_fresh",
    "run_on",
]


@dataclass(frozen=True)
class Size:
    """How much load a scenario offers and how long the harness waits."""

    chats: int
    rate_per_chat: float
    """Messages per second per chat."""
    duration_s: float
    drain_timeout_s: float
    quiet_s: float
    ready_timeout_s: float
    """How long a restarted driver may take to be ready."""


FULL = Size(
    chats=10, rate_per_chat=2.0, duration_s=60.0, drain_timeout_s=120.0, quiet_s=3.0, ready_timeout_s=300.0
)
CI = Size(
    chats=3, rate_per_chat=2.0, duration_s=4.0, drain_timeout_s=60.0, quiet_s=1.0, ready_timeout_s=180.0
)


@dataclass(frozen=True)
class Scenario:
    name: str
    faults: tuple[Fault, ...]
    strict: bool = False
    """``runtime.sessions_per_host: 1`` instead of the default 2000."""
    pool: bool = False
    """``runtime.deliver_in_host: false``: every reply through the delivery actors (on one machine
    with SQLite the hosts send their chats' head replies themselves, so a killed delivery actor
    would rarely be mid-send: docs/decisions.md#delivery-in-host)."""


def knobs(strict: bool, chats: int, *, lean: bool = False, pool: bool = False) -> dict[str, Any]:
    """``runtime:`` keys of a scenario's serve: strict mode holds a host per session (two spare
    slots over the chats, so no measured session is evicted). ``lean`` (the CI subset): one
    session host and one delivery actor to start (fewer processes to start on a 2-core machine;
    a kill then takes every session, or every delivery, at once). ``pool``: every reply through
    the delivery actors (:attr:`Scenario.pool`)."""
    out: dict[str, Any] = {"sessions_per_host": 1, "max_live_sessions": chats + 2} if strict else {}
    out |= {"deliver_in_host": False} if pool else {}
    return out | ({"min_hosts": 1, "delivery_actors": 1} if lean else {})


def full_scenarios(size: Size = FULL) -> list[Scenario]:
    """Every scenario of ``make chaos``: a baseline, kill -9 of each actor kind (session hosts
    every 10 s and the router twice, in both modes; delivery actors every 5 s; the host
    supervisor once), kill -9 and SIGTERM restarts of the driver, and platform outages of 10 s
    and 60 s (from 10 s after the load start) of HTTP 500, 429 and refused connections."""
    d = size.duration_s
    out = [
        Scenario("baseline", ()),
        Scenario("host_kill", (Fault("kill:SessionHost", 5.0, 10.0),)),
        Scenario("host_kill_strict", (Fault("kill:SessionHost", 5.0, 10.0),), strict=True),
        Scenario("delivery_kill", (Fault("kill:DeliveryActor", 2.5, 5.0),), pool=True),
        Scenario("router_kill", (Fault("kill:RouterActor", d / 3), Fault("kill:RouterActor", 2 * d / 3))),
        Scenario(
            "router_kill_strict",
            (Fault("kill:RouterActor", d / 3), Fault("kill:RouterActor", 2 * d / 3)),
            strict=True,
        ),
        Scenario("supervisor_kill", (Fault("kill:HostSupervisor", d / 3),)),
        Scenario("driver_kill", (Fault("driver:kill", d / 3),)),
        Scenario("driver_sigterm", (Fault("driver:term", d / 3),)),
    ]
    for seconds in (10, 60):
        for kind in ("500", "429", "refused"):
            out.append(
                Scenario(f"outage_{kind}_{seconds}s", (Fault(f"outage:{kind}", 10.0, seconds=seconds),))
            )
    return out


def ci_scenarios() -> list[Scenario]:
    """The CI subset's scenarios (:data:`CI` size, one shared serve with :data:`CI_BOTS` bots): the
    driver's kill -9 second (the new serve joins the old Ray, and every kill after it hits actors
    the dead driver created), its SIGTERM restart last.
    The three outage kinds run at once, each on the platform API of its own bot (one chat each),
    for 8 s — longer than a delivery's old retry budget (5 attempts, 7.5 s)."""
    outages = tuple(
        Fault(f"outage:{kind}", 0.5, seconds=8.0, target=i)
        for i, kind in enumerate(("500", "429", "refused"))
    )
    return [
        Scenario("outages", outages),
        # early, so that the kills after it hit actors a dead driver had created (their restarts
        # must not need anything the dead driver owned)
        Scenario("driver_kill", (Fault("driver:kill", 1.0),)),
        Scenario("delivery_kill", (Fault("kill:DeliveryActor", 1.0, 2.0),)),
        Scenario("host_kill", (Fault("kill:SessionHost", 1.5),)),
        Scenario("supervisor_kill", (Fault("kill:HostSupervisor", 1.0),)),
        Scenario("router_kill", (Fault("kill:RouterActor", 1.0), Fault("kill:RouterActor", 3.0))),
        Scenario("driver_sigterm", (Fault("driver:term", 1.0),)),
    ]


CI_BOTS = 3
"""Bots (and platform APIs) of the CI subset's serve."""


def merged_replies(platforms: list[FaultyPlatform]) -> dict[int, list[float]]:
    """Message id → reply arrival times over every platform API (message ids are unique)."""
    out: dict[int, list[float]] = {}
    for platform in platforms:
        for mid, times in platform.replies().items():
            out.setdefault(mid, []).extend(times)
    return out


async def _drain(
    platforms: list[FaultyPlatform], sent: list[Sent], not_before: float, deadline: float, quiet_s: float
) -> None:
    waiting = {s.mid for s in sent if s.accepted_at is not None}
    last_count, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        replies = merged_replies(platforms)
        count = sum(len(replies.get(s.mid, [])) for s in sent)
        if count != last_count:
            last_count, since = count, time.monotonic()
        answered = all(replies.get(mid) for mid in waiting)
        now = time.monotonic()
        if answered and now >= not_before and now - since >= quiet_s:
            return
        await asyncio.sleep(0.1)


def _answered_mid(reply_id: str) -> int | None:
    """The inbound message id a reply answers (a reply id is ``{session_id}/{message_id}``)."""
    tail = reply_id.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else None


async def _operator_pass(
    topo: Topology, platforms: list[FaultyPlatform], sent: list[Sent], raw: dict[str, Any], size: Size
) -> dict[str, Any]:
    """What an operator does after the scenario (docs/operations.md, "Delivery guarantees"): list
    the ``uncertain`` replies of this scenario's messages, look at the chat (the platform's
    ledger) and retry each one that did not arrive; then wait for those replies.

    Returns ``uncertain`` (this scenario's uncertain replies; None when the serve does not list
    them), ``lost_uncertain`` (lost messages whose reply is listed uncertain: surfaced, not silent),
    ``retried`` (operator retries), and ``lost_after_retry`` / ``duplicated_after_retry`` (the
    figures once the retried replies went out)."""
    rows = await asyncio.to_thread(topo.deliveries, "uncertain")
    mids = {s.mid for s in sent}
    mine: dict[str, int] = {}  # this scenario's uncertain replies: reply id → message id
    for row in rows or []:
        reply_id = str(row.get("reply_id", ""))
        mid = _answered_mid(reply_id)
        if mid in mids:
            mine[reply_id] = mid
    replies = merged_replies(platforms)
    lost_mids = {s.mid for s in sent if s.accepted_at is not None and not replies.get(s.mid)}
    retried = 0
    for reply_id, mid in mine.items():
        if not replies.get(mid):  # the chat does not show it
            retried += await asyncio.to_thread(topo.retry, reply_id)
    if retried:
        await _drain(platforms, sent, time.monotonic(), time.monotonic() + size.drain_timeout_s, size.quiet_s)
    after = figures(sent, merged_replies(platforms), fault_end=time.monotonic(), stray=0) if retried else raw
    return {
        "uncertain": None if rows is None else len(mine),
        "lost_uncertain": len(lost_mids & set(mine.values())),
        "retried": retried,
        "lost_after_retry": after["lost"],
        "duplicated_after_retry": after["duplicated"],
    }


async def _loop_lag(start: float, end: float) -> float:
    """The longest delay of this process's event loop (a 0.1 s sleep that took longer) between
    ``start`` and ``end``: when the load client itself was starved of CPU, its timeouts and
    timings are suspect."""
    worst = 0.0
    while (now := time.monotonic()) < end:
        await asyncio.sleep(0.1)
        if now >= start:
            worst = max(worst, time.monotonic() - now - 0.1)
    return worst


def _fault_end(faults: tuple[Fault, ...], log: list[dict[str, Any]], t0: float, duration_s: float) -> float:
    """``time.monotonic()`` when the last fault ended: an outage's window, a restart's ``ready``."""
    ends = [t0 + f.end_s(duration_s) for f in faults]
    ends += [t0 + rec["t"] + (rec.get("waited_s") or 0.0) + (rec.get("ready_s") or 0.0) for rec in log]
    return max(ends, default=t0)


async def run_on(
    topo: Topology,
    platforms: list[FaultyPlatform],
    fixtures_dir: Path,
    scenario: Scenario,
    size: Size,
    *,
    redeliver: bool = True,
    group_base: int = 300_000_000,
) -> dict[str, Any]:
    """Run ``scenario`` on the started ``topo`` whose bot ``i`` sends to ``platforms[i]``: load and
    faults at once, then the drain; returns its figures (:func:`tests.chaos.figures.figures`)
    with ``uncertain``, ``ready_s`` (slowest driver restart, None without one or when one never
    got ready), the first restart's :func:`tests.chaos.figures.restart_recovery` figures,
    ``client_lag_max_s`` (:func:`_loop_lag` over the load), ``mode``, ``client`` and the
    ``faults`` log. Run it on uvloop (as the serve does; less CPU for the client)."""
    stray_before = sum(p.stray for p in platforms)
    log: list[dict[str, Any]] = []
    t0 = time.monotonic() + 0.2
    faults = asyncio.ensure_future(
        run_faults(
            scenario.faults, topo, platforms, t0=t0, duration_s=size.duration_s, log=log,
            ready_timeout_s=size.ready_timeout_s,
        )
    )  # fmt: skip
    lag = asyncio.ensure_future(_loop_lag(t0, t0 + size.duration_s))
    sent = await open_loop(
        topo.webhooks(), fixtures_dir, chats=size.chats, rate_per_chat=size.rate_per_chat,
        duration_s=size.duration_s, redeliver=redeliver, group_base=group_base, t0=t0,
    )  # fmt: skip
    await faults
    client_lag = await lag
    fault_end = _fault_end(scenario.faults, log, t0, size.duration_s)
    deadline = max(time.monotonic(), fault_end) + size.drain_timeout_s
    await _drain(platforms, sent, fault_end, deadline, size.quiet_s)
    stray = sum(p.stray for p in platforms) - stray_before
    out = figures(sent, merged_replies(platforms), fault_end=fault_end, stray=stray)
    restarts = [rec for rec in log if rec["fault"].startswith("driver:")]
    ready = [rec.get("ready_s") for rec in restarts]
    if restarts and restarts[0].get("ready_s") is not None:
        down = t0 + restarts[0]["t"]
        out |= restart_recovery(
            sent, merged_replies(platforms), down_at=down, ready_at=down + restarts[0]["ready_s"]
        )
    out.update(await _operator_pass(topo, platforms, sent, out, size))
    out["ready_s"] = None if not ready or None in ready else max(r for r in ready if r is not None)
    out["client_lag_max_s"] = round(client_lag, 2)
    out["mode"] = "strict" if scenario.strict else "packed"
    out["client"] = "redelivering" if redeliver else "once"
    out["faults"] = log
    return out


def run_fresh(
    scenario: Scenario,
    size: Size,
    fixtures_dir: Path,
    *,
    redeliver: bool = True,
    keep_dir: Path | None = None,
) -> dict[str, Any]:
    """Run ``scenario`` on a serve (one bot) and platform API of its own, started here and every
    process killed after; a failure to start is reported as ``{"error": ...}``. ``keep_dir``:
    copy the serve logs there (``<keep_dir>/<scenario>/serve-<n>.log``), and the SQLite database
    when a message was lost or answered twice."""
    with tempfile.TemporaryDirectory(prefix="chaos-", dir="/tmp", ignore_cleanup_errors=True) as d, \
            FaultyPlatform(fixtures_dir) as platform:  # fmt: skip
        topo = Topology(Path(d), [platform.base_url], knobs(scenario.strict, size.chats, pool=scenario.pool))
        try:
            out: dict[str, Any] = {"start_s": round(topo.start(size.ready_timeout_s), 1)}
            out |= uvloop.run(run_on(topo, [platform], fixtures_dir, scenario, size, redeliver=redeliver))
        except Exception as exc:
            out = {"error": repr(exc)[:2000]}
        finally:
            topo.close()
            if keep_dir is not None:
                failed = bool(out.get("lost") or out.get("duplicated") or "error" in out)
                _keep(Path(d), keep_dir / scenario.name, database=failed)
    return out


def _keep(src: Path, dst: Path, *, database: bool) -> None:
    """Copy the serve logs of ``src`` to ``dst`` (and the SQLite database when ``database``)."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    for log in src.glob("serve-*.log"):
        shutil.copy(log, dst / log.name)
    if database:
        for db in (src / "data").glob("sessionray.db*"):
            shutil.copy(db, dst / db.name)

"""The figures of one chaos scenario, and the table ``make chaos`` prints.

From the load's records (:class:`tests.chaos.load.Sent`) and the replies the platform API
delivered (message id → arrival times):

* ``sent`` — distinct messages offered; ``accepted`` — got a 200 at least once;
  ``never_accepted`` = sent − accepted;
* ``answered_once`` / ``duplicated`` — messages with exactly one / more than one delivered reply
  (whether accepted or not: a message whose 200 was lost on the way may still be answered —
  ``answered_not_accepted`` counts those);
* ``lost`` — accepted, and no reply after the drain wait;
* ``stall_s`` — the longest time without any delivered reply while the load was offered (from
  its first to its last scheduled message, both ends included);
* ``drain_s`` — from the later of the load's last scheduled message and the end of the last
  fault to the last delivered reply (how long the system needed to catch up; 0 when it was
  already done);
* ``unavailable_s`` — seconds the webhook did not answer 200: every run of consecutive attempts
  (all messages, in time order) that got a 503, another status, a refused connection or a
  timeout counts from its first attempt to the next attempt that got a 200 (or its own last one);
  ``http_503`` and ``conn_errors`` count such attempts, ``answers`` counts every attempt by its
  outcome (``"200"``, ``"503"``, ``"ConnectError"``, ``"ReadTimeout"`` …), ``redeliveries``
  the attempts after a message's first;
* ``stray_replies`` — delivered sends matching no message (should be 0);
* ``lost_ids`` / ``duplicated_ids`` — the first 20 message ids of each (to look them up in the
  serve's logs and database).

A driver restart scenario adds (:func:`restart_recovery`; a message's latency is its first
reply's arrival minus its scheduled send time): ``pre_p50_s`` — the p50 latency of the messages
due before the restart; ``recovery_s`` — from ``ready`` to the start of the first
:data:`WINDOW_S` window (messages due in it, at least :data:`WINDOW_MIN` of them answered) whose
p50 is within the pre-restart p50 (at most ``max(1.5 × pre_p50_s, pre_p50_s + 0.05 s)``), None
when none is; ``p50_after_10s_s`` — the p50 of the messages due from 10 s after ``ready`` on;
``p50_by_s_after_ready`` — the p50 of each second's messages for :data:`TIMELINE_S` s after
``ready`` (None: fewer than :data:`WINDOW_MIN` answered).

``uncertain`` (this scenario's replies the serve lists ``uncertain``), ``lost_uncertain``,
``retried`` and ``lost_after_retry`` / ``duplicated_after_retry`` (after the operator retried the
uncertain replies that did not arrive) and the driver's ``ready_s`` come from elsewhere
(:mod:`tests.chaos.scenarios`).
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from typing import Any

from tests.chaos.load import Sent

__all__ = ["COLUMNS", "TIMELINE_S", "WINDOW_MIN", "WINDOW_S", "figures", "restart_recovery", "table"]

COLUMNS = (
    "sent", "accepted", "answered_once", "duplicated", "lost", "never_accepted", "uncertain",
    "lost_after_retry", "stall_s", "drain_s", "unavailable_s", "ready_s", "recovery_s",
)  # fmt: skip
"""Columns of :func:`table` (``ready_s``: a driver scenario's slowest restart; ``recovery_s``: see
:func:`restart_recovery`)."""
WINDOW_S = 1.0
"""Width of the rolling windows of :func:`restart_recovery`, in seconds."""
TIMELINE_S = 25
"""Seconds after ``ready`` that :func:`restart_recovery`'s ``p50_by_s_after_ready`` covers."""
WINDOW_MIN = 3
"""Answered messages a window needs to count."""


def _stall(replies: list[float], start: float, end: float) -> float:
    points = [start, *sorted(t for t in replies if start <= t <= end), end]
    return max((b - a for a, b in itertools.pairwise(points)), default=0.0)


def _unavailable(attempts: list[tuple[float, int | str]]) -> float:
    total, since, last_bad = 0.0, None, 0.0
    for t, outcome in sorted(attempts, key=lambda a: a[0]):
        if outcome != 200:
            since = t if since is None else since
            last_bad = t
        elif since is not None:
            total, since = total + (t - since), None
    return total + (last_bad - since if since is not None else 0.0)


def figures(
    sent: list[Sent], replies: dict[int, list[float]], *, fault_end: float, stray: int
) -> dict[str, Any]:
    """The figures of one scenario (module docstring). ``fault_end``: ``time.monotonic()`` when
    the last fault window ended (a kill: its moment)."""
    counts = {s.mid: len(replies.get(s.mid, [])) for s in sent}
    accepted = [s for s in sent if s.accepted_at is not None]
    failed = [(t, o) for s in sent for t, o in s.attempts if o != 200]
    every_reply = sorted(t for s in sent for t in replies.get(s.mid, []))
    start, end = (sent[0].due, sent[-1].due) if sent else (0.0, 0.0)
    done_after = max(end, fault_end)
    return {
        "sent": len(sent),
        "accepted": len(accepted),
        "answered_once": sum(1 for n in counts.values() if n == 1),
        "duplicated": sum(1 for n in counts.values() if n > 1),
        "lost": sum(1 for s in accepted if counts[s.mid] == 0),
        "never_accepted": len(sent) - len(accepted),
        "answered_not_accepted": sum(1 for s in sent if s.accepted_at is None and counts[s.mid] > 0),
        "stall_s": round(_stall(every_reply, start, end), 2) if sent else None,
        "drain_s": round(max(0.0, every_reply[-1] - done_after), 2) if every_reply else None,
        "unavailable_s": round(_unavailable([a for s in sent for a in s.attempts]), 2),
        "http_503": sum(1 for _, o in failed if o == 503),
        "conn_errors": sum(1 for _, o in failed if isinstance(o, str)),
        "redeliveries": sum(len(s.attempts) - 1 for s in sent),
        "answers": dict(sorted(Counter(str(o) for s in sent for _, o in s.attempts).items())),
        "stray_replies": stray,
        "lost_ids": sorted(s.mid for s in accepted if counts[s.mid] == 0)[:20],
        "duplicated_ids": sorted(mid for mid, n in counts.items() if n > 1)[:20],
    }


def _p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def restart_recovery(
    sent: list[Sent], replies: dict[int, list[float]], *, down_at: float, ready_at: float
) -> dict[str, Any]:
    """``pre_p50_s``, ``recovery_s`` and ``p50_after_10s_s`` (module docstring) of a restart that
    began at ``down_at`` and was ready at ``ready_at`` (both ``time.monotonic()``)."""
    latency = {s.mid: min(replies[s.mid]) - s.due for s in sent if replies.get(s.mid)}
    pre = _p50([latency[s.mid] for s in sent if s.due < down_at and s.mid in latency])
    after = sorted((s.due, latency[s.mid]) for s in sent if s.due >= ready_at and s.mid in latency)
    recovery: float | None = None
    if pre is not None and after:
        bound = max(1.5 * pre, pre + 0.05)
        start = ready_at
        while start <= after[-1][0]:
            window = [lat for due, lat in after if start <= due < start + WINDOW_S]
            if len(window) >= WINDOW_MIN and (_p50(window) or 0.0) <= bound:
                recovery = round(start - ready_at, 2)
                break
            start += WINDOW_S / 4
    late = _p50([lat for due, lat in after if due >= ready_at + 10.0])
    by_second = []
    for k in range(TIMELINE_S):
        window = [lat for due, lat in after if ready_at + k <= due < ready_at + k + 1]
        p50 = _p50(window) if len(window) >= WINDOW_MIN else None
        by_second.append(None if p50 is None else round(p50, 2))
    return {
        "p50_by_s_after_ready": by_second,
        "pre_p50_s": None if pre is None else round(pre, 3),
        "recovery_s": recovery,
        "p50_after_10s_s": None if late is None else round(late, 3),
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    """A fixed-width table: one row per scenario, :data:`COLUMNS` (``-`` for None or missing)."""
    width = max([len("scenario"), *(len(n) for n in results)])
    head = f"{'scenario':<{width}} " + " ".join(f"{c:>{max(len(c), 6)}}" for c in COLUMNS)
    rows = [head]
    for name, fig in results.items():
        cells = []
        for c in COLUMNS:
            v = fig.get(c)
            cells.append(f"{'-' if v is None else v!s:>{max(len(c), 6)}}")
        rows.append(f"{name:<{width}} " + " ".join(cells))
    return "\n".join(rows)

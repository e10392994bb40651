"""The ingress side of the message path: session_key → host cache, the direct call, the watch of
each turn and the one retry after a host crash (docs/decisions.md#session-direct-path).

:class:`SubmitPath` lives in every process that submits messages (the ingress: driver or Ray
Serve replica), inside :class:`actors.placement.runtime.SessionRuntime`:

1. It caches session_key → (host, epoch) from the router shard's ``place`` answer (an LRU of
   ``CACHE_SIZE`` keys) and sends the message straight to the host's streaming ``submit``: the
   first item says accepted / duplicate / busy / moved. ``moved`` (the host passivated the
   session, or it was placed again) or a dead host drops the cache entry and asks the shard again
   with the stale epoch (at most ``MAX_HOPS`` times).
2. Calls for one key pass in arrival order (:class:`actors.placement.admission.KeyOrder`), so the host
   stamps their ``seq`` in that order.
3. An accepted message is *in flight* until the second item (its ``TurnResult``) arrives. When the
   host dies before that, the first watcher of that (key, epoch) sends every in-flight message of
   the key once more, in their order, with ``attempt=1`` (the session is re-activated from SQL on
   another host; its recorded inbound marker means tools that ran are not run again:
   docs/decisions.md#session-crash-recovery). A second loss is counted and logged.
4. With :attr:`SubmitPath.marks` set (the ingress's, and each router shard's recovery loop), the
   message's durable inbox row is marked ``routed`` when a host accepts it and ``handled`` when its
   ``TurnResult`` arrives or a host answers ``duplicate`` (batched in the background:
   :class:`runtime.memory.inbox_marks.InboxMarks`; docs/decisions.md#inbox-durable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors.placement.admission import KeyOrder
from actors.placement.router_control import DEAD
from runtime import tracing

__all__ = ["CACHE_SIZE", "MAX_HOPS", "RAY_CALLS_PER_MESSAGE", "SubmitPath"]

log = logging.getLogger("sessionray.submit")

RAY_CALLS_PER_MESSAGE = 2
"""Ray actor calls of one message to a live session whose host this process has cached: this
process's streaming ``SessionHost.submit``, and the host's ``DeliveryActor.notify`` after the
hand-over (not awaited); one, without the notify, for a reply its host sends itself
(``runtime.deliver_in_host``: docs/decisions.md#delivery-in-host). A cache miss adds the router
shard's ``place`` (docs/architecture.md,
"The path of one message"; docs/decisions.md#session-direct-path). Counted on a real run by
``tests/actors/placement/test_message_ray_calls.py``; docs/architecture.md quotes it."""

CACHE_SIZE = 100_000
"""Session keys whose host one ingress process remembers (LRU)."""
MAX_HOPS = 6
"""Host answers of ``moved`` / dead in a row before a message is answered ``busy``."""


@dataclass(frozen=True)
class _Place:
    host: Any
    host_id: str
    epoch: int


@dataclass
class _InFlight:
    inbound: Any
    place: _Place
    seq: int
    attempt: int


class SubmitPath:
    """Direct submission with a placement cache (see the module docstring).

    Args:
        router_of: ``session_key -> router shard handle`` (anything whose ``place.remote(...)``
            is awaitable).
        order: The per-key arrival order of this process.
        marks: Where inbox marks go (``routed`` / ``handled`` by ``(platform, bot_id,
            message_id)``); None: no marks.
    """

    def __init__(self, router_of: Callable[[str], Any], order: KeyOrder, marks: Any = None) -> None:
        self._router_of = router_of
        self._order = order
        self.marks = marks
        self._cache: OrderedDict[str, _Place] = OrderedDict()
        self._inflight: dict[str, dict[int, _InFlight]] = {}
        """Per key, by a local counter: accepted messages whose turn result has not arrived."""
        self._ids = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._recent: list[float] = []
        self.counts = {
            "accepted": 0,
            "duplicate": 0,
            "busy": 0,
            "ignored": 0,
            "turns": 0,
            "errors": 0,
            "retried": 0,
            "lost": 0,
            "requeued": 0,
            "cache_hits": 0,
            "cache_misses": 0,
        }

    # ------------------------------------------------------------------ submit

    async def submit(self, inbound: Any, attempt: int = 0) -> dict[str, Any]:
        """Offer ``inbound`` to its session's host; ``{"status", "retry_after_s", "seq"}``.

        ``busy`` also when ``MAX_HOPS`` placements in a row were stale (hosts dying or churning).

        Args:
            attempt: 0 for a first delivery; 1 for a message whose turn may have started before
                (the inbox recovery loop: the host then resumes it from its recorded inbound
                marker instead of answering ``duplicate`` for the marker alone).

        Raises:
            ray.exceptions.RayActorError: the router shard is down.
        """
        if not getattr(inbound, "triggered", True):
            self.counts["ignored"] += 1
            return {"status": "accepted", "retry_after_s": None, "seq": None}
        key = inbound.session_key
        async with self._order.turn(key):
            answer = await self._offer(inbound, attempt)
        return answer

    async def _offer(
        self, inbound: Any, attempt: int, stale: int | None = None, dead: str | None = None
    ) -> dict[str, Any]:
        key = inbound.session_key
        for _ in range(MAX_HOPS):
            place = self._cache.get(key)
            if place is None:
                self.counts["cache_misses"] += 1
                with tracing.span("activation", stale=stale is not None) as step:
                    res = await self._router_of(key).place.remote(key, stale, dead)
                    step.set(status=res["status"])
                if res["status"] == "busy":
                    self.counts["busy"] += 1
                    return {"status": "busy", "retry_after_s": res["retry_after_s"], "seq": None}
                place = _Place(res["host"], res["host_id"], res["epoch"])
                self._remember(key, place)
            else:
                self.counts["cache_hits"] += 1
                self._cache.move_to_end(key)
            gen = place.host.submit.remote(inbound, place.epoch, attempt)
            try:
                first = await (await gen.__anext__())
            except DEAD:
                self._cache.pop(key, None)
                stale, dead = place.epoch, place.host_id
                continue
            if first["status"] == "moved":
                self._cache.pop(key, None)
                stale, dead = place.epoch, None
                continue
            if first["status"] == "accepted":
                self._track(inbound, place, gen, int(first["seq"]), attempt)
                self._mark("routed", inbound)
            else:
                self.counts[first["status"]] += 1
                if first["status"] == "duplicate" and first.get("done"):
                    # a duplicate of a turn still running (or cut off) stays open: that turn's own
                    # result, or the inbox recovery, closes it (docs/decisions.md#inbox-durable)
                    self._mark("handled", inbound)
            return {
                "status": first["status"],
                "retry_after_s": first.get("retry_after_s"),
                "seq": first["seq"],
            }
        log.warning("no stable host for %s after %d tries (hosts churning); answering busy", key, MAX_HOPS)
        self.counts["busy"] += 1
        return {"status": "busy", "retry_after_s": 1.0, "seq": None}

    def _mark(self, state: str, inbound: Any) -> None:
        marks = self.marks
        if marks is not None:
            getattr(marks, state)(inbound.platform, inbound.bot_id, inbound.message_id)

    def _remember(self, key: str, place: _Place) -> None:
        self._cache[key] = place
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)

    # ------------------------------------------------------------------ watch and retry

    def _track(self, inbound: Any, place: _Place, gen: Any, seq: int, attempt: int) -> None:
        self.counts["accepted"] += 1
        self._recent.append(time.monotonic())
        self._ids += 1
        ident = self._ids
        self._inflight.setdefault(inbound.session_key, {})[ident] = _InFlight(inbound, place, seq, attempt)
        task = asyncio.ensure_future(self._watch(inbound, ident, gen))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, inbound: Any, ident: int, gen: Any) -> None:
        key = inbound.session_key
        try:
            result = await (await gen.__anext__())
        except DEAD as exc:
            await self._recover(key, ident, exc)
            return
        except Exception as exc:  # pragma: no cover - a Ray transport error; logged
            self._done(key, ident)
            self.counts["errors"] += 1
            log.warning("turn of %s ended without a result: %r", key, exc)
            return
        self._done(key, ident)
        self.counts["turns"] += 1
        if getattr(result, "outcome", "") != "error":  # an error turn stays open: the inbox replays it
            self._mark("handled", inbound)
        if getattr(result, "outcome", "") == "error":
            self.counts["errors"] += 1
            log.warning(
                "turn %s#%s failed: %s", key, getattr(result, "seq", "?"), getattr(result, "error", "")
            )

    def _done(self, key: str, ident: int) -> _InFlight | None:
        entries = self._inflight.get(key)
        if entries is None:
            return None
        entry = entries.pop(ident, None)
        if not entries:
            del self._inflight[key]
        return entry

    async def _recover(self, key: str, ident: int, exc: BaseException) -> None:
        """The host died with this message in flight: resend every in-flight message of ``key`` on
        that host, in their order, once (``attempt=1``); the others' watchers find theirs taken."""
        mine = (self._inflight.get(key) or {}).get(ident)
        if mine is None:
            return  # a sibling's recovery took it
        async with self._order.turn(key):
            batch = sorted(
                (i, e)
                for i, e in (self._inflight.get(key) or {}).items()
                if e.place.host_id == mine.place.host_id
            )
            for i, _ in batch:
                self._done(key, i)
            self._cache.pop(key, None)
            first = True
            for _, entry in batch:
                if entry.attempt >= 1:
                    self._lost(entry, key, f"its host died twice ({exc!r})")
                    continue
                self.counts["retried"] += 1
                try:
                    dead = entry.place.host_id if first else None
                    first = False
                    await self._offer(entry.inbound, 1, entry.place.epoch, dead)
                except Exception as err:
                    self._lost(entry, key, f"not retried after its host died ({err!r})")

    def _lost(self, entry: _InFlight, key: str, why: str) -> None:
        """No more retries here: with inbox marks the message's row is still open and the
        recovery loop routes it (``requeued``); without, it is ``lost`` (logged at ERROR)."""
        if self.marks is not None:
            self.counts["requeued"] += 1
            log.warning(
                "message %s of %s left to the inbox recovery loop: %s", entry.inbound.message_id, key, why
            )
        else:
            self.counts["lost"] += 1
            log.error("message %s of %s lost: %s", entry.inbound.message_id, key, why)

    # ------------------------------------------------------------------ introspection

    def in_flight_ids(self, session_key: str) -> set[str]:
        """Message ids of ``session_key`` a host accepted from this path whose turn result has not
        come back yet."""
        return {str(e.inbound.message_id) for e in (self._inflight.get(session_key) or {}).values()}

    def status(self) -> dict[str, Any]:
        """Counters plus ``pending`` (in-flight turns), ``cached`` keys and ``throughput_msg_s``
        (accepted in the last 60 s)."""
        now = time.monotonic()
        self._recent = [t for t in self._recent if now - t <= 60.0]
        span = min(60.0, max(1.0, now - self._recent[0])) if self._recent else 60.0
        return {
            **self.counts,
            "pending": sum(len(v) for v in self._inflight.values()),
            "cached": len(self._cache),
            "throughput_msg_s": round(len(self._recent) / span, 3),
        }

    async def close(self) -> None:
        """Stop watching (the turns run on in their hosts) and write the buffered inbox marks."""
        loop = asyncio.get_running_loop()
        mine = [t for t in self._tasks if t.get_loop() is loop]  # a test's loop may be gone already
        for t in mine:
            t.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*mine, return_exceptions=True)
        self._tasks.clear()
        self._cache.clear()
        if self.marks is not None:
            with contextlib.suppress(Exception):  # the database may be gone already
                await self.marks.close()

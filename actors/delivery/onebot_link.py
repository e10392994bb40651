"""``OneBotLink``: the per-bot rendezvous between delivery actors and the process holding a OneBot
WebSocket (docs/decisions.md#platform-onebot-ws-link).

Why an actor: a OneBot socket lives in one ingress process (the ``sessionray serve`` driver or one
Ray Serve replica), while the delivery actor that sends a chat's reply may run on any node — it
cannot write to a socket held by another process, and it cannot know which process holds it.
A detached named actor (``sessionray-onebot-{self_id}``, namespace ``sessionray``) is reachable
by name from every process of the cluster, so both sides meet there:

* a delivery actor calls ``call(frame, timeout_s)`` and awaits the answer;
* the socket holder long-polls ``next_calls(holder, wait_s)``, writes each frame (its ``echo``
  unique per call) and hands the answer back with ``resolve(echo, response)``;
* ``acquire(holder, ttl_s, take_over)`` names the one holder: a reverse socket takes over (the
  implementation's newest connection wins), a forward dialer only takes a free or expired lease,
  so on a cluster one ingress process dials per bot. Each ``next_calls`` renews the lease; a
  holder that dies stops renewing, and after ``ttl_s`` another process may take over.

A call waits for a socket up to its timeout; one never written is ``not_sent`` (retried by the
delivery ledger like an HTTP connect error), one written and not answered (timeout, socket
closed) is ``no_answer`` (not retried: at most once). The actor keeps no state worth recovering:
after a restart in-flight callers fail on their side and the holders acquire again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray

from runtime.platforms.base import ApiCall, PlatformCodec, SendResult
from runtime.platforms.onebot11_ws import SocketAnswer, api_frame, send_result_of

__all__ = ["LINK_PREFIX", "LinkSender", "OneBotLink", "get_link", "link_name"]

log = logging.getLogger("sessionray.onebot_link")

NAMESPACE = "sessionray"
"""Ray namespace of every named sessionray actor (the value of ``actors.delivery.pool.NAMESPACE``; not
imported from there, as ``actors.delivery.pool`` imports this module)."""
LINK_PREFIX = "sessionray-onebot"
"""Name prefix of the link actors (``sessionray-onebot-{self_id}``)."""
MAX_BATCH = 64
"""Most calls one ``next_calls`` hands out."""


def link_name(self_id: str, prefix: str = LINK_PREFIX) -> str:
    """``{prefix}-{self_id}``, the actor name of one bot's link."""
    return f"{prefix}-{self_id}"


@dataclass
class _Call:
    frame: dict[str, Any]
    future: asyncio.Future[dict[str, Any]]
    taken_by: str | None = None


@dataclass
class _Lease:
    holder: str | None = None
    until: float = 0.0
    calls: deque[str] = field(default_factory=deque)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)
class OneBotLink:
    """One bot's rendezvous (async Ray actor; see module docstring).

    Args:
        self_id: The bot's QQ id (for logs).
    """

    def __init__(self, self_id: str) -> None:
        self.self_id = str(self_id)
        self.lease = _Lease()
        self.calls: dict[str, _Call] = {}
        self.wake = asyncio.Event()

    # ------------------------------------------------------------------ delivery side

    async def call(self, frame: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one API call (``{"action", "params"}``; an ``echo`` is set here) through the
        socket holder and wait up to ``timeout_s`` seconds.

        Returns:
            A :class:`~runtime.platforms.onebot11_ws.SocketAnswer` as a dict.
        """
        echo = uuid.uuid4().hex
        call = _Call({**frame, "echo": echo}, asyncio.get_running_loop().create_future())
        self.calls[echo] = call
        self.lease.calls.append(echo)
        self.wake.set()
        try:
            response = await asyncio.wait_for(asyncio.shield(call.future), timeout_s)
            return response
        except TimeoutError:
            if call.taken_by is None:
                with contextlib.suppress(ValueError):
                    self.lease.calls.remove(echo)
                error = f"no OneBot socket of bot {self.self_id} took the call within {timeout_s:g} s"
                return SocketAnswer(state="not_sent", error=error).model_dump()
            error = f"no answer on the socket within {timeout_s:g} s"
            return SocketAnswer(state="no_answer", error=error).model_dump()
        finally:
            self.calls.pop(echo, None)

    # ------------------------------------------------------------------ socket side

    async def acquire(self, holder: str, ttl_s: float, take_over: bool = False) -> bool:
        """Make ``holder`` the socket holder for ``ttl_s`` seconds: when none holds it, its lease
        expired, ``holder`` already holds it, or ``take_over``. Returns whether it holds it now."""
        now = time.monotonic()
        free = self.lease.holder is None or self.lease.until < now or self.lease.holder == holder
        if not (free or take_over):
            return False
        if self.lease.holder not in (None, holder):
            log.info("bot %s: socket holder %s replaced by %s", self.self_id, self.lease.holder, holder)
        self.lease.holder, self.lease.until = holder, now + ttl_s
        self.wake.set()  # a poll of the previous holder returns (None) at once
        return True

    async def release(self, holder: str) -> None:
        """``holder``'s socket closed: drop its lease, and fail the calls it wrote and did not see
        answered as ``no_answer`` (they may have been executed)."""
        if self.lease.holder == holder:
            self.lease.holder, self.lease.until = None, 0.0
        for call in list(self.calls.values()):
            if call.taken_by == holder and not call.future.done():
                call.future.set_result(
                    SocketAnswer(state="no_answer", error="the socket closed before the answer").model_dump()
                )
        self.wake.set()

    async def next_calls(self, holder: str, wait_s: float, ttl_s: float) -> list[dict[str, Any]] | None:
        """Calls queued for the socket (each frame with its ``echo``), waiting up to ``wait_s``
        seconds for one; renews ``holder``'s lease to ``ttl_s`` seconds. ``None``: ``holder`` no
        longer holds the socket (stop polling)."""
        deadline = time.monotonic() + wait_s
        while True:
            if self.lease.holder != holder:
                return None
            self.lease.until = time.monotonic() + ttl_s
            batch: list[dict[str, Any]] = []
            while self.lease.calls and len(batch) < MAX_BATCH:
                echo = self.lease.calls.popleft()
                call = self.calls.get(echo)
                if call is None or call.future.done():
                    continue
                call.taken_by = holder
                batch.append(call.frame)
            if batch:
                return batch
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), left)

    async def requeue(self, echos: list[str]) -> None:
        """Calls handed out by ``next_calls`` that the holder could not write (its socket had
        closed): back to the front of the queue, in order, for the next socket."""
        for echo in reversed(echos):
            call = self.calls.get(str(echo))
            if call is not None and not call.future.done():
                call.taken_by = None
                self.lease.calls.appendleft(str(echo))
        self.wake.set()

    async def resolve(self, echo: str, response: dict[str, Any]) -> bool:
        """Hand the answer frame of call ``echo`` to its caller; False when no caller waits (it
        timed out, or the echo is not ours)."""
        call = self.calls.get(str(echo))
        if call is None or call.future.done():
            return False
        call.future.set_result(SocketAnswer(state="answered", response=response).model_dump())
        return True

    async def state(self) -> dict[str, Any]:
        """``{"holder", "lease_left_s", "queued", "in_flight"}`` (tests, ``/healthz``)."""
        in_flight = sum(1 for c in self.calls.values() if c.taken_by is not None and not c.future.done())
        return {
            "holder": self.lease.holder,
            "lease_left_s": max(0.0, self.lease.until - time.monotonic()),
            "queued": len(self.lease.calls),
            "in_flight": in_flight,
        }


def get_link(self_id: str, prefix: str = LINK_PREFIX) -> Any:
    """The handle of bot ``self_id``'s link actor, created (detached) when it does not exist yet."""
    return OneBotLink.options(  # type: ignore[attr-defined]
        name=link_name(self_id, prefix), namespace=NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote(str(self_id))


class LinkSender:
    """The delivery side: send an HTTP-shaped OneBot :class:`ApiCall` through the bot's link
    (``runtime.delivery.core.DeliverySender``'s ``socket_sender``).

    Args:
        prefix: Name prefix of the link actors.
    """

    def __init__(self, prefix: str = LINK_PREFIX) -> None:
        self.prefix = prefix
        self._links: dict[str, Any] = {}

    async def __call__(
        self, codec: PlatformCodec, bot_id: str, call: ApiCall, timeout_s: float
    ) -> SendResult:
        """One call's :class:`SendResult`: the codec reads an answer; a call never written (no
        socket, link actor unreachable) is a retryable ``connect:`` failure; a written,
        unanswered one — or a call whose link actor failed under it — a non-retryable ``transport:``
        failure (at most once)."""
        link = self._links.get(bot_id)
        if link is None:
            link = self._links[bot_id] = get_link(bot_id, self.prefix)
        try:
            raw = await link.call.remote(api_frame(call), timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            # The call may have reached the link (and the socket) before the actor failed:
            # uncertain, so not retried (at most once).
            self._links.pop(bot_id, None)
            answer = SocketAnswer(state="no_answer", error=f"link actor failed: {type(exc).__name__}")
            return send_result_of(answer, codec)
        return send_result_of(SocketAnswer.model_validate(raw), codec)

"""One step of a delivery on the wire: the HTTP call, how its failure is read, and the waits
between retries (docs/decisions.md#delivery-outage, docs/decisions.md#delivery-uncertain).

* :func:`send_http` makes one platform call and turns the answer into a
  :class:`~runtime.platforms.base.SendResult`: a call that never reached the platform (connect
  refused or timed out, no pooled connection) is retryable with an error starting ``connect:``; a
  call that was written and not answered (read timeout, connection dropped) is *unanswered*, an
  error starting ``transport:`` (the same words the OneBot socket path uses), never retried —
  unless the server ended the connection before its TCP acknowledged any byte of the request (a
  client from :func:`runtime.delivery.clients.platform_client` knows): nothing reached the
  server, so it is a retryable ``connect:`` failure too (docs/decisions.md#delivery-not-received).
* :func:`retry_step` retries a retryable failure (429, 5xx, ``connect:``) with exponential back-off
  and full jitter, or exactly the platform's ``Retry-After`` (delta-seconds or an HTTP-date), for
  as long as the reply is younger than ``delivery.max_age_s``; before each wait it calls
  ``before_wait`` (the sender renews its lease there).

Nothing here touches the ledger or Ray.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from runtime.delivery.clients import PlatformClient
from runtime.delivery.wire_probe import probing
from runtime.platforms.base import ApiCall, PlatformCodec, SendResult

__all__ = [
    "MAX_DOUBLINGS",
    "OnWire",
    "StepOutcome",
    "full_jitter",
    "parse_retry_after",
    "retry_step",
    "send_http",
    "unanswered",
]

UNANSWERED_PREFIX = "transport:"
"""Error prefix of a call that was written and not answered (HTTP here, the OneBot socket in
``runtime.platforms.onebot11_ws``)."""
NOT_RECEIVED = "(the server ended the connection before acknowledging any byte of the request)"
"""Appended to the error of a call that was written and failed although no byte of it reached the
server (:mod:`runtime.delivery.wire_probe`): it is retried like a refused connect."""


def unanswered(result: SendResult) -> bool:
    """The call may have reached the platform and no answer came: an uncertain step."""
    return not result.ok and not result.retryable and (result.error or "").startswith(UNANSWERED_PREFIX)


def parse_retry_after(value: str, now_s: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds (possibly fractional) or an
    HTTP-date (seconds from ``now_s``, Unix seconds, default now; a past date is 0). None when
    it is neither."""
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


MAX_DOUBLINGS = 1000
"""Doublings of the back-off counted at most: ``2.0 ** 1000`` is still a float, and the wait is
long at the cap by then; an int ``2 ** n`` past 1023 cannot be multiplied with a float at all
(``OverflowError``: a reply retried more than ~1,024 times, e.g. through a long run of short
``Retry-After`` answers, stopped its chat's delivery until the next sweep)."""


def full_jitter(attempt: int, base_s: float, cap_s: float) -> float:
    """A uniformly random wait in ``[0, min(cap_s, base_s · 2^(attempt-1))]`` seconds ("full
    jitter": retries of many replies spread out instead of arriving together;
    docs/decisions.md#delivery-retries), for any ``attempt`` >= 1."""
    doublings = min(max(0, attempt - 1), MAX_DOUBLINGS)
    return random.uniform(0.0, min(cap_s, base_s * 2.0**doublings))


OnWire = Callable[[], Awaitable[None]]
"""Called once per attempt right before the write that completes the request at the server (its
body's first chunk; without a body, its headers): see :func:`send_http`."""


def _has_body(request: Any) -> bool:
    """The httpcore request carries a body (``Content-Length`` > 0 or a chunked one)."""
    for name, value in getattr(request, "headers", []):
        key = name.lower()
        if key == b"content-length":
            return value.strip() not in (b"", b"0")
        if key == b"transfer-encoding":
            return True
    return False


def _json_only(call: ApiCall) -> bool:
    """``call`` is a POST whose body is JSON and nothing else (no form, no files):
    :meth:`PlatformClient.post_json` sends it (the fast path; anything else goes through httpx's
    client)."""
    return call.method == "POST" and call.json_body is not None and call.form is None and not call.files


class _WireMark:
    """The ``trace`` extension of one httpx request: awaits ``on_wire`` right before the write
    that makes the request complete at the server — its body's first chunk (httpcore hands over
    the headers, then the body; a delivery platform client holds the headers and writes both in
    one write after the mark, docs/decisions.md#delivery-one-write, and a client without that
    hold has written the headers, which alone are never acted on) or, for a request without a
    body, its headers — and remembers that it did (docs/decisions.md#delivery-uncertain)."""

    def __init__(self, on_wire: OnWire) -> None:
        self.on_wire = on_wire
        self.reached = False
        self._at_body = False

    async def trace(self, event: str, info: dict[str, Any]) -> None:
        if self.reached:
            return
        if event.endswith(".send_request_headers.started"):
            self._at_body = _has_body(info.get("request"))
            if self._at_body:
                return
        elif not (self._at_body and event.endswith(".send_request_body.started")):
            return
        await self.on_wire()
        self.reached = True


async def send_http(
    client: httpx.AsyncClient, codec: PlatformCodec, call: ApiCall, on_wire: OnWire | None = None
) -> SendResult:
    """One platform call over HTTP (see module docstring for how failures are classified).

    Args:
        on_wire: Awaited right before the write that completes the request at the server — its
            body's first chunk, after the connection is made or taken from the pool and the
            headers are written (without a body: right before the headers) — so the ledger marks
            the step on the wire only when it is (docs/decisions.md#delivery-uncertain): a sender
            killed while connecting or between headers and body left nothing the platform acts
            on, and its step is sent again, not recorded uncertain. What it raises ends the call
            before the body is written (and propagates). A call that failed before it was
            reached is retryable (``connect:``) whatever the error; one that failed after it is
            retryable only when no byte of it reached the server (module docstring).
    """
    kwargs: dict[str, Any] = {"headers": call.headers}
    if call.json_body is not None:
        kwargs["json"] = call.json_body
    if call.form is not None:
        kwargs["data"] = call.form
    if call.files:
        kwargs["files"] = {k: (f.filename, f.data, f.content_type) for k, f in call.files.items()}
    mark = _WireMark(on_wire) if on_wire is not None else None
    if mark is not None:
        kwargs["extensions"] = {"trace": mark.trace}
    with probing() as attempt:
        try:
            if isinstance(client, PlatformClient) and client.direct_ok and _json_only(call):
                resp = await client.post_json(
                    call.url, call.json_body, call.headers, kwargs.get("extensions", {})
                )
            else:
                resp = await client.request(call.method, call.url, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            return SendResult(ok=False, error=f"connect: {exc!r}", retryable=True)  # never reached it
        except httpx.HTTPError as exc:
            if mark is not None and not mark.reached:  # failed before a byte was written
                return SendResult(ok=False, error=f"connect: {exc!r}", retryable=True)
            if attempt.not_received():  # docs/decisions.md#delivery-not-received
                return SendResult(ok=False, error=f"connect: {exc!r} {NOT_RECEIVED}", retryable=True)
            return SendResult(ok=False, error=f"{UNANSWERED_PREFIX} {exc!r}", retryable=False)
    result = codec.parse_send_result(resp.status_code, resp.headers, resp.content)
    if not result.ok and result.retry_after_s is None and "retry-after" in resp.headers:
        result = result.model_copy(update={"retry_after_s": parse_retry_after(resp.headers["retry-after"])})
    return result


@dataclass
class StepOutcome:
    """What :func:`retry_step` ended with: the last ``result``, the calls made, the waits in
    seconds, and ``expired`` when it gave up because the reply grew older than its deadline."""

    result: SendResult
    attempts: int = 0
    waits: list[float] = field(default_factory=list)
    expired: bool = False


async def retry_step(
    send: Callable[[], Awaitable[SendResult]],
    *,
    deadline_s: float,
    base_s: float,
    cap_s: float,
    before_wait: Callable[[float], Awaitable[None]] | None = None,
    on_retry: Callable[[SendResult, float], None] | None = None,
) -> StepOutcome:
    """Call ``send`` until it succeeds, fails for good, or the next try would start after
    ``deadline_s`` (Unix seconds: the reply's ``created_at`` + ``delivery.max_age_s``).

    The wait before try n+1 is the platform's ``retry_after_s`` when it gave one (honoured
    exactly, however long, as far as the deadline allows), else :func:`full_jitter` of n. Every
    step gets at least one try, however old its reply.

    Args:
        send: One try.
        deadline_s: See above.
        base_s: First back-off (``delivery.backoff_base_s``).
        cap_s: Longest back-off without a ``Retry-After`` (``delivery.backoff_max_s``).
        before_wait: Awaited with the wait (seconds) before each sleep (lease renewal).
        on_retry: Called with the failed result and the wait before each retry (logs, metrics).
    """
    out = StepOutcome(result=SendResult(ok=False, error="not sent"))
    while True:
        out.result = await send()
        out.attempts += 1
        if out.result.ok or not out.result.retryable:
            return out
        wait = out.result.retry_after_s
        wait = full_jitter(out.attempts, base_s, cap_s) if wait is None or wait < 0 else float(wait)
        if time.time() + wait > deadline_s:
            out.expired = True
            return out
        if before_wait is not None:
            await before_wait(wait)
        if on_retry is not None:
            on_retry(out.result, wait)
        out.waits.append(wait)
        await asyncio.sleep(wait)

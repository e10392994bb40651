"""Where a delivery step is marked on the wire (runtime/delivery/send.py,
docs/decisions.md#delivery-uncertain), against a real loopback TCP server that records the bytes
as they arrive: a request with a body is marked after its headers reached the server and before
any byte of its body was written (a request cut between the two is never acted on, so it stays
resendable); a request without a body is marked before its headers. Deterministic: httpx does not
write past the mark until ``on_wire`` returns, and ``on_wire`` waits (with a deadline) for what
must have arrived."""

from __future__ import annotations

import httpx

from runtime.delivery.send import send_http
from runtime.platforms.base import ApiCall
from tests.delivery.wire_support import Recorder, codec


async def test_a_request_with_a_body_is_marked_between_its_headers_and_its_body(
    recorder: tuple[Recorder, str],
) -> None:
    rec, base = recorder
    seen: list[bytes] = []

    async def on_wire() -> None:
        await rec.until(b"\r\n\r\n")  # the headers are at the server
        seen.append(bytes(rec.received))

    call = ApiCall(
        base_url=base, path="/send_private_msg", json_body={"user_id": 1, "message": "marker-text"}
    )
    async with httpx.AsyncClient() as client:
        result = await send_http(client, codec(base), call, on_wire)

    assert result.ok, result
    [at_mark] = seen
    assert at_mark.startswith(b"POST /send_private_msg ") and at_mark.endswith(b"\r\n\r\n")
    assert b"marker-text" not in at_mark  # no byte of the body yet
    assert b"marker-text" in rec.received  # and all of it after


async def test_a_request_without_a_body_is_marked_before_its_headers(recorder: tuple[Recorder, str]) -> None:
    rec, base = recorder
    seen: list[bytes] = []

    async def on_wire() -> None:
        seen.append(bytes(rec.received))

    call = ApiCall(method="GET", base_url=base, path="/get_status")
    async with httpx.AsyncClient() as client:
        result = await send_http(client, codec(base), call, on_wire)

    assert result.ok, result
    assert seen == [b""]
    assert rec.received.startswith(b"GET /get_status ")

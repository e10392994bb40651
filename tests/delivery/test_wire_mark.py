"""Where a delivery step is marked on the wire (runtime/delivery/send.py,
docs/decisions.md#delivery-uncertain), against a real loopback TCP server that records the bytes
as they arrive: a request with a body is marked after its headers reached the server and before
any byte of its body was written (a request cut between the two is never acted on, so it stays
resendable); a request without a body is marked before its headers. Deterministic: httpx does not
write past the mark until ``on_wire`` returns, and ``on_wire`` waits (with a deadline) for what
must have arrived."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from runtime.config import BotConfig
from runtime.delivery.send import send_http
from runtime.platforms.base import ApiCall, get_codec

DEADLINE_S = 10.0
OK = json.dumps({"status": "ok", "retcode": 0, "data": {"message_id": 7}}).encode()


class Recorder:
    """A loopback HTTP/1.1 server that keeps every byte received and answers 200 once the request
    (headers, and ``Content-Length`` bytes of body) is complete."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while b"\r\n\r\n" not in self.received:
            chunk = await reader.read(65536)
            if not chunk:
                return
            self.received += chunk
        head, _, body = bytes(self.received).partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < length:
            chunk = await reader.read(65536)
            if not chunk:
                return
            self.received += chunk
            body += chunk
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(OK) + OK
        )
        await writer.drain()
        writer.close()

    async def until(self, what: bytes) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while what not in self.received:
            assert time.monotonic() < deadline, f"{what!r} never reached the server: {bytes(self.received)!r}"
            await asyncio.sleep(0.005)


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    rec = Recorder()
    rec.server = await asyncio.start_server(rec.handle, "127.0.0.1", 0)
    port = rec.server.sockets[0].getsockname()[1]
    yield rec, f"http://127.0.0.1:{port}"
    rec.server.close()
    await rec.server.wait_closed()


def codec(base: str) -> Any:
    return get_codec(BotConfig(platform="onebot11", self_id="10001", api_base=base))


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

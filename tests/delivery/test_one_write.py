"""A delivery actor's platform client writes a request's headers and body as one write
(runtime/delivery/wire_probe.py, docs/decisions.md#delivery-one-write), against a real loopback
TCP server: httpcore's network stream is wrapped to count the writes that reach it, and the
on-the-wire mark (docs/decisions.md#delivery-uncertain) still comes before any byte of the request
leaves the client."""

from __future__ import annotations

from typing import Any

import httpcore
import pytest

from runtime.delivery.clients import platform_client
from runtime.delivery.send import send_http
from runtime.delivery.wire_probe import HOLD_BYTES
from runtime.platforms.base import ApiCall, MultipartFile
from tests.delivery.wire_support import PassThroughStream, Recorder, codec


class _Counted(PassThroughStream):
    """httpcore's own stream; every non-empty write is kept in ``writes``."""

    def __init__(self, inner: httpcore.AsyncNetworkStream, writes: list[bytes]) -> None:
        super().__init__(inner)
        self.writes = writes

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer:
            self.writes.append(buffer)
        await self._inner.write(buffer, timeout)


class _CountingBackend(httpcore.AnyIOBackend):
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def connect_tcp(
        self, host: str, port: int, *args: Any, **kwargs: Any
    ) -> httpcore.AsyncNetworkStream:
        return _Counted(await super().connect_tcp(host, port, *args, **kwargs), self.writes)


@pytest.mark.parametrize("direct", [True, False], ids=["post_json", "httpx_request"])
async def test_headers_and_body_leave_in_one_write_after_the_mark(
    recorder: tuple[Recorder, str], direct: bool
) -> None:
    rec, base = recorder
    backend = _CountingBackend()
    client = platform_client(10.0, 1, network_backend=backend)
    if not direct:
        client.event_hooks["request"].append(_no_op)  # every call through httpx's own client
    at_mark: list[tuple[bytes, int]] = []

    async def on_wire() -> None:
        at_mark.append((bytes(rec.received), len(backend.writes)))

    call = ApiCall(base_url=base, path="/send_private_msg", json_body={"user_id": 1, "message": "one-write"})
    try:
        result = await send_http(client, codec(base), call, on_wire)
    finally:
        await client.aclose()

    assert result.ok, result
    assert at_mark == [(b"", 0)]  # marked before a byte of the request was written
    [request] = backend.writes
    assert request.startswith(b"POST /send_private_msg ") and request.endswith(b'"message":"one-write"}')
    assert bytes(rec.received) == request


async def test_a_body_in_chunks_is_written_once_the_hold_limit_is_reached(
    recorder: tuple[Recorder, str],
) -> None:
    rec, base = recorder
    backend = _CountingBackend()
    client = platform_client(10.0, 1, network_backend=backend)
    parts = {
        name: MultipartFile(filename=f"{name}.bin", data=name.encode() * HOLD_BYTES, content_type="image/png")
        for name in ("a", "b", "c")
    }  # httpx streams a multipart body a part at a time
    call = ApiCall(base_url=base, path="/sendPhoto", form={"chat_id": "1"}, files=parts)
    try:
        result = await send_http(client, codec(base), call, _none)
    finally:
        await client.aclose()

    assert result.ok, result
    assert len(backend.writes) >= 3  # a large upload is not held whole: each write soon after its chunk
    assert all(len(w) < 2 * HOLD_BYTES for w in backend.writes[:-1])
    assert b"".join(backend.writes) == bytes(rec.received)
    assert all(name.encode() * HOLD_BYTES in rec.received for name in parts)


async def _no_op(request: Any) -> None:
    return None


async def _none() -> None:
    return None

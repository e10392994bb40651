"""What the delivery's wire tests share (tests/delivery): a loopback HTTP/1.1 server that records
every byte it receives, a OneBot codec for it, and a network stream that passes everything through
to httpcore's own (a test overrides the one method it watches)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpcore

from runtime.config import BotConfig
from runtime.platforms.base import get_codec

__all__ = ["DEADLINE_S", "OK", "PassThroughStream", "Recorder", "codec"]

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


def codec(base: str) -> Any:
    return get_codec(BotConfig(platform="onebot11", self_id="10001", api_base=base))


class PassThroughStream(httpcore.AsyncNetworkStream):
    """httpcore's stream ``inner``, every call passed through unchanged."""

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def aclose(self) -> None:
        await self._inner.aclose()

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

"""What the platform's TCP acknowledged of a request that failed: the delivery actors' platform
HTTP client (docs/decisions.md#delivery-not-received).

A platform call that failed after its body was written is uncertain — unless the connection was
ended by the peer (reset, or closed) and the peer's TCP acknowledged none of the request's bytes.
Then no byte of it reached the server's socket: a server application can only read what its TCP
received, that TCP acknowledges what it receives (at once, or within a delayed-ACK interval), and
a reset or closed connection delivers nothing more. A server that reads the request and resets
the connection before its ACK reaches us is the one case this misjudges (decisions, as above). Two real cases
end that way: a listen backlog that overflowed (the kernel never handed the connection to the
server and reset it when the request's data came) and a kept-alive connection the server closed
just before the request was written to it.

How it is known: a client whose httpcore pool has a :class:`ProbedBackend`
(:func:`runtime.delivery.clients.platform_client`) wraps every connection in a
:class:`_ProbedStream`. While :func:`probing` is active (one platform call), the stream records,
at the request's first write, the stream offset of its first byte (bytes the peer acknowledged +
bytes still unacknowledged in the send queue), and at a failed read or write (or an end of
stream) what the peer had acknowledged and the TCP state. Linux ``TCP_INFO``
(``tcpi_bytes_acked``, kernel ≥ 4.1) and ``SIOCOUTQ``; elsewhere nothing is known and a failure
after the body stays uncertain.

The same stream holds what httpcore writes of a request and sends it as one write when the answer
is first read (docs/decisions.md#delivery-one-write): headers and body leave together.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
import socket
import ssl
import struct
import sys
import termios
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpcore

__all__ = ["HOLD_BYTES", "Attempt", "ProbedBackend", "probing"]

HOLD_BYTES = 65_536
"""A request's bytes :class:`_ProbedStream` holds at most before it writes them (one write for the
headers and a body up to this size)."""

_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_AT = 120
"""Offset of ``tcpi_bytes_acked`` in Linux's ``struct tcp_info`` (stable ABI since 4.1)."""
_TCP_CLOSE, _TCP_CLOSE_WAIT, _TCP_LAST_ACK = 7, 8, 9
"""Linux TCP states of a connection the peer reset (CLOSE) or closed (CLOSE_WAIT, LAST_ACK)."""
_ENDED_BY_PEER = frozenset({_TCP_CLOSE, _TCP_CLOSE_WAIT, _TCP_LAST_ACK})


def _duplicate(sock: Any) -> socket.socket | None:
    """A ``socket.socket`` on a duplicate of ``sock``'s descriptor (a ``socket.socket`` or
    asyncio's ``TransportSocket``); None off Linux or without one."""
    if not sys.platform.startswith("linux") or not hasattr(sock, "fileno"):
        return None
    try:
        return socket.socket(fileno=os.dup(sock.fileno()))
    except OSError:
        return None


def _acked_and_state(sock: socket.socket | None) -> tuple[int, int] | None:
    """``(bytes the peer acknowledged, TCP state)`` of ``sock``; None off Linux or when unreadable."""
    if sock is None or sock.fileno() < 0:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return None
    if len(info) < _BYTES_ACKED_AT + _BYTES_ACKED.size:
        return None
    return _BYTES_ACKED.unpack_from(info, _BYTES_ACKED_AT)[0], info[0]


def _unacknowledged(sock: socket.socket) -> int | None:
    """Bytes written to ``sock`` and not yet acknowledged by the peer (``SIOCOUTQ``)."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except OSError:
        return None


@dataclass
class Attempt:
    """One platform call as its connection saw it (filled by :class:`_ProbedStream`).

    ``start``: stream offset of the request's first byte (None: not written, or not knowable);
    ``acked``/``state``: what the peer had acknowledged and the TCP state when a read or write
    failed or the stream ended (None: it did not, or not knowable).
    """

    start: int | None = None
    acked: int | None = None
    state: int | None = None
    written: bool = False

    def not_received(self) -> bool:
        """The peer ended the connection and acknowledged no byte of the request (see module
        docstring): the server cannot have read it."""
        if self.start is None or self.acked is None or self.state is None:
            return False
        return self.state in _ENDED_BY_PEER and self.acked <= self.start


_CURRENT: contextvars.ContextVar[Attempt | None] = contextvars.ContextVar("platform_attempt", default=None)


@contextlib.contextmanager
def probing() -> Iterator[Attempt]:
    """Record what the connection of the platform call made inside this block saw (the call
    runs in the caller's task: httpx over HTTP/1.1 starts none)."""
    attempt = Attempt()
    token = _CURRENT.set(attempt)
    try:
        yield attempt
    finally:
        _CURRENT.reset(token)


class _ProbedStream(httpcore.AsyncNetworkStream):
    """A network stream that fills the current :class:`Attempt` (see module docstring).

    It holds a duplicate of the connection's file descriptor (Linux only), so the socket can still
    be asked what it saw after asyncio closed its own descriptor on a reset; :meth:`aclose` closes
    it (the connection is closed when both are).
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream, dup: socket.socket | None = None) -> None:
        self._inner = inner
        self._dup = dup if dup is not None else _duplicate(inner.get_extra_info("socket"))
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._held_timeout: float | None = None

    def _ended(self) -> None:
        attempt = _CURRENT.get()
        if attempt is not None and attempt.written and attempt.acked is None:
            found = _acked_and_state(self._dup)
            if found is not None:
                attempt.acked, attempt.state = found

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        """Send what :meth:`write` holds (the whole request), then read. A failed send is left to
        the read, as httpcore does after a failed write: a server that closed early may still
        have answered; else the read fails too."""
        with contextlib.suppress(httpcore.WriteError):
            await self._flush()
        try:
            data = await self._inner.read(max_bytes, timeout)
        except (httpcore.ReadError, httpcore.ReadTimeout):
            self._ended()
            raise
        if not data:
            self._ended()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        """Hold ``buffer`` until the request is complete (HTTP/1.1 writes a whole request before
        it reads the answer), so headers and body go out in one write: one system call, one
        timeout scope and one turn of the event loop less per call
        (docs/decisions.md#delivery-one-write). More than :data:`HOLD_BYTES` held is sent at once
        (a large upload keeps a write timeout per chunk)."""
        if buffer:
            self._held.append(buffer)
            self._held_bytes += len(buffer)
            self._held_timeout = timeout
        if self._held_bytes >= HOLD_BYTES:
            await self._flush()

    async def _flush(self) -> None:
        """Write what is held as one buffer; the first write of a probed call records where the
        request starts in the stream (:class:`Attempt`). Raises httpcore's write errors."""
        if not self._held:
            return
        buffer = self._held[0] if len(self._held) == 1 else b"".join(self._held)
        timeout = self._held_timeout
        self._held, self._held_bytes = [], 0
        attempt = _CURRENT.get()
        if attempt is not None and not attempt.written:
            attempt.written = True
            sock = self._dup
            found, queued = _acked_and_state(sock), _unacknowledged(sock) if sock is not None else None
            if found is not None and queued is not None:
                attempt.start = found[0] + queued
        try:
            await self._inner.write(buffer, timeout)
        except (httpcore.WriteError, httpcore.WriteTimeout):
            self._ended()
            raise

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._dup is not None:
                self._dup.close()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        tls = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        dup, self._dup = self._dup, None  # the TLS stream owns it now
        return _ProbedStream(tls, dup)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class ProbedBackend(httpcore.AsyncNetworkBackend):
    """httpcore's own backend, every connection wrapped in :class:`_ProbedStream`."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(
        self, host: str, port: int, *args: Any, **kwargs: Any
    ) -> httpcore.AsyncNetworkStream:
        """The inner backend's connection (same arguments), wrapped."""
        return _ProbedStream(await self._inner.connect_tcp(host, port, *args, **kwargs))

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        return _ProbedStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)

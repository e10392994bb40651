"""A platform call no byte of which reached the server is sent again, not recorded uncertain; one
the server may have read never is (docs/decisions.md#delivery-not-received); and a bot's platform
API gets at most ``bots[].max_connections`` connections (docs/decisions.md#delivery-connections).

Against :class:`tests.weak_platform_server.WeakPlatformServer` (a plain single-threaded socket
server, HTTP/1.0 or kept alive) through a real :class:`DeliverySender` and its SQLite ledger. The
exact conditions are built, not waited for: the request's first write is held (a wrapper around
httpcore's own network stream: it only waits) until the server has closed the connection, so
every byte of the request reaches a socket the server already closed — as a connection the
kernel reset when the listen backlog overflowed (issue 27: 1 of 660 replies ``uncertain`` with
``ReadError('')`` and lost), or a kept-alive connection the server closed just as it was reused.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpcore
import pytest

from runtime.config import BotConfig
from runtime.delivery import ledger as ledger
from runtime.delivery.clients import actor_connections
from runtime.delivery.core import DeliveryJob, DeliveryResult, DeliverySender, DeliverySettings
from tests.actors.edge_support import onebot_bot, private_call, text_job
from tests.delivery.wire_support import PassThroughStream
from tests.weak_platform_server import WeakPlatformServer

Gate = threading.Event | None
"""What a held write waits for (None: it is not held)."""


class _HeldStream(PassThroughStream):
    """httpcore's stream, whose first write of a request (a write starting ``POST``) is held
    while ``hold(n)`` (n: the request's number on this connection, from 1) says so."""

    def __init__(self, inner: httpcore.AsyncNetworkStream, hold: Callable[[int], Gate]) -> None:
        super().__init__(inner)
        self._hold, self._requests = hold, 0

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if buffer.startswith(b"POST "):
            self._requests += 1
            gate = self._hold(self._requests)
            if gate is not None:
                assert await asyncio.to_thread(gate.wait, 10), "the server never closed the connection"
        await self._inner.write(buffer, timeout)


def hold_writes(monkeypatch: pytest.MonkeyPatch, hold: Callable[[int, int], Gate]) -> None:
    """Wrap every connection httpcore's asyncio backend makes: ``hold(connection number, request
    number)`` (both from 1) returns the event the request's first write waits for, or None."""
    connect = httpcore.AnyIOBackend.connect_tcp
    made = 0

    async def connect_tcp(self: Any, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        nonlocal made
        made += 1
        n = made
        stream = await connect(self, host, port, *args, **kwargs)
        return _HeldStream(stream, lambda request: hold(n, request))

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", connect_tcp)


async def deliver_in_turn(
    server: WeakPlatformServer, tmp_path: Path, *jobs: DeliveryJob
) -> list[tuple[DeliveryResult, ledger.LedgerEntry | None]]:
    """Each job through one sender, one after another: its result and its ledger row."""
    sender = sender_for(server, tmp_path)
    try:
        return [(await sender.deliver(job), ledger.get_entry(sender.db, job.reply_id)) for job in jobs]
    finally:
        await sender.close()


def sender_for(server: WeakPlatformServer, tmp_path: Path, **bot: Any) -> DeliverySender:
    settings = DeliverySettings(
        database_url=f"sqlite:///{tmp_path / 'delivery.db'}",
        bots=[onebot_bot(server.base_url, **bot)],
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        timeout_s=10,
    )
    return DeliverySender(settings, 0, "0:test")


async def test_a_connection_the_server_closed_before_reading_a_byte_is_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27's lost reply: the HTTP/1.0 stand-in closes the first connection without reading
    it; the request, written after that, reaches no socket (reset, nothing acknowledged). It was
    ``uncertain`` and never arrived; now it is sent again on a new connection, once."""
    with WeakPlatformServer(backlog=1) as server:
        server.close_unread(1)
        hold_writes(monkeypatch, lambda conn, request: server.closed_unread if conn == 1 else None)
        [(result, entry)] = await deliver_in_turn(server, tmp_path, text_job("arrives once"))
    assert result.outcome == "sent", result
    assert result.attempts == 2 and result.message_ids == ["1"]
    assert server.bodies == [private_call("20002", "arrives once")]
    assert entry is not None and entry.status == "sent"


async def test_a_kept_alive_connection_the_server_closed_just_before_reuse_is_sent_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept-alive connection the server closes (its keep-alive timeout) after the pool took it
    and before the request was written: nothing reached the server, the reply goes again."""
    with WeakPlatformServer(keep_alive=True) as server:

        def hold(conn: int, request: int) -> Gate:
            if (conn, request) != (1, 2):
                return None
            server.close_idle()
            return server.idle_closed

        hold_writes(monkeypatch, hold)
        [(first, _), (second, _)] = await deliver_in_turn(
            server, tmp_path, text_job("first"), text_job("second")
        )
    assert (first.outcome, second.outcome) == ("sent", "sent"), (first, second)
    assert second.attempts == 2
    assert server.accepted == 2
    assert server.bodies == [private_call("20002", "first"), private_call("20002", "second")]


class _AckWatchStream(PassThroughStream):
    """httpcore's stream whose reads first wait until the peer's TCP acknowledged every byte
    written (Linux ``TCP_INFO`` ``tcpi_bytes_acked``, polled), then set ``acked``."""

    def __init__(self, inner: httpcore.AsyncNetworkStream, acked: threading.Event) -> None:
        super().__init__(inner)
        self._acked, self._written = acked, 0

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._inner.write(buffer, timeout)
        self._written += len(buffer)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        sock = self.get_extra_info("socket")
        for _ in range(10_000):
            if self._acked.is_set() or _bytes_acked(sock) >= self._written:
                break
            await asyncio.sleep(0.001)
        self._acked.set()
        return await self._inner.read(max_bytes, timeout)


def _bytes_acked(sock: Any) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("=Q", info, 120)[0])  # tcpi_bytes_acked (Linux >= 4.1)


async def test_a_request_the_server_read_and_reset_stays_uncertain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exactly once holds: the server read the whole request and its TCP acknowledged it (the
    reset waits until the client's TCP has that acknowledgement), then it reset the connection
    unanswered. It may have acted on it: ``uncertain``, never sent again."""
    acked = threading.Event()
    connect = httpcore.AnyIOBackend.connect_tcp

    async def connect_tcp(self: Any, host: str, port: int, *args: Any, **kwargs: Any) -> Any:
        return _AckWatchStream(await connect(self, host, port, *args, **kwargs), acked)

    monkeypatch.setattr(httpcore.AnyIOBackend, "connect_tcp", connect_tcp)
    with WeakPlatformServer() as server:
        server.abort_after_read(1, after=acked)
        [(result, entry)] = await deliver_in_turn(server, tmp_path, text_job("maybe delivered"))
    assert acked.is_set()
    assert result.outcome == "uncertain", result
    assert result.attempts == 1
    assert server.bodies == [private_call("20002", "maybe delivered")]
    assert entry is not None and entry.status == "uncertain"


def chats(n: int) -> Iterable[str]:
    return (str(30000 + i) for i in range(n))


async def test_a_bots_platform_api_gets_at_most_max_connections(tmp_path: Path) -> None:
    """Six chats answered at once open at most ``bots[].max_connections`` (2) connections: each
    answer waits until a third connection is open (or 1 s), so a sender without the bound shows
    3 open at once."""
    with WeakPlatformServer(threads=True, hold_until_open=3, backlog=16) as server:
        sender = sender_for(server, tmp_path, max_connections=2)
        try:
            jobs = [text_job(f"to {chat}", scene_id=chat) for chat in chats(6)]
            results = await asyncio.gather(*(sender.deliver(job) for job in jobs))
        finally:
            await sender.close()
    assert [r.outcome for r in results] == ["sent"] * 6
    assert len(server.bodies) == 6
    assert server.peak_open == 2


def test_max_connections_is_shared_by_the_delivery_actors() -> None:
    """``bots[].max_connections`` (default 4) bounds all delivery actors together: each opens its
    share, rounded up, at least one."""
    bot = BotConfig(platform="onebot11", self_id="1", api_base="http://127.0.0.1:1")
    assert bot.max_connections == 4
    assert [actor_connections(bot, n) for n in (1, 2, 3, 8)] == [4, 2, 2, 1]
    assert actor_connections(bot.model_copy(update={"max_connections": 9}), 2) == 5
    with pytest.raises(ValueError, match="max_connections"):
        BotConfig(platform="onebot11", self_id="1", max_connections=0)


async def test_a_bot_behind_a_proxy_of_the_environment_is_reached_through_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HTTP_PROXY`` is still honoured for a platform API (httpx's own client, same bound): the
    stand-in plays the proxy, the bot's ``api_base`` does not resolve."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with WeakPlatformServer() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.base_url)
        settings = DeliverySettings(
            database_url=f"sqlite:///{tmp_path / 'delivery.db'}",
            bots=[onebot_bot("http://onebot.invalid:5700")],
        )
        sender = DeliverySender(settings, 0, "0:test")
        try:
            result = await sender.deliver(text_job("via the proxy"))
        finally:
            await sender.close()
    assert result.outcome == "sent", result
    assert proxy.bodies == [private_call("20002", "via the proxy")]

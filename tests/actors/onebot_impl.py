"""A OneBot v11 implementation stand-in over WebSocket, as NapCat behaves, for the tests of a real
``sessionray serve`` process (tests/actors/serve/test_serve_onebot_ws.py).

One :class:`Impl` per bot, each in its own thread and event loop:

* **reverse** (:meth:`Impl.dial`): dials ``/onebot/v11/ws`` with ``X-Self-ID``, the access token
  and role ``Universal`` — from the moment it is started, whatever serve is doing (a refused or
  dropped connection is retried every 0.2 s, as NapCat's reconnect does);
* **forward** (:meth:`Impl.listen`): a WebSocket server on a loopback port sessionray dials; it
  refuses a handshake without the token (403).

On every connection it sends the events not sent yet (each message once, in order; more can be
added with :meth:`Impl.say`), then answers every API call with the recorded NapCat answer and
records the call. Nothing here decides what sessionray should do: the test reads :attr:`calls`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

import websockets
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request, Response

from tests.deploy.harness import free_port
from tests.platforms.ws_support import event, ok_answer, reply_text

__all__ = ["Impl"]

RETRY_S = 0.2
"""Pause between two dials of the reverse stand-in."""


class Impl:
    """One bot's implementation stand-in (module docstring).

    Args:
        fixtures_dir: ``tests/fixtures`` (the recorded events and answers).
        bot_id: The bot's ``self_id``.
        token: The access token it sends (reverse) or requires (forward).
        user: The QQ user whose private messages it reports.
    """

    def __init__(self, fixtures_dir: Path, bot_id: str, token: str, user: int) -> None:
        self.fixtures_dir, self.bot_id, self.token, self.user = fixtures_dir, bot_id, token, user
        self.port = free_port()
        self.calls: list[dict[str, Any]] = []
        """Every API call frame received, in arrival order."""
        self.connections: list[float] = []
        """``time.monotonic()`` of each handshake that succeeded."""
        self._texts: list[str] = []
        self._sent = 0
        self._more = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_id = 70_000 + int(bot_id) % 1000 * 100

    @property
    def url(self) -> str:
        """The forward stand-in's ``ws_url``."""
        return f"ws://127.0.0.1:{self.port}"

    def say(self, *texts: str) -> None:
        """Queue private messages with these texts (sent now if a socket is open, else on the next)."""
        self._texts.extend(texts)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._more.set)

    def replies(self) -> list[str]:
        """The texts of the ``send_private_msg`` calls received."""
        return [reply_text(c) for c in self.calls if c.get("action") == "send_private_msg"]

    def answered_all(self) -> bool:
        """Every queued message got a reply ``You said: <text>``."""
        got = self.replies()
        return all(f"You said: {t}" in got for t in self._texts)

    def dial(self, ws_url: str) -> Impl:
        """Start dialling ``ws_url`` (reverse WebSocket) in the background."""
        return self._start(lambda: self._dial_forever(ws_url))

    def listen(self) -> Impl:
        """Start the forward WebSocket server on :attr:`port`; returns once it listens."""
        self._start(self._serve_forever)
        assert self._started.wait(10), "the forward stand-in did not start"
        return self

    def stop(self) -> None:
        """Close the sockets and end the thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    # ------------------------------------------------------------------ inside the thread

    def _start(self, main: Callable[[], Any]) -> Impl:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            worker = asyncio.ensure_future(main())
            await self._stop.wait()
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)

        self._thread = threading.Thread(target=lambda: asyncio.run(run()), name=f"impl-{self.bot_id}")
        self._thread.start()
        return self

    async def _dial_forever(self, ws_url: str) -> None:
        headers = {
            "X-Self-ID": self.bot_id,
            "Authorization": f"Bearer {self.token}",
            "X-Client-Role": "Universal",
        }
        while True:
            try:
                async with websockets.connect(ws_url, additional_headers=headers, open_timeout=None) as conn:
                    await self._session(conn)
            except (OSError, websockets.WebSocketException):
                pass  # not listening yet, or dropped: NapCat dials again
            await asyncio.sleep(RETRY_S)

    async def _serve_forever(self) -> None:
        def check(conn: ServerConnection, request: Request) -> Response | None:
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return conn.respond(HTTPStatus.FORBIDDEN, "bad token\n")
            return None

        async with websockets.serve(self._session, "127.0.0.1", self.port, process_request=check):
            self._started.set()
            await asyncio.Future()

    async def _session(self, conn: Any) -> None:
        """One open socket: push the unsent events, answer every call, until it closes."""
        self.connections.append(time.monotonic())
        calls = asyncio.ensure_future(self._answer(conn))
        try:
            while not calls.done():
                while self._sent < len(self._texts):
                    text = self._texts[self._sent]
                    self._next_id += 1
                    await conn.send(
                        event(self.fixtures_dir, self.bot_id, self._next_id, text, user=self.user)
                    )
                    self._sent += 1
                self._more.clear()
                more = asyncio.ensure_future(self._more.wait())
                await asyncio.wait((calls, more), timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                more.cancel()
        finally:
            calls.cancel()
            await asyncio.gather(calls, return_exceptions=True)

    async def _answer(self, conn: Any) -> None:
        async for raw in conn:
            call = json.loads(raw)
            if "echo" not in call:
                continue
            self.calls.append(call)
            await conn.send(ok_answer(self.fixtures_dir, call["echo"], 5000 + len(self.calls)))

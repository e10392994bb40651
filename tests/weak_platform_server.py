"""A weak OneBot v11 HTTP API stand-in on 127.0.0.1: a plain socket server with a small listen
backlog and a single accepting thread, as a small platform server on a small VPS
(docs/decisions.md#delivery-not-received, issue 27).

* ``threads=False`` (default): the accepting thread also serves each connection, one at a time;
  ``threads=True``: one thread per accepted connection (:attr:`peak_open` counts how many were
  open at once).
* ``keep_alive=False`` (default): HTTP/1.0, the connection closed after each answer (as the
  issue's stand-in); ``True``: HTTP/1.1 kept alive until :meth:`close_idle` asks to close it.
* Scripted faults: :meth:`close_unread` (the n-th accepted connection closed before any byte of
  it was read: nothing of the request reaches the server's socket), :meth:`abort_after_read`
  (the n-th request read in full, then — once the client's TCP has the server's acknowledgement,
  when the test says so — the connection reset without an answer),
  ``hold_until_open`` (with threads: each answer waits until that many connections are open, or
  ``hold_s`` seconds).

Every complete request's JSON body is kept in :attr:`bodies` (answered or not). OneBot answer:
``{"status": "ok", "retcode": 0, "data": {"message_id": n}}``.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from typing import Any

__all__ = ["WeakPlatformServer"]


def _read_request(conn: socket.socket, buffered: bytes) -> tuple[bytes, bytes] | None:
    """``(complete request, bytes after it)`` from ``conn`` (None: closed first)."""
    data = buffered
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return head + b"\r\n\r\n" + rest[:length], rest[length:]


class WeakPlatformServer:
    """See module docstring. Use as a context manager; :attr:`base_url` is its ``api_base``."""

    def __init__(
        self,
        *,
        backlog: int = 5,
        threads: bool = False,
        keep_alive: bool = False,
        hold_until_open: int = 0,
        hold_s: float = 1.0,
    ) -> None:
        self.backlog, self.threads, self.keep_alive = backlog, threads, keep_alive
        self.hold_until_open, self.hold_s = hold_until_open, hold_s
        self.bodies: list[Any] = []
        self.accepted = 0
        self.open = 0
        self.peak_open = 0
        self.closed_unread = threading.Event()
        """Set when the connection of :meth:`close_unread` was closed."""
        self.idle_closed = threading.Event()
        """Set when a kept-alive connection was closed at :meth:`close_idle`'s request."""
        self._close_idle = threading.Event()
        self._unread: set[int] = set()
        self._abort: dict[int, threading.Event | None] = {}
        self._requests = 0
        self._lock = threading.Condition()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def close_unread(self, nth: int) -> None:
        """Close the ``nth`` accepted connection (1-based) before reading any byte of it."""
        self._unread.add(nth)

    def abort_after_read(self, nth: int, after: threading.Event | None = None) -> None:
        """Read the ``nth`` request (1-based) in full, then reset its connection, unanswered.

        ``after``: the reset waits until it is set (at most 10 s). A reset sent right after the
        read may reach the client before the server's TCP acknowledged the request: its ACK can
        be delayed, or queued on another CPU of the loopback device while the reset overtakes it
        (docs/decisions.md#delivery-not-received); a test that needs the acknowledgement to have
        arrived sets ``after`` when the client's TCP reports it."""
        self._abort[nth] = after

    def close_idle(self) -> None:
        """Close the kept-alive connection, idle after its answer, as a server's keep-alive timeout."""
        self._close_idle.set()

    def __enter__(self) -> WeakPlatformServer:
        self._sock.listen(self.backlog)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
        self._close_idle.set()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                nth = self.accepted
                self.open += 1
                self.peak_open = max(self.peak_open, self.open)
                self._lock.notify_all()
            if nth in self._unread:
                conn.close()
                self._gone()
                self.closed_unread.set()
            elif self.threads:
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()
            else:
                self._serve(conn)

    def _gone(self) -> None:
        with self._lock:
            self.open -= 1
            self._lock.notify_all()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._answer_all(conn)
        except OSError:
            pass
        finally:
            self._gone()

    def _answer_all(self, conn: socket.socket) -> None:
        buffered = b""
        while True:
            got = _read_request(conn, buffered)
            if got is None:
                return
            request, buffered = got
            with self._lock:
                self._requests += 1
                nth = self._requests
                self.bodies.append(json.loads(request.partition(b"\r\n\r\n")[2] or b"null"))
            if nth in self._abort:
                after = self._abort[nth]
                if after is not None:
                    after.wait(10)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            self._hold()
            body = json.dumps({"status": "ok", "retcode": 0, "data": {"message_id": nth}}).encode()
            version, close = (
                (b"HTTP/1.1", b"") if self.keep_alive else (b"HTTP/1.0", b"Connection: close\r\n")
            )
            conn.sendall(
                version + b" 200 OK\r\nContent-Type: application/json\r\n" + close
                + b"Content-Length: %d\r\n\r\n" % len(body) + body
            )  # fmt: skip
            if not self.keep_alive:
                return
            if self._close_idle.is_set() or self._idle_close_requested(conn):
                self.idle_closed.set()
                return

    def _idle_close_requested(self, conn: socket.socket) -> bool:
        """Wait, idle, for the next request or :meth:`close_idle` (True: close now)."""
        conn.setblocking(False)
        try:
            while not self._close_idle.wait(0.01):
                try:
                    return not conn.recv(1, socket.MSG_PEEK)  # b"": the client closed it
                except BlockingIOError:
                    continue
            return True
        finally:
            conn.setblocking(True)

    def _hold(self) -> None:
        if not self.hold_until_open:
            return
        deadline = time.monotonic() + self.hold_s
        with self._lock:
            while self.open < self.hold_until_open and time.monotonic() < deadline:
                self._lock.wait(max(0.0, deadline - time.monotonic()))

"""The chaos suite's platform API: :class:`tests.platform_api_server.PlatformApiServer` with an
outage window and a ledger of the replies it delivered.

* :meth:`FaultyPlatform.outage` — for ``seconds`` every request answers HTTP 500, or 429 with
  ``Retry-After: 1``, or the server stops listening (``refused``: the listening socket is closed
  and every open keep-alive connection is shut, so a connect is refused; a request that still
  arrives on a connection is cut without an answer and is not delivered). After the window the
  server answers normally again on the same port.
* Every send answered with success is a *delivered reply*, matched to the inbound message it
  answers by its ``reply`` segment (the OneBot codec quotes the message it answers in a group
  scene: ``{"type": "reply", "data": {"id": "<message_id>"}}``), else by the message id in the
  text (``You said: chaos <id>`` from the built-in model). :meth:`FaultyPlatform.replies` gives
  ``message id → [arrival times]`` (``time.monotonic()`` of this process); a send matching no
  message is counted in :attr:`FaultyPlatform.stray`.

Thread-safe (the server answers on its own threads; the load reads the ledger from another).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.platform_api_server import ONEBOT_SEND_PATHS, PlatformApiServer

__all__ = ["OUTAGE_KINDS", "FaultyPlatform"]

OUTAGE_KINDS = ("500", "429", "refused")
"""``500``: HTTP 500; ``429``: HTTP 429 with ``Retry-After: 1``; ``refused``: not listening."""
_TEXT_ID = re.compile(r"chaos (\d+)")


class FaultyPlatform(PlatformApiServer):
    """The platform API of a chaos scenario (module docstring). Start with ``with`` or :meth:`start`."""

    def __init__(self, fixtures_dir: Path) -> None:
        super().__init__(fixtures_dir, vary_message_ids=True)
        self._ledger: dict[int, list[float]] = {}
        self.stray = 0
        """Successful sends that answer no known message (should stay 0)."""
        self.failed_answers = 0
        """Requests answered 500/429 by an outage."""
        self._mode: str | None = None
        self._until = 0.0
        self._port = 0
        self._conns: set[socket.socket] = set()
        self._conn_lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FaultyPlatform:
        """Bind a free port and serve (the port is kept across a ``refused`` outage)."""
        super().start()
        assert self._server is not None
        self._port = int(self._server.server_address[1])
        self._track(self._server)
        return self

    def __enter__(self) -> FaultyPlatform:
        return self.start()

    def _track(self, server: ThreadingHTTPServer) -> None:
        """Remember each connection ``server`` is serving, so a ``refused`` outage can cut it."""
        serve_one = server.finish_request

        def finish_request(request: Any, client_address: Any) -> None:
            with self._conn_lock:
                self._conns.add(request)
            try:
                serve_one(request, client_address)
            finally:
                with self._conn_lock:
                    self._conns.discard(request)

        server.finish_request = finish_request  # type: ignore[method-assign]
        server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]

    # ------------------------------------------------------------------ outages

    def outage(self, kind: str, seconds: float) -> None:
        """Fail every request for ``seconds`` as ``kind`` (:data:`OUTAGE_KINDS`); returns at once
        (a ``refused`` window ends on a timer thread that listens again on the same port).

        Raises:
            ValueError: an unknown ``kind``.
        """
        if kind not in OUTAGE_KINDS:
            raise ValueError(f"outage kind {kind!r} is not one of {OUTAGE_KINDS}")
        with self._lock:
            self._mode, self._until = kind, time.monotonic() + seconds
        if kind == "refused":
            self._stop_listening()
            threading.Timer(seconds, self._listen_again).start()

    def in_outage(self) -> bool:
        with self._lock:
            return self._mode is not None and time.monotonic() < self._until

    def _stop_listening(self) -> None:
        server = self._server
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._conn_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _listen_again(self) -> None:
        old = self._server
        if old is None:
            return
        new = ThreadingHTTPServer(("127.0.0.1", self._port), old.RequestHandlerClass)
        new.daemon_threads = True
        self._track(new)
        self._server = new
        self._thread = threading.Thread(target=new.serve_forever, name="platform-api", daemon=True)
        self._thread.start()
        with self._lock:
            self._mode = None

    # ------------------------------------------------------------------ answering

    def _answer(
        self, method: str, path: str, raw_headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        with self._lock:
            mode = self._mode if time.monotonic() < self._until else None
        if mode == "refused":
            raise ConnectionAbortedError("the platform is not listening")  # the handler cuts the connection
        if mode in ("500", "429"):
            with self._lock:
                self.failed_answers += 1
            retry = {"Retry-After": "1"} if mode == "429" else {}
            return int(mode), b'{"status":"failed","retcode":%s,"data":null}' % mode.encode(), retry
        status, out, headers = super()._answer(method, path, raw_headers, body)
        if status == 200 and path.split("?", 1)[0] in ONEBOT_SEND_PATHS:
            self._record(body)
        return status, out, headers

    def _record(self, body: bytes) -> None:
        now = time.monotonic()
        try:
            call = json.loads(body)
        except ValueError:
            call = None
        message = call.get("message") if isinstance(call, dict) else None
        segments = message if isinstance(message, list) else []
        quoted = next((s["data"].get("id") for s in segments if s.get("type") == "reply"), None)
        text = "".join(str(s["data"].get("text", "")) for s in segments if s.get("type") == "text")
        found = _TEXT_ID.search(text)
        mid = str(quoted) if quoted is not None else (found.group(1) if found else None)
        with self._lock:
            if mid is None or not mid.isdigit():
                self.stray += 1
            else:
                self._ledger.setdefault(int(mid), []).append(now)

    # ------------------------------------------------------------------ reading

    def replies(self) -> dict[int, list[float]]:
        """Message id → monotonic arrival times of its delivered replies (a copy)."""
        with self._lock:
            return {k: list(v) for k, v in self._ledger.items()}

    def reply_count(self) -> int:
        """Delivered replies so far (every message, duplicates included)."""
        with self._lock:
            return sum(len(v) for v in self._ledger.values())

    def last_reply_at(self) -> float | None:
        with self._lock:
            return max((t for v in self._ledger.values() for t in v), default=None)

    def clear_ledger(self) -> None:
        """Forget the delivered replies and the recorded requests (between scenarios on one serve)."""
        with self._lock:
            self._ledger.clear()
            self.requests.clear()
            self.stray = self.failed_answers = 0

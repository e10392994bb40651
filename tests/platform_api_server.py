"""A small real HTTP server on 127.0.0.1 that plays the OneBot v11 HTTP API and the Telegram Bot API.

It answers with the recorded fixture responses (``tests/fixtures``, never edited):

* ``POST /send_private_msg``, ``/send_group_msg``, ``/send_msg``, ``/send_private_forward_msg``,
  ``/send_group_forward_msg`` (OneBot v11) → HTTP 200 ``onebot11/api_response_ok_napcat.json``;
* ``POST /bot<token>/<method>`` (Telegram, any ``send*`` method) →
  HTTP 200 ``telegram/api_sendMessage_response.json``; ``sendMediaGroup`` answers, as the Bot API
  does, a list of such messages, one per item of its ``media`` (ids counting up from the recorded one);
* any other path → HTTP 404 with ``onebot11/api_response_failed_1404.json``.

With ``vary_message_ids=True`` the n-th successful send answers the recorded body with
``message_id + n`` (n from 0), so several sends of one bot get distinct ids as on a real platform.

Scripted behaviour for tests:

* :meth:`PlatformApiServer.fail_next` — the next ``n`` requests answer ``status`` (e.g. 429/503)
  with an optional ``Retry-After`` header and body (Telegram-style 429 body by default for
  Telegram paths);
* :meth:`PlatformApiServer.respond_with` — a path always answers the given status and body,
  e.g. ``server.respond_with("/send_group_msg", 200, server.onebot_failed)``
  for the failed-retcode case (:meth:`fail_retcode` is that shortcut);
* :meth:`PlatformApiServer.outage` — a fault window of N seconds from now: every request (or those
  of some paths) answers 500, or 429 with a ``Retry-After`` (seconds or an HTTP-date), or the port
  is closed (connection refused; open connections are cut) and opened again on the same port when
  the window ends. :attr:`PlatformApiServer.outage_over` is set when it ended.

Every request is recorded (:attr:`PlatformApiServer.requests`): method, path, headers (lower-case
keys), parsed JSON body, multipart text fields and files, and the HTTP status it was answered
with — so tests assert exact API calls (:meth:`PlatformApiServer.answered_ok`: those answered 200).

Usage::

    with PlatformApiServer(fixtures_dir) as api:
        httpx.post(api.base_url + "/send_private_msg", json={...})
        assert api.requests[0].json == {...}

Thread-safe: the server runs in a daemon thread (``ThreadingHTTPServer``); the recorded list and
the scripts are guarded by a lock.
"""

from __future__ import annotations

import contextlib
import email.parser
import email.policy
import email.utils
import json
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

__all__ = ["PlatformApiServer", "RecordedFile", "RecordedRequest"]

ONEBOT_SEND_PATHS = frozenset(
    {"/send_private_msg", "/send_group_msg", "/send_msg"}
    | {"/send_private_forward_msg", "/send_group_forward_msg"}
)
TELEGRAM_PATH = re.compile(r"^/bot(?P<token>[^/]+)/(?P<method>[A-Za-z]+)$")


@dataclass(frozen=True)
class RecordedFile:
    """One uploaded file of a multipart request."""

    filename: str
    content_type: str
    data: bytes


@dataclass
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    """Header names in lower case."""
    body: bytes
    json: Any = None
    """Parsed JSON body (``application/json``), else None."""
    form: dict[str, str] = field(default_factory=dict)
    """Multipart text fields."""
    files: dict[str, RecordedFile] = field(default_factory=dict)
    """Multipart files by field name."""
    status: int = 0
    """The HTTP status it was answered with (0 until answered)."""


@dataclass
class _Scripted:
    status: int
    body: bytes
    headers: dict[str, str]


def _parse_multipart(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, RecordedFile]]:
    """Parse a multipart/form-data body with the stdlib email parser."""
    raw = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode() + body
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(raw)
    form: dict[str, str] = {}
    files: dict[str, RecordedFile] = {}
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        filename = part.get_filename()
        raw_payload = part.get_payload(decode=True)
        payload = raw_payload if isinstance(raw_payload, bytes) else b""
        if not isinstance(name, str):
            continue
        if filename is not None:
            files[name] = RecordedFile(filename, part.get_content_type(), payload)
        else:
            form[name] = payload.decode("utf-8")
    return form, files


class PlatformApiServer:
    """The platform API stand-in (see module docstring). Start with ``with`` or :meth:`start`."""

    def __init__(self, fixtures_dir: Path, *, vary_message_ids: bool = False) -> None:
        self.fixtures_dir = Path(fixtures_dir)
        self.vary_message_ids = vary_message_ids
        self._sends = 0
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._failures: list[_Scripted] = []
        self._fixed: dict[str, _Scripted] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = 0
        self._conns: set[socket.socket] = set()
        self._fault: tuple[str, float, dict[str, str], frozenset[str] | None] | None = None
        self.outage_over = threading.Event()
        """Set when the last :meth:`outage` window ended (set while there was none)."""
        self.outage_over.set()
        self.onebot_ok = self.fixture("onebot11/api_response_ok_napcat.json")
        self.onebot_failed = self.fixture("onebot11/api_response_failed_1404.json")
        self.telegram_ok = self.fixture("telegram/api_sendMessage_response.json")

    # ------------------------------------------------------------------ lifecycle

    def fixture(self, relpath: str) -> bytes:
        """The bytes of a recorded fixture file, e.g. ``"onebot11/api_response_ok_napcat.json"``."""
        return (self.fixtures_dir / relpath).read_bytes()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` (the port is picked by the OS; the same after an outage)."""
        assert self._port, "server not started"
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> PlatformApiServer:
        """Bind 127.0.0.1 on a free port (or the port it had) and serve in a daemon thread."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body are two writes: with Nagle on, the body waits for the client's
            # delayed ACK (≈ 40 ms per call on Linux) — a cost no real platform API adds.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                return

            def setup(self) -> None:
                super().setup()
                with outer._lock:
                    outer._conns.add(self.connection)

            def finish(self) -> None:
                with outer._lock:
                    outer._conns.discard(self.connection)
                super().finish()

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if len(body) < length:  # the client went away mid-request (a killed sender):
                    self.close_connection = True  # a real server never processes half a body
                    return
                status, out, headers = outer._answer(self.command, self.path, dict(self.headers), body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(out)

            do_POST = _handle
            do_GET = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._server.daemon_threads = True
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="platform-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Shut the server down and join its thread."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _cut_connections(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> PlatformApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ scripting

    def fail_next(
        self, n: int, status: int = 503, *, retry_after: float | None = None, body: bytes | None = None
    ) -> None:
        """Answer the next ``n`` requests (any path) with ``status``; ``Retry-After`` header when
        ``retry_after`` is given. Default body: Telegram-style ``{"ok":false,"error_code":...}``
        with ``parameters.retry_after`` for 429, else OneBot-style ``{"status":"failed",...}``."""
        headers = {} if retry_after is None else {"Retry-After": _fmt_seconds(retry_after)}
        with self._lock:
            for _ in range(n):
                self._failures.append(_Scripted(status, body if body is not None else b"", headers))

    def respond_with(
        self, path: str, status: int, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        """Make ``path`` always answer ``status`` with ``body`` (until :meth:`reset`)."""
        with self._lock:
            self._fixed[path] = _Scripted(status, body, dict(headers or {}))

    def outage(
        self,
        kind: Literal["500", "429", "refused"],
        seconds: float,
        *,
        retry_after: float | str | None = None,
        paths: set[str] | None = None,
    ) -> None:
        """A fault window of ``seconds`` from now (see module docstring).

        Args:
            kind: ``500``, ``429`` (with ``Retry-After: retry_after``: seconds, or the string
                ``"date"`` for an HTTP-date ``retry_after_s`` ahead, default 1 s) or ``refused``
                (the port is closed, open connections cut; reopened on the same port at the end).
            seconds: Length of the window.
            retry_after: See ``kind``; ``"date"`` sends the end of the window as an HTTP-date.
            paths: Only requests of these paths fail (``500``/``429`` only); None: all.
        """
        until = time.monotonic() + seconds
        self.outage_over.clear()
        if kind == "refused":
            assert paths is None, "a closed port refuses every path"
            self.stop()
            self._cut_connections()
            timer = threading.Timer(seconds, self._end_refusal)
            timer.daemon = True
            timer.start()
            return
        headers: dict[str, str] = {}
        if kind == "429":
            if retry_after == "date":
                headers["Retry-After"] = email.utils.formatdate(time.time() + seconds, usegmt=True)
            else:
                headers["Retry-After"] = _fmt_seconds(float(retry_after if retry_after is not None else 1))
        with self._lock:
            self._fault = (kind, until, headers, frozenset(paths) if paths else None)
        timer = threading.Timer(seconds, self.outage_over.set)
        timer.daemon = True
        timer.start()

    def _end_refusal(self) -> None:
        self.start()
        self.outage_over.set()

    def answered_ok(self, path: str | None = None) -> list[RecordedRequest]:
        """The recorded requests answered HTTP 200 (of ``path``, if given), in arrival order."""
        with self._lock:
            return [r for r in self.requests if r.status == 200 and (path is None or r.path == path)]

    def fail_retcode(self, path: str) -> None:
        """Make a OneBot send path answer HTTP 200 with the recorded ``retcode: 1404`` failure."""
        self.respond_with(path, 200, self.onebot_failed)

    def reset_scripts(self) -> None:
        """Forget every script (:meth:`fail_next`, :meth:`respond_with`); keep the recorded requests."""
        with self._lock:
            self._failures.clear()
            self._fixed.clear()
            self._fault = None

    def reset(self) -> None:
        """Forget recorded requests and every script."""
        with self._lock:
            self.requests.clear()
            self._failures.clear()
            self._fixed.clear()
            self._fault = None

    def wait_for_requests(self, n: int, timeout_s: float = 30.0) -> list[RecordedRequest]:
        """Block until at least ``n`` requests were recorded (event-driven, no sleep polling).

        Raises:
            TimeoutError: fewer than ``n`` requests after ``timeout_s`` seconds.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.requests) >= n, timeout=timeout_s):
                raise TimeoutError(f"expected {n} platform API requests, got {len(self.requests)}")
            return list(self.requests)

    # ------------------------------------------------------------------ answering

    def _answer(
        self, method: str, path: str, raw_headers: dict[str, str], body: bytes
    ) -> tuple[int, bytes, dict[str, str]]:
        rec, out = self._decide(method, path, raw_headers, body)
        rec.status = out[0]
        return out

    def _decide(
        self, method: str, path: str, raw_headers: dict[str, str], body: bytes
    ) -> tuple[RecordedRequest, tuple[int, bytes, dict[str, str]]]:
        headers = {k.lower(): v for k, v in raw_headers.items()}
        ctype = headers.get("content-type", "")
        parsed: Any = None
        form: dict[str, str] = {}
        files: dict[str, RecordedFile] = {}
        if ctype.startswith("application/json") and body:
            parsed = json.loads(body)
        elif ctype.startswith("multipart/form-data"):
            form, files = _parse_multipart(ctype, body)
        rec = RecordedRequest(method, path.split("?", 1)[0], headers, body, parsed, form, files)
        tg = TELEGRAM_PATH.match(rec.path)
        with self._cond:
            self.requests.append(rec)
            self._cond.notify_all()
            fault = self._fault
            if (
                fault is not None
                and time.monotonic() < fault[1]
                and (fault[3] is None or rec.path in fault[3])
            ):
                f = _Scripted(int(fault[0]), b"", fault[2])
                return rec, (f.status, self._default_failure(f, tg is not None), f.headers)
            if self._failures:
                f = self._failures.pop(0)
                return rec, (f.status, f.body or self._default_failure(f, tg is not None), f.headers)
            fixed = self._fixed.get(rec.path)
        if fixed is not None:
            return rec, (fixed.status, fixed.body, fixed.headers)
        if rec.path in ONEBOT_SEND_PATHS:
            return rec, (200, self._numbered(self.onebot_ok, "data"), {})
        if tg is not None and tg.group("method") == "sendMediaGroup":
            return rec, (200, self._album(rec), {})
        if tg is not None and tg.group("method").startswith("send"):
            return rec, (200, self._numbered(self.telegram_ok, "result"), {})
        return rec, (404, self.onebot_failed, {})

    def _numbered(self, recorded: bytes, holder: str) -> bytes:
        """The recorded success answer; with ``vary_message_ids`` the n-th one (0-based) carries
        ``message_id + n`` (a real platform never returns one id twice; the fixture has one)."""
        if not self.vary_message_ids:
            return recorded
        with self._lock:
            n = self._sends
            self._sends += 1
        answer = json.loads(recorded)
        answer[holder]["message_id"] += n
        return json.dumps(answer, ensure_ascii=False).encode()

    def _album(self, rec: RecordedRequest) -> bytes:
        """The ``sendMediaGroup`` answer: the recorded message once per item of ``media`` (JSON body
        or multipart field), ``message_id`` counting up (after :meth:`_numbered`'s offset)."""
        body = rec.json if isinstance(rec.json, dict) else {"media": json.loads(rec.form.get("media", "[]"))}
        media = body.get("media")
        answer = json.loads(self._numbered(self.telegram_ok, "result"))
        first = answer["result"]
        answer["result"] = [{**first, "message_id": first["message_id"] + n} for n in range(len(media or []))]
        return json.dumps(answer, ensure_ascii=False).encode()

    @staticmethod
    def _default_failure(f: _Scripted, telegram: bool) -> bytes:
        if telegram:
            out: dict[str, Any] = {"ok": False, "error_code": f.status, "description": _tg_wording(f.status)}
            if f.status == 429:
                ra = f.headers.get("Retry-After", "1")
                seconds = float(ra) if ra.replace(".", "", 1).isdigit() else 1.0
                out["parameters"] = {"retry_after": int(seconds)}
            return json.dumps(out).encode()
        return json.dumps({"status": "failed", "retcode": f.status, "data": None}).encode()


def _fmt_seconds(s: float) -> str:
    return str(int(s)) if float(s).is_integer() else str(s)


def _tg_wording(status: int) -> str:
    if status == 429:
        return "Too Many Requests: retry later"
    if status >= 500:
        return "Internal Server Error"
    return "Bad Request"

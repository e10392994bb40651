"""A small real HTTP/1.1 server on 127.0.0.1 that replays recorded provider responses.

It runs its own asyncio loop in a background thread, so any test (sync or async, any event loop)
can use it over real loopback sockets. Each request takes the first queued :class:`Reply` whose
``path`` filter matches (FIFO); the body is sent with ``Transfer-Encoding: chunked`` in pieces
cut at arbitrary byte boundaries (seeded random sizes, or explicit ``splits`` offsets, so cuts can
fall inside multi-byte UTF-8 characters), optionally with a delay between pieces. Every request is
recorded (method, path, query, headers, body) so tests can assert what was sent, and whether the
client read the response to the end or hung up early (``outcome``).

Usage::

    with ReplayServer() as server:
        server.enqueue(Reply.fixture(fixtures_dir / "openai/chat_stream_text_with_usage.sse"))
        ... call f"{server.base_url}/v1" ...
        body = server.requests[0].json()

Other test folders may import it: ``from tests.providers.replay_server import ReplayServer, Reply``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["RecordedRequest", "ReplayServer", "Reply"]

_CONTENT_TYPES = {".sse": "text/event-stream", ".json": "application/json", ".txt": "text/plain"}


@dataclass
class Reply:
    """One scripted response.

    Attributes:
        status: HTTP status code.
        body: Response bytes.
        content_type: ``Content-Type`` header.
        headers: Extra headers (e.g. ``{"retry-after": "1"}``).
        path: Only requests whose path contains this string take this reply (``None``: any).
        splits: Explicit cut offsets into ``body`` (overrides random chunking).
        min_chunk, max_chunk: Range of random piece sizes in bytes.
        seed: Seed of the random piece sizes (reproducible cuts).
        delay_s: Pause between pieces in seconds (0: just yield to the loop and drain).
        cut_after: Close the connection abruptly after this many body bytes (simulates a drop).
        head_delay_s: Pause before the status line (a server that stalls before the first byte).
    """

    status: int = 200
    body: bytes = b""
    content_type: str = "text/event-stream"
    headers: dict[str, str] = field(default_factory=dict)
    path: str | None = None
    splits: list[int] | None = None
    min_chunk: int = 1
    max_chunk: int = 64
    seed: int = 0
    delay_s: float = 0.0
    cut_after: int | None = None
    head_delay_s: float = 0.0

    @classmethod
    def fixture(cls, file: Path, **kw: Any) -> Reply:
        """A 200 reply whose body is ``file``'s bytes; the content type follows its extension."""
        kw.setdefault("content_type", _CONTENT_TYPES.get(file.suffix, "application/octet-stream"))
        return cls(body=file.read_bytes(), **kw)

    @classmethod
    def error(cls, status: int, payload: Any, **kw: Any) -> Reply:
        """An error reply with a JSON body."""
        return cls(status=status, body=json.dumps(payload).encode(), content_type="application/json", **kw)

    def pieces(self) -> list[bytes]:
        """The body cut into the pieces that will be written, in order."""
        body = self.body if self.cut_after is None else self.body[: self.cut_after]
        if self.splits is not None:
            cuts = [0, *sorted(s for s in self.splits if 0 < s < len(body)), len(body)]
            return [body[a:b] for a, b in itertools.pairwise(cuts) if b > a]
        rng = random.Random(self.seed)
        out, i = [], 0
        while i < len(body):
            n = rng.randint(self.min_chunk, self.max_chunk)
            out.append(body[i : i + n])
            i += n
        return out


@dataclass
class RecordedRequest:
    """One request as the server saw it, plus how the response went."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    """Lower-cased header names."""
    body: bytes
    outcome: str = "pending"
    """``complete`` (whole response written), ``disconnected`` (client hung up), ``cut``, ``no_reply``."""
    finished: threading.Event = field(default_factory=threading.Event)

    def json(self) -> Any:
        """The request body parsed as JSON."""
        return json.loads(self.body)


async def _hung_up_during(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Pause ``seconds``, returning early with ``True`` if the client closes the connection."""
    try:
        return await asyncio.wait_for(reader.read(1), seconds) == b""
    except TimeoutError:
        return False


class ReplayServer:
    """The replay server; a context manager that starts and stops its thread."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._queue: list[Reply] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="replay-server", daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ReplayServer:
        """Bind 127.0.0.1 on a free port and serve in the background thread."""
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        fut.result(timeout=10)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Stop serving and join the thread."""

        async def _stop() -> None:
            if self._server is not None:
                self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> ReplayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ scripting
    def enqueue(self, *replies: Reply) -> None:
        """Append replies to the FIFO queue."""
        with self._lock:
            self._queue.extend(replies)

    def _take(self, path: str) -> Reply | None:
        with self._lock:
            for i, r in enumerate(self._queue):
                if r.path is None or r.path in path:
                    return self._queue.pop(i)
        return None

    # ------------------------------------------------------------------ HTTP
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        rec: RecordedRequest | None = None
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            n = int(headers.get("content-length", "0"))
            body = await reader.readexactly(n) if n else b""
            url = urlsplit(target)
            rec = RecordedRequest(method, url.path, parse_qs(url.query), headers, body)
            self.requests.append(rec)
            reply = self._take(url.path)
            if reply is None:
                reply = Reply.error(404, {"error": {"message": f"no reply queued for {url.path}"}})
                rec.outcome = "no_reply"
            hdrs = {
                "content-type": reply.content_type,
                "transfer-encoding": "chunked",
                "connection": "close",
                **reply.headers,
            }
            if reply.head_delay_s and await _hung_up_during(reader, reply.head_delay_s):
                rec.outcome = "disconnected"
                return
            status_line = f"HTTP/1.1 {reply.status} X\r\n"
            writer.write((status_line + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode())
            await writer.drain()
            for piece in reply.pieces():
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                if not reply.delay_s:
                    await asyncio.sleep(0)
                elif await _hung_up_during(reader, reply.delay_s):
                    rec.outcome = "disconnected"
                    return
            if reply.cut_after is not None:
                rec.outcome = "cut"
                writer.transport.abort()
                return
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            if rec.outcome == "pending":
                rec.outcome = "complete"
        except (ConnectionError, asyncio.IncompleteReadError):
            if rec is not None:
                rec.outcome = "disconnected"
        except asyncio.CancelledError:
            if rec is not None and rec.outcome == "pending":
                rec.outcome = "cancelled"
        finally:
            self._tasks.discard(task)
            if rec is not None:
                rec.finished.set()
            try:
                writer.close()
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass

"""A loopback OpenAI-compatible Chat Completions server with its own rate limits, for the provider
limits tests and the spend bench (docs/decisions.md#spend-provider-limits).

``POST /v1/chat/completions`` (``stream: true``) answers Server-Sent Events: a role chunk, the
reply text in ``chunks`` pieces spread over ``stream_s`` seconds, a ``finish_reason: stop`` chunk,
then — only when the request asked ``stream_options.include_usage`` — a ``choices: []`` chunk with
``usage``, then ``data: [DONE]``. The reply is ``reply`` (default ``"ok"``), or what ``answer(request body,
body bytes)`` returns for that request when given (the spend bench echoes which questions a call
answered).

Its token count is deterministic: a request's prompt costs ⌈body bytes / 4⌉ tokens, the reply
⌈reply bytes / 4⌉; that is the usage it reports.

Above its own limits it answers HTTP 429 with an OpenAI-style error body and a ``Retry-After``
(whole seconds, ≥ 1) and serves nothing:

* ``concurrency``: requests being answered at once (a request counts until its last content chunk
  was written);
* ``rpm`` / ``tpm``: token buckets of ``limit`` refilled at ``limit / 60`` per second; a request
  needs one request and its prompt tokens at arrival (a prompt larger than the whole bucket needs a
  full bucket); the reply's tokens are taken when it was written.

It counts what tests assert (:class:`Stats`): requests, refused (429) ones, served ones, the usage
it reported, request body sizes, the most requests it answered at once.

Runs in a daemon thread (``ThreadingHTTPServer``), like :mod:`tests.platform_api_server`, so
processes of a local Ray cluster reach it over 127.0.0.1.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["OpenAIStandin", "Stats"]


@dataclass
class Stats:
    """What the stand-in saw (guarded by its lock; read :meth:`OpenAIStandin.stats` for a copy)."""

    requests: int = 0
    refused: int = 0
    served: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    request_bytes: list[int] = field(default_factory=list)
    most_at_once: int = 0
    refused_by: dict[str, int] = field(default_factory=dict)


class _Bucket:
    def __init__(self, limit: int) -> None:
        self.capacity = float(limit)
        self.rate = limit / 60.0
        self.level = float(limit)
        self.at = time.monotonic()

    def refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + self.rate * (now - self.at))
        self.at = now

    def wait_s(self, need: float) -> float:
        missing = min(need, self.capacity) - self.level
        return 0.0 if missing <= 0 else missing / self.rate


class OpenAIStandin:
    """The server (a context manager); :attr:`base_url` ends in ``/v1``.

    Args:
        concurrency: Requests answered at once (``None``: unlimited).
        rpm: Requests per minute (``None``: unlimited).
        tpm: Tokens per minute, prompt + completion (``None``: unlimited).
        stream_s: Seconds the content chunks of one answer are spread over.
        chunks: Content chunks per answer (≥ 1).
        reply: The answer text.
        answer: ``(request body JSON, body bytes) -> answer text`` of each served request, called
            in the server's thread (``None``: always ``reply``).
    """

    def __init__(
        self,
        *,
        concurrency: int | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        stream_s: float = 0.0,
        chunks: int = 2,
        reply: str = "ok",
        answer: Callable[[dict[str, Any], int], str] | None = None,
    ) -> None:
        self.concurrency, self.stream_s, self.chunks, self.reply = (
            concurrency,
            stream_s,
            max(chunks, 1),
            reply,
        )
        self.answer = answer
        self._rpm = _Bucket(rpm) if rpm else None
        self._tpm = _Bucket(tpm) if tpm else None
        self._lock = threading.Lock()
        self._stats = Stats()
        self._in_flight = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def stats(self) -> Stats:
        """A copy of the counters."""
        with self._lock:
            s = self._stats
            return Stats(
                s.requests,
                s.refused,
                s.served,
                s.prompt_tokens,
                s.completion_tokens,
                list(s.request_bytes),
                s.most_at_once,
                dict(s.refused_by),
            )

    def __enter__(self) -> OpenAIStandin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------------ admission
    def admit(self, prompt_tokens: int, size: int) -> float | None:
        """Count one arriving request; ``None`` when it is served, else the seconds to wait."""
        with self._lock:
            self._stats.requests += 1
            self._stats.request_bytes.append(size)
            why, wait = self._over(prompt_tokens)
            if why:
                self._stats.refused += 1
                self._stats.refused_by[why] = self._stats.refused_by.get(why, 0) + 1
                return wait
            for bucket, units in ((self._rpm, 1), (self._tpm, prompt_tokens)):
                if bucket is not None:
                    bucket.level -= units
            self._in_flight += 1
            self._stats.most_at_once = max(self._stats.most_at_once, self._in_flight)
            self._stats.prompt_tokens += prompt_tokens
            return None

    def _over(self, prompt_tokens: int) -> tuple[str, float]:
        if self.concurrency is not None and self._in_flight >= self.concurrency:
            return "concurrency", 1.0
        for name, bucket, units in (("rpm", self._rpm, 1), ("tpm", self._tpm, prompt_tokens)):
            if bucket is not None:
                bucket.refill()
                wait = bucket.wait_s(units)
                if wait > 0:
                    return name, wait
        return "", 0.0

    def finish(self, completion_tokens: int) -> None:
        """The last content chunk of a served request was written."""
        with self._lock:
            self._in_flight -= 1
            self._stats.served += 1
            self._stats.completion_tokens += completion_tokens
            if self._tpm is not None:
                self._tpm.refill()
                self._tpm.level -= completion_tokens

    # ------------------------------------------------------------------ HTTP
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                body = json.loads(raw)
                prompt = math.ceil(len(raw) / 4)
                wait = standin.admit(prompt, len(raw))
                if wait is not None:
                    message = "Rate limit reached (stand-in): too many requests or tokens"
                    self._json(
                        429,
                        {"error": {"message": message, "type": "rate_limit_exceeded"}},
                        {"retry-after": str(max(1, math.ceil(wait)))},
                    )
                    return
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                text = standin.reply if standin.answer is None else standin.answer(body, len(raw))
                self._stream(body.get("model", ""), prompt, usage, text)

            def _json(self, status: int, doc: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _event(self, doc: dict[str, Any] | str) -> None:
                data = doc if isinstance(doc, str) else json.dumps(doc)
                line = f"data: {data}\n\n".encode()
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

            def _stream(self, model: str, prompt: int, usage: bool, reply: str) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                base = {"id": "chatcmpl-standin", "object": "chat.completion.chunk", "model": model}
                completion = math.ceil(len(reply.encode()) / 4)
                n = standin.chunks
                pieces = [reply[i * len(reply) // n : (i + 1) * len(reply) // n] for i in range(n)]
                try:
                    self._event(
                        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
                    )
                    for piece in pieces:
                        time.sleep(standin.stream_s / n)
                        self._event({**base, "choices": [{"index": 0, "delta": {"content": piece}}]})
                finally:
                    standin.finish(completion)
                self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                if usage:
                    total = prompt + completion
                    counts = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}
                    self._event({**base, "choices": [], "usage": counts})
                self._event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler

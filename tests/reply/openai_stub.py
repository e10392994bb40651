"""A loopback OpenAI-compatible ``/chat/completions`` server whose answers depend on how the
structured output is requested — a model that "supports" JSON-schema output for a tiny schema
(the capability probe) but answers prose under the real reply schema.

``behaviour`` per tier of the request:

* ``response_format`` naming ``probe`` → ``{"ok": true}`` (so the probe finds ``native``);
* ``response_format`` for anything else → prose when ``native_prose`` (default), else a valid reply;
* a ``reply``/``probe`` tool offered → a call of it with valid arguments;
* neither (the ``prompt`` tier) → the reply JSON as text.

Every request body is recorded in ``requests``; answers stream as SSE chunks like OpenAI's.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROSE = "Sure! Happy to help: the answer is forty-two."
TOOL_TEXT = "hello from the reply tool"
PROMPT_TEXT = "hello from the prompt tier"
NATIVE_TEXT = "hello from native"


def reply_json(text: str) -> dict[str, Any]:
    return {"segments": [{"type": "text", "data": {"text": text}}]}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "stub",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _text(text: str) -> bytes:
    return _chunk({"role": "assistant", "content": text}) + _chunk({}, "stop") + b"data: [DONE]\n\n"


def _call(name: str, arguments: dict[str, Any]) -> bytes:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": ""}}
    args = json.dumps(arguments)
    return (
        _chunk({"role": "assistant", "tool_calls": [call]})
        + _chunk({"tool_calls": [{"index": 0, "function": {"arguments": args}}]})
        + _chunk({}, "tool_calls")
        + b"data: [DONE]\n\n"
    )


def tool_names(body: dict[str, Any]) -> list[str]:
    """Names of the functions a request offers."""
    return [t.get("function", {}).get("name", "") for t in body.get("tools") or []]


def is_probe(body: dict[str, Any]) -> bool:
    """True for a capability-probe request (any tier)."""
    return "probe" in json.dumps(body.get("response_format") or {}) or "probe" in tool_names(body)


class OpenAIStub:
    """``with OpenAIStub() as stub``: ``stub.base_url`` (ends in ``/v1``); ``stub.requests``."""

    def __init__(self, *, native_prose: bool = True) -> None:
        self.native_prose = native_prose
        self.requests: list[dict[str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                stub.requests.append(body)
                data = stub.answer(body)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def answer(self, body: dict[str, Any]) -> bytes:
        fmt = body.get("response_format")
        names = tool_names(body)
        if fmt is not None:
            if "probe" in json.dumps(fmt):
                return _text('{"ok": true}')
            return _text(PROSE if self.native_prose else json.dumps(reply_json(NATIVE_TEXT)))
        if "probe" in names:
            return _call("probe", {"ok": True})
        if "reply" in names:
            return _call("reply", reply_json(TOOL_TEXT))
        return _text(json.dumps(reply_json(PROMPT_TEXT)))

    def __enter__(self) -> OpenAIStub:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

"""The ingress under bad input (docs/decisions.md#security-input-limits): every bad body is a
400/401/413 — never a 500 — and is neither stored nor routed; unexpected errors are a generic,
counted 500; size limits (``server.max_body_bytes`` on every route, ``server.max_text_chars``); a
large body is decoded off the event loop.

Real HTTP over loopback (uvicorn in a thread), real codecs, a real SQLite transcript store. The
runtime is a local stand-in that records what was routed (the ingress's own rules are tested
here; the router is tested on Ray elsewhere)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from actors.inbound.ingress import DECODE_IN_THREAD_BYTES, build_app
from actors.placement.runtime import SubmitResult
from runtime.config import BotConfig, Config, ConfigError, DatabaseConfig, ServerConfig, parse_config
from runtime.platforms.base import InboundMessage, PlatformCodec, RenderTarget, Sender
from runtime.platforms.console import API_TOKEN_ENV, API_TOKEN_HEADER, ConsoleCodec, console_api_token
from runtime.reply.segments import Reply
from tests.actors.edge_support import BOT_ID, SECRET, SECRET_ENV, onebot_event, serve_in_thread, signed

TG_BOT = "1000000077"
TG_TOKEN_ENV, TG_SECRET_ENV, TG_SECRET = "HARDEN_TG_TOKEN", "HARDEN_TG_SECRET", "harden-tg-secret"
MAX_BODY = 200_000
"""``server.max_body_bytes`` of the app under test (above DECODE_IN_THREAD_BYTES)."""
MAX_TEXT = 1_000
"""``server.max_text_chars`` of the app under test."""


class RecordingRuntime:
    """Takes every message (``accepted``) and remembers it; ``fail`` makes ``submit`` raise."""

    def __init__(self) -> None:
        self.taken: list[InboundMessage] = []
        self.fail: BaseException | None = None

    async def submit(self, msg: InboundMessage) -> SubmitResult:
        if self.fail is not None:
            raise self.fail
        self.taken.append(msg)
        return SubmitResult(status="accepted", seq=len(self.taken))

    async def status(self) -> dict[str, Any]:
        return {"live": 0}

    async def session(self, key: str) -> None:
        return None  # no live session: the admin API looks in SQL


@dataclass
class Served:
    url: str
    runtime: RecordingRuntime
    app: Any
    db_file: Path

    def rows(self) -> list[tuple[str, str]]:
        """``(platform, body)`` of every transcript row."""
        with sqlite3.connect(self.db_file) as conn:
            return conn.execute("SELECT platform, body FROM im_transcripts ORDER BY id").fetchall()

    def taken(self) -> list[tuple[str, str]]:
        """``(platform, text)`` of every routed message."""
        return [(m.platform, m.text) for m in self.runtime.taken]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    os.environ.setdefault(API_TOKEN_ENV, "ingress-hardening-api-token")  # a console bot needs it
    os.environ[SECRET_ENV] = SECRET
    os.environ[TG_TOKEN_ENV] = f"{TG_BOT}:AAharden-token"
    os.environ[TG_SECRET_ENV] = TG_SECRET
    db_file = tmp_path_factory.mktemp("harden") / "ingress.db"
    config = Config(
        bots=[
            BotConfig(
                platform="onebot11", self_id=BOT_ID, api_base="http://127.0.0.1:9", secret_env=SECRET_ENV
            ),
            BotConfig(
                platform="telegram",
                self_id=TG_BOT,
                api_base="http://127.0.0.1:9",
                token_env=TG_TOKEN_ENV,
                secret_env=TG_SECRET_ENV,
            ),
            BotConfig(platform="console", self_id="console"),
        ],
        database=DatabaseConfig(url=f"sqlite:///{db_file}"),
        server=ServerConfig(
            max_body_bytes=MAX_BODY, max_text_chars=MAX_TEXT, admin_token_env="HARDEN_NO_TOKEN"
        ),
    )
    runtime = RecordingRuntime()
    app = build_app(runtime, config)
    with serve_in_thread(app) as url:
        yield Served(url, runtime, app, db_file)


@pytest.fixture
def s(served: Served) -> Iterator[Served]:
    """The module's app with an empty routing record and a working runtime."""
    served.runtime.taken.clear()
    served.runtime.fail = None
    yield served
    served.runtime.fail = None


def inbound(platform: str, outcome: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "sessionray_inbound_messages_total", {"platform": platform, "outcome": outcome}
        )
        or 0.0
    )


def tg_update(fixtures_dir: Path, update_id: int, message_id: int, **fields: Any) -> dict[str, Any]:
    update = json.loads((fixtures_dir / "telegram" / "update_private_text.json").read_bytes())
    update["update_id"] = update_id
    update["message"]["message_id"] = message_id
    update["message"]["text"] = "hello"
    update["message"].update(fields)
    return update


def post_tg(s: Served, body: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": TG_SECRET}
    return httpx.post(f"{s.url}/webhooks/telegram/{TG_BOT}", content=body, headers=headers, timeout=30)


def post_ob(s: Served, body: bytes, headers: Any = None) -> httpx.Response:
    return httpx.post(
        f"{s.url}/webhooks/onebot11/{BOT_ID}", content=body, headers=headers or signed(body), timeout=30
    )


def post_console(s: Served, body: bytes) -> httpx.Response:
    headers = {"Content-Type": "application/json"}  # the browser's console.js sends it
    return httpx.post(f"{s.url}/webhooks/console/console", content=body, headers=headers, timeout=30)


def ob_event(fixtures_dir: Path, user: str, text: str, message_id: int, **fields: Any) -> bytes:
    event = json.loads(onebot_event(fixtures_dir, user, text, message_id))
    event.update(fields)
    return json.dumps(event).encode()


# --------------------------------------------------------------------------- valid input


def test_valid_messages_are_still_stored_and_routed(s: Served, fixtures_dir: Path) -> None:
    before = s.rows()
    ob = post_ob(s, onebot_event(fixtures_dir, "31001", "fine", 31001))
    tg = post_tg(s, json.dumps(tg_update(fixtures_dir, 31002, 31002)).encode())
    at_limit = post_console(
        s, json.dumps({"message_id": "c-31003", "user": "eve", "text": "x" * MAX_TEXT}).encode()
    )
    assert [(r.status_code, r.json()) for r in (ob, tg, at_limit)] == [(200, {"status": "accepted"})] * 3
    expected = [("onebot11", "fine"), ("telegram", "hello"), ("console", "x" * MAX_TEXT)]
    assert (s.taken(), s.rows()[len(before) :]) == (expected, expected)


# --------------------------------------------------------------------------- 400s, not 500s (#5, #6)


class ScriptedCodec:
    """Verifies nothing; ``parse`` returns ``result`` or raises it (the ingress's own checks are
    tested independently of what the real codecs already reject)."""

    platform = "console"
    supported_segments = frozenset({"text"})

    def __init__(self, result: InboundMessage | BaseException) -> None:
        self.result = result

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        return None

    def parse(self, headers: Mapping[str, str], body: bytes) -> InboundMessage | None:
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


@contextmanager
def console_codec(s: Served, codec: Any) -> Iterator[None]:
    """Serve the console webhook with ``codec`` for the block."""
    codecs = s.app.state.ingress.codecs
    real = codecs[("console", "console")]
    codecs[("console", "console")] = codec
    try:
        yield
    finally:
        codecs[("console", "console")] = real


def console_msg(**fields: Any) -> InboundMessage:
    base: dict[str, Any] = {
        "platform": "console",
        "bot_id": "console",
        "message_id": "c-1",
        "scene_type": "private",
        "scene_id": "eve",
        "sender": Sender(id="eve", name="Eve"),
        "text": "hi",
        "segments": [{"type": "text", "data": {"text": "hi"}}],
        "time_ms": 1_767_000_000_000,
    }
    return InboundMessage(**{**base, **fields})


def test_deeply_nested_json_is_400_without_exception_text(s: Served) -> None:
    rows = s.rows()
    deep_obj = b'{"a":' * 30_000 + b"1" + b"}" * 30_000
    deep_arr = b"[" * 90_000 + b"]" * 90_000
    before = [inbound(p, "malformed") for p in ("onebot11", "telegram", "console")]
    answers = [post_ob(s, deep_obj), post_tg(s, deep_arr), post_console(s, deep_obj)]
    for resp in answers:
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"].startswith("malformed event: ")
        assert "RecursionError" not in resp.text and "Traceback" not in resp.text
    assert [inbound(p, "malformed") for p in ("onebot11", "telegram", "console")] == [b + 1 for b in before]
    assert (s.taken(), s.rows()) == ([], rows)


@pytest.mark.parametrize(
    "raised",
    [
        RecursionError("maximum recursion depth exceeded"),
        ValueError("x"),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"),
    ],
)
def test_any_decode_error_of_a_codec_is_a_400_without_exception_text(s: Served, raised: Exception) -> None:
    before = (inbound("console", "malformed"), inbound("console", "error"))
    with console_codec(s, ScriptedCodec(raised)):
        resp = post_console(s, b"{}")
    assert (resp.status_code, resp.json()) == (
        400,
        {"error": "malformed event: the body could not be decoded"},
    )
    assert (inbound("console", "malformed"), inbound("console", "error")) == (before[0] + 1, before[1])
    assert s.taken() == []


@pytest.mark.parametrize(
    "raised",
    [
        AttributeError("'str' object has no attribute 'get'"),
        TypeError("x"),
        KeyError("x"),
        IndexError("x"),
        OverflowError("x"),
    ],
)
def test_a_codec_bug_is_a_400_counted_as_error_and_logged_with_traceback(
    s: Served, raised: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """Review S3 #3: still 400 (a 5xx would be redelivered forever), but visible: outcome
    ``error`` (not ``malformed``) and an ERROR record with the exception's traceback."""
    before = (inbound("console", "malformed"), inbound("console", "error"))
    with (
        caplog.at_level(logging.WARNING, logger="sessionray.ingress"),
        console_codec(s, ScriptedCodec(raised)),
    ):
        resp = post_console(s, b"{}")
    assert (resp.status_code, resp.json()) == (
        400,
        {"error": "malformed event: the body could not be decoded"},
    )
    assert (inbound("console", "malformed"), inbound("console", "error")) == (before[0], before[1] + 1)
    records = [r for r in caplog.records if r.name == "sessionray.ingress"]
    assert [(r.levelname, r.getMessage()) for r in records] == [
        ("ERROR", "webhook console: the codec failed on the event (codec bug)")
    ]
    assert records[0].exc_info is not None and records[0].exc_info[1] is raised
    assert s.taken() == []


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"text": "bad \ud800 text"}, "text is not valid Unicode (lone surrogate at character 4)"),
        (
            {"sender": Sender(id="eve", name="E\udfff")},
            "sender.name is not valid Unicode (lone surrogate at character 1)",
        ),
        ({"message_id": "c-\ud800"}, "message_id is not valid Unicode (lone surrogate at character 2)"),
        (
            {"segments": [{"type": "text", "data": {"text": "\ud800"}}]},
            "segments are not valid Unicode (lone surrogate)",
        ),
        ({"time_ms": 10**23}, "time is out of range (a 64-bit count of milliseconds)"),
        ({"time_ms": -(2**63) - 1}, "time is out of range (a 64-bit count of milliseconds)"),
    ],
)
def test_a_message_that_cannot_be_stored_is_400_before_routing_also_on_redelivery(
    s: Served, fields: dict[str, Any], error: str
) -> None:
    rows = s.rows()
    before = inbound("console", "malformed")
    with console_codec(s, ScriptedCodec(console_msg(**fields))):
        answers = [post_console(s, b"{}") for _ in range(3)]  # a platform redelivers a non-2xx answer
    assert [(r.status_code, r.json()) for r in answers] == [(400, {"error": f"malformed event: {error}"})] * 3
    assert inbound("console", "malformed") == before + 3
    assert (s.taken(), s.rows()) == ([], rows)


def test_ids_that_make_no_session_key_are_400_from_the_ingress_check(s: Served) -> None:
    with console_codec(s, ScriptedCodec(console_msg(scene_id="a#b"))):
        resp = post_console(s, b"{}")
    assert resp.status_code == 400
    assert resp.json()["error"].startswith("malformed event: bad chat or user id: ")
    assert s.taken() == []


def test_a_storable_message_at_the_edges_is_taken(s: Served) -> None:
    with console_codec(s, ScriptedCodec(console_msg(message_id="c-edge", time_ms=2**63 - 1, text="ok ✓"))):
        resp = post_console(s, b"{}")
    assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})
    assert s.taken() == [("console", "ok ✓")]


def test_real_codecs_refuse_odd_times_and_surrogates_without_a_500(s: Served, fixtures_dir: Path) -> None:
    """Whichever layer refuses (codec or ingress), the answer is never a 500 and nothing is routed."""
    rows = s.rows()
    tg_late = post_tg(s, json.dumps(tg_update(fixtures_dir, 33001, 33001, date=10**20)).encode())
    ob_late = post_ob(s, ob_event(fixtures_dir, "33002", "late", 33002, time=10**20))
    console_late = post_console(
        s, json.dumps({"message_id": "c-33003", "user": "eve", "text": "x", "time_ms": 10**30}).encode()
    )
    assert [r.status_code for r in (tg_late, ob_late, console_late)] == [400, 400, 400]
    assert (s.taken(), s.rows()) == ([], rows)
    surrogate = json.dumps({"message_id": "c-33004", "user": "eve", "text": "PLACEHOLDER"}).encode()
    resp = post_console(s, surrogate.replace(b"PLACEHOLDER", b"bad \\ud800"))
    assert (resp.status_code, resp.json()) == (
        400,
        {"error": "malformed event: console 'text' is not valid Unicode (lone surrogate)"},
    )
    assert (s.taken(), s.rows()) == ([], rows)


def test_ids_that_make_no_session_key_are_400(s: Served, fixtures_dir: Path) -> None:
    rows = s.rows()
    answers = [
        post_ob(s, ob_event(fixtures_dir, "34001", "hi", 34000 + i, user_id=bad))
        for i, bad in enumerate(["a#b", "a b", ""])
    ]
    assert [r.status_code for r in answers] == [400, 400, 400]
    assert (s.taken(), s.rows()) == ([], rows)


def test_odd_field_types_are_400(s: Served, fixtures_dir: Path) -> None:
    """Telegram ``entities`` that are not a list of objects, a ``chat.id`` object: 400."""
    rows = s.rows()
    bodies = [
        tg_update(fixtures_dir, 35001, 35001, entities="x"),
        tg_update(fixtures_dir, 35002, 35002, entities=[5]),
        tg_update(fixtures_dir, 35003, 35003, entities=[{"type": "mention", "offset": 0, "length": "x"}]),
        tg_update(fixtures_dir, 35004, 35004, chat={"id": {"a": 1}, "type": "private"}),
    ]
    answers = [post_tg(s, json.dumps(b).encode()) for b in bodies]
    assert [r.status_code for r in answers] == [400] * 4, [r.text for r in answers]
    assert (s.taken(), s.rows()) == ([], rows)


def test_unverifiable_signature_is_401(s: Served, fixtures_dir: Path) -> None:
    body = onebot_event(fixtures_dir, "36001", "hi", 36001)
    before = inbound("onebot11", "bad_signature")
    resp = post_ob(
        s, body, {"Content-Type": "application/json", "X-Signature": "sha1=\xe9\xe9".encode("latin-1")}
    )
    assert (resp.status_code, resp.json()["error"].startswith("bad signature")) == (401, True)
    assert inbound("onebot11", "bad_signature") == before + 1
    assert s.taken() == []


def test_unexpected_error_is_a_generic_counted_500(
    s: Served, fixtures_dir: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def explode(**_: Any) -> None:
        raise ValueError("store exploded with secret detail")

    monkeypatch.setattr(s.app.state.ingress.gate.store, "store", explode)
    before = inbound("onebot11", "error")
    with caplog.at_level(logging.ERROR, logger="sessionray.ingress"):
        resp = post_ob(s, onebot_event(fixtures_dir, "37001", "hi", 37001))
    assert (resp.status_code, resp.json()) == (500, {"error": "internal error"})
    assert inbound("onebot11", "error") == before + 1
    logged = [r for r in caplog.records if r.name == "sessionray.ingress" and r.exc_info]
    assert [str(r.exc_info[1]) for r in logged if r.exc_info] == ["store exploded with secret detail"]
    assert s.taken() == []


def test_a_runtime_failure_after_the_message_is_stored_is_queued(
    s: Served, fixtures_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Once stored, whatever the runtime raises is answered 200 ``queued`` (the inbox recovery
    loop routes it: docs/decisions.md#inbox-durable); the redelivery is a duplicate."""
    s.runtime.fail = RuntimeError("router exploded with secret detail")
    before = inbound("onebot11", "queued")
    body = onebot_event(fixtures_dir, "37002", "stored first", 37002)
    with caplog.at_level(logging.WARNING, logger="sessionray.ingress"):
        resp = post_ob(s, body)
    assert (resp.status_code, resp.json()) == (200, {"status": "queued"})
    assert inbound("onebot11", "queued") == before + 1
    s.runtime.fail = None
    assert post_ob(s, body).json() == {"status": "duplicate"}
    assert s.taken() == []  # the stand-in runtime has no recovery loop
    assert s.rows().count(("onebot11", "stored first")) == 1


# --------------------------------------------------------------------------- size limits (#7)


def test_text_over_max_text_chars_is_413_not_stored_not_routed(s: Served, fixtures_dir: Path) -> None:
    rows = s.rows()
    long = "y" * (MAX_TEXT + 1)
    console = post_console(s, json.dumps({"message_id": "c-38001", "user": "eve", "text": long}).encode())
    ob = post_ob(s, onebot_event(fixtures_dir, "38002", long, 38002))
    for resp in (console, ob):
        assert (resp.status_code, resp.json()) == (
            413,
            {
                "error": f"message text is too long: {MAX_TEXT + 1} characters, "
                f"at most {MAX_TEXT} (server.max_text_chars)"
            },
        )
    assert (s.taken(), s.rows()) == ([], rows)


TOO_LARGE = {"error": f"request body too large: the limit is {MAX_BODY} bytes (server.max_body_bytes)"}


@pytest.mark.parametrize(
    "path",
    [f"/webhooks/onebot11/{BOT_ID}", "/admin/sessions/onebot11:10001:private:1/steer", "/console/api/echo"],
)
def test_body_over_max_body_bytes_is_413_on_every_route(s: Served, path: str) -> None:
    rows = s.rows()
    resp = httpx.post(s.url + path, content=b"{" + b" " * MAX_BODY + b"}", timeout=30)
    assert (resp.status_code, resp.json()) == (413, TOO_LARGE)
    assert (s.taken(), s.rows()) == ([], rows)


def test_console_delivery_with_inlined_media_over_the_limit_still_works(s: Served, tmp_path: Path) -> None:
    """The console's internal platform API (a DeliveryActor's call, with its API token) is not
    limited: replies inline ``path`` media as base64 (bounded by the console's media limits)."""
    image = tmp_path / "big.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(MAX_BODY))
    codec = ConsoleCodec(bot_id="console", api_base=s.url, api_token=console_api_token(), media_dir=tmp_path)
    reply = Reply.model_validate(
        {"segments": [{"type": "image", "data": {"media": {"kind": "path", "value": str(image)}}}]}
    )
    [call] = codec.render(reply, RenderTarget(scene_type="private", scene_id="eve"))
    resp = httpx.post(call.url, json=call.json_body, headers=call.headers, timeout=30)
    assert len(resp.request.content) > MAX_BODY
    result = codec.parse_send_result(resp.status_code, resp.headers, resp.content)
    assert (result.ok, result.error) == (True, None)
    wrong = httpx.post(call.url, json=call.json_body, headers={API_TOKEN_HEADER: "wrong"}, timeout=30)
    assert (wrong.status_code, wrong.json()) == (413, TOO_LARGE)


def test_chunked_body_is_counted_and_limited(s: Served, fixtures_dir: Path) -> None:
    def chunks(body: bytes, size: int = 16_384) -> Iterator[bytes]:
        yield from (body[i : i + size] for i in range(0, len(body), size))

    hook = f"{s.url}/webhooks/onebot11/{BOT_ID}"
    big = ob_event(fixtures_dir, "39001", "hi", 39001, pad="p" * MAX_BODY)
    resp = httpx.post(hook, content=chunks(big), headers=signed(big), timeout=30)
    assert (resp.status_code, resp.json()) == (413, TOO_LARGE)
    assert s.taken() == []
    fine = ob_event(fixtures_dir, "39002", "chunked fine", 39002, pad="p" * (MAX_BODY - 2_000))
    assert len(fine) <= MAX_BODY
    resp = httpx.post(hook, content=chunks(fine), headers=signed(fine), timeout=30)
    assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})
    assert s.taken() == [("onebot11", "chunked fine")]


def test_server_limit_keys_defaults_and_errors() -> None:
    assert (ServerConfig().max_body_bytes, ServerConfig().max_text_chars) == (1_048_576, 16_000)
    with pytest.raises(ConfigError) as err:
        parse_config({"server": {"max_body_bytes": 0, "max_text_chars": "many"}}, "sessionray.yaml")
    assert str(err.value).splitlines() == [
        "sessionray.yaml: server.max_body_bytes: Input should be greater than 0",
        "sessionray.yaml: server.max_text_chars: Input should be a valid integer",  # strict: no "5", no true
    ]


# --------------------------------------------------------------------------- event loop


class HoldingCodec:
    """Wraps a codec; ``parse`` of a large body waits until ``release`` is set (as a slow decode)."""

    def __init__(self, inner: PlatformCodec) -> None:
        self.inner = inner
        self.platform = inner.platform
        self.supported_segments = inner.supported_segments
        self.release = threading.Event()
        self.parse_threads: list[str] = []

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        self.inner.verify(headers, body)

    def parse(self, headers: Mapping[str, str], body: bytes) -> InboundMessage | None:
        self.parse_threads.append(threading.current_thread().name)
        if len(body) > DECODE_IN_THREAD_BYTES:
            assert self.release.wait(timeout=20), "never released"
        return self.inner.parse(headers, body)


def test_large_body_is_decoded_off_the_event_loop(s: Served, fixtures_dir: Path) -> None:
    codecs = s.app.state.ingress.codecs
    real = codecs[("onebot11", BOT_ID)]
    holding = HoldingCodec(real)
    codecs[("onebot11", BOT_ID)] = holding
    try:
        big = ob_event(fixtures_dir, "40001", "big", 40001, pad="p" * (DECODE_IN_THREAD_BYTES + 1))
        answer: list[httpx.Response] = []
        poster = threading.Thread(target=lambda: answer.append(post_ob(s, big)))
        poster.start()
        while not holding.parse_threads and poster.is_alive():  # the big body's decode is held
            poster.join(timeout=0.01)
        assert holding.parse_threads, answer
        health = httpx.get(f"{s.url}/healthz", timeout=10)  # the loop still serves meanwhile
        holding.release.set()
        poster.join(timeout=30)
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        assert [(r.status_code, r.json()) for r in answer] == [(200, {"status": "accepted"})]
        small = post_ob(s, onebot_event(fixtures_dir, "40002", "small", 40002))
        assert (small.status_code, small.json()) == (200, {"status": "accepted"})
        assert holding.parse_threads[1] == "edge-ingress"  # small: on the loop (uvicorn's thread)
        assert holding.parse_threads[0] != "edge-ingress"  # big: in a worker thread
    finally:
        holding.release.set()
        codecs[("onebot11", BOT_ID)] = real
    assert s.taken() == [("onebot11", "big"), ("onebot11", "small")]


# --------------------------------------------------------------------------- connections


def test_ingress_process_holds_one_bounded_database(
    s: Served, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The ingress's Database has no pool overflow (at most DEFAULT_SQL_THREADS connections on
    PostgreSQL, as deploy/README.md says; on SQLite, as here, one more for the writer lock's holder
    writing inline: docs/decisions.md#memory-sql-off-loop), and the admin's stored-session view
    reads through it instead of opening a second one; a delivery actor's Database is bounded the
    same way."""
    from actors.http import admin
    from runtime.delivery.core import DeliverySender, DeliverySettings
    from runtime.memory.db import DEFAULT_SQL_THREADS

    ingress = s.app.state.ingress
    assert ingress.db is not None and ingress.db.max_connections == DEFAULT_SQL_THREADS + 1
    opened: list[str] = []
    monkeypatch.setattr(admin, "_open_repository", opened.append)
    monkeypatch.setenv("HARDEN_NO_TOKEN", "harden-admin")
    resp = httpx.get(
        f"{s.url}/admin/sessions/onebot11:{BOT_ID}:private:41001",
        headers={"Authorization": "Bearer harden-admin"},
        timeout=30,
    )
    assert (resp.status_code, resp.json(), opened) == (
        404,
        {"error": f"no live or stored session 'onebot11:{BOT_ID}:private:41001'"},
        [],
    )
    sender = DeliverySender(DeliverySettings(database_url=f"sqlite:///{tmp_path}/d.db"), 0, "0:1")
    try:
        assert sender.db.max_connections == DEFAULT_SQL_THREADS + 1
    finally:
        asyncio.run(sender.close())


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_the_console_webhook_refuses_what_a_cross_site_page_can_send(s: Served, ctype: str | None) -> None:
    """A browser posts ``text/plain`` or forms cross-site without a CORS preflight (a Blob with
    no type: no header at all), never JSON: the console webhook requires JSON
    (docs/decisions.md#security-console-scope)."""
    body = json.dumps({"message_id": "c-csrf", "user": "admin", "text": "csrf"}).encode()
    headers = {} if ctype is None else {"Content-Type": ctype}
    r = httpx.post(f"{s.url}/webhooks/console/console", content=body, headers=headers, timeout=30)
    assert (r.status_code, r.json()) == (415, {"error": "send the event as application/json"})
    assert s.runtime.taken == []

"""The console under attack (docs/decisions.md#security-console-scope): steer / follow-up only for
console sessions and only with the master token (a master's name alone is not enough:
docs/decisions.md#security-console-master-proof), console sessions only in the list, internal
deliver / events behind ``X-Console-Api-Token``, bad input answered 400/413 (never a 500), names
matched in full, and no link to a non-http(s) URL in the browser.

Real HTTP over loopback: the ingress app (``actors.inbound.ingress.build_app``, so the console routes are
mounted as ``sessionray serve`` mounts them) in a uvicorn thread, a real SQLite transcript store,
real codecs. The runtime is a stand-in recording what reached it (the router's own rules are tested
on Ray elsewhere)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from actors.inbound.ingress import build_app
from actors.placement.runtime import SessionInfo, SubmitResult
from runtime.config import BotConfig, Config, DatabaseConfig, ServerConfig
from runtime.platforms.base import InboundMessage, MalformedEvent, RenderTarget, get_codec
from runtime.platforms.common import MAX_EVENT_TIME_MS, epoch_ms
from runtime.platforms.console import API_TOKEN_ENV, API_TOKEN_HEADER, ConsoleCodec
from runtime.reply.segments import Reply
from runtime.session.control import ControlReply, ControlRequest
from tests.actors.edge_support import serve_in_thread

API_TOKEN = "console-hardening-api-token"
MASTER_ENV = "CONSOLE_HARDEN_MASTER"
MASTER_TOKEN = "console-hardening-master-token"
PROOF = {"X-Console-Master-Token": MASTER_TOKEN}
MAX_TEXT = 100
TG_KEY = "telegram:1000000077:private:987654321"
OB_KEY = "onebot11:10001:group:123"
CONSOLE_KEY = "console:console:private:admin"
DEEP = b'{"a":' * 100_000 + b"1" + b"}" * 100_000


class ControlRuntime:
    """Records steer / follow-up calls and routed messages; lists sessions of three platforms."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, str]] = []
        self.taken: list[InboundMessage] = []

    async def submit(self, msg: InboundMessage) -> SubmitResult:
        self.taken.append(msg)
        return SubmitResult(status="accepted", seq=len(self.taken))

    async def control(self, request: ControlRequest) -> ControlReply:
        """Steer ``"started"``, follow-up ``"queued"``."""
        self.calls.append((request.kind, request.session_key, request.text, request.sender_id))
        result = "started" if request.kind == "steer" else "queued"
        return ControlReply(kind=request.kind, session_key=request.session_key, result=result)

    async def sessions(self) -> list[SessionInfo]:
        return [
            SessionInfo(session_key=k, session_id=f"{k}#1", shard=0, pending=0, turns=1, idle_s=2.0)
            for k in (CONSOLE_KEY, OB_KEY, TG_KEY)
        ]

    async def status(self) -> dict[str, Any]:
        return {"live": 3}


@dataclass
class Served:
    url: str
    runtime: ControlRuntime

    def post(
        self, path: str, body: Any = None, *, raw: bytes | None = None, as_master: bool = True, **kw: Any
    ) -> httpx.Response:
        """POST JSON (or ``raw``); with the master token (:data:`PROOF`) unless ``as_master`` is False."""
        content = raw if raw is not None else json.dumps(body).encode()
        proof = PROOF if as_master else {}
        headers = {"Content-Type": "application/json", **proof, **kw.pop("headers", {})}
        return httpx.post(self.url + path, content=content, headers=headers, timeout=30, **kw)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    old = os.environ.get(API_TOKEN_ENV)
    os.environ[API_TOKEN_ENV] = API_TOKEN
    os.environ[MASTER_ENV] = MASTER_TOKEN
    db_file = tmp_path_factory.mktemp("console-harden") / "ingress.db"
    config = Config(
        bots=[
            BotConfig(platform="console", self_id="console", masters=["admin"], master_token_env=MASTER_ENV)
        ],
        database=DatabaseConfig(url=f"sqlite:///{db_file}"),
        server=ServerConfig(max_text_chars=MAX_TEXT, admin_token_env="CONSOLE_HARDEN_NO_TOKEN"),
    )
    runtime = ControlRuntime()
    try:
        with serve_in_thread(build_app(runtime, config)) as url:
            yield Served(url, runtime)
    finally:
        os.environ.pop(MASTER_ENV, None)
        if old is None:
            os.environ.pop(API_TOKEN_ENV, None)
        else:
            os.environ[API_TOKEN_ENV] = old


@pytest.fixture
def s(served: Served) -> Served:
    served.runtime.calls.clear()
    served.runtime.taken.clear()
    return served


# --------------------------------------------------------------------------- item 1: scope + secrets


@pytest.mark.parametrize("kind", ["steer", "follow_up"])
@pytest.mark.parametrize("key", [TG_KEY, OB_KEY])
def test_console_cannot_control_other_platforms(s: Served, kind: str, key: str) -> None:
    resp = s.post(f"/console/api/{kind}", {"user": "987654321", "session_key": key, "text": "INJECTED"})
    platform = key.split(":")[0]
    assert (resp.status_code, resp.json()) == (
        403,
        {
            "error": f"the console may {kind} console sessions only (console:*), not {platform} ones: "
            f"use the admin API (POST /admin/sessions/{{session_key}}/{kind} with "
            "Authorization: Bearer <admin token>)"
        },
    )
    assert s.runtime.calls == []


def test_console_controls_console_sessions(s: Served) -> None:
    steer = s.post("/console/api/steer", {"user": "admin", "session_key": CONSOLE_KEY, "text": "stop"})
    follow = s.post("/console/api/follow_up", {"user": "admin", "session_key": CONSOLE_KEY, "text": "then"})
    assert [(r.status_code, r.json()) for r in (steer, follow)] == [
        (200, {"ok": True, "outcome": "started"}),
        (200, {"ok": True, "outcome": "queued"}),
    ]
    assert s.runtime.calls == [
        ("steer", CONSOLE_KEY, "stop", "admin"),
        ("follow_up", CONSOLE_KEY, "then", "admin"),
    ]
    bad = s.post("/console/api/steer", {"user": "admin", "session_key": "console:x", "text": "t"})
    assert (bad.status_code, bad.json()) == (
        400,
        {
            "error": "`session_key`: malformed session key 'console:x': "
            "expected 'platform:bot_id:scope:scene_id'"
        },
    )


@pytest.mark.parametrize("proof", [None, "wrong-token", ""])
def test_a_master_name_alone_cannot_steer_list_or_get_the_master_role(s: Served, proof: str | None) -> None:
    """docs/decisions.md#security-console-master-proof: ``admin`` without the master token (none,
    a wrong one, an empty one) cannot steer or follow up any console session, see the live
    sessions, or become a master through the webhook (``/steer`` in the chat); the page is told
    to ask for the token (``master_name``). With the token each of these works."""
    headers = {} if proof is None else {"X-Console-Master-Token": proof}
    why = (
        "'admin' is a master name of console bot 'console', but to {what} the request needs the master "
        f"token in X-Console-Master-Token (the value of ${MASTER_ENV} on the server; `make run` prints it "
        "as the admin token)"
    )
    for kind in ("steer", "follow_up"):
        body = {"user": "admin", "session_key": "console:console:private:bob", "text": "stop"}
        r = s.post(f"/console/api/{kind}", body, as_master=False, headers=headers)
        assert (r.status_code, r.json()) == (403, {"error": why.format(what=kind.replace("_", "-"))})
    listed = httpx.get(s.url + "/console/api/sessions", params={"user": "admin"}, headers=headers, timeout=30)
    assert (listed.status_code, listed.json()) == (403, {"error": why.format(what="see live sessions")})
    me = httpx.get(s.url + "/console/api/me", params={"user": "admin"}, headers=headers, timeout=30)
    assert me.json() == {"user": "admin", "bot": "console", "master": False, "master_name": True}
    unproven = console_msg(user="admin", text="/steer stop", message_id=f"c-np-{proof}")
    hook = s.post("/webhooks/console/console", unproven, as_master=False, headers=headers)
    refused = "bad signature: 'admin' is a master's name: a message under it needs the master token in "
    assert (hook.status_code, hook.json()) == (401, {"error": refused + "X-Console-Master-Token"})
    history = httpx.get(s.url + "/console/api/history", params={"user": "admin"}, headers=headers, timeout=30)
    assert (history.status_code, history.json()) == (403, {"error": why.format(what="read its history")})
    assert s.runtime.taken == [] and s.runtime.calls == []

    steer = s.post(
        "/console/api/steer", {"user": "admin", "session_key": "console:console:private:bob", "text": "x"}
    )
    assert (steer.status_code, s.runtime.calls) == (
        200,
        [("steer", "console:console:private:bob", "x", "admin")],
    )
    listed = httpx.get(s.url + "/console/api/sessions", params={"user": "admin"}, headers=PROOF, timeout=30)
    assert listed.status_code == 200
    me = httpx.get(s.url + "/console/api/me", params={"user": "admin"}, headers=PROOF, timeout=30)
    assert me.json() == {"user": "admin", "bot": "console", "master": True, "master_name": True}
    s.post(
        "/webhooks/console/console", console_msg(user="admin", text="/steer stop", message_id=f"c-p-{proof}")
    )
    assert [m.sender.roles for m in s.runtime.taken] == [["master"]]
    info = httpx.get(s.url + "/console/api/info", timeout=30).json()
    assert info == {"bots": ["console"], "token_required": False, "master_token": True}


def test_the_master_token_makes_no_other_name_a_master(s: Served) -> None:
    body = {"user": "mallory", "session_key": CONSOLE_KEY, "text": "stop"}
    r = s.post("/console/api/steer", body)
    error = "'mallory' is not a master of console bot 'console'; only masters may steer"
    assert (r.status_code, r.json()) == (403, {"error": error})
    listed = httpx.get(s.url + "/console/api/sessions", params={"user": "mallory"}, headers=PROOF, timeout=30)
    assert listed.status_code == 403
    s.post(
        "/webhooks/console/console", console_msg(user="mallory", text="/steer stop", message_id="c-mallory")
    )
    assert [m.sender.roles for m in s.runtime.taken] == [[]] and s.runtime.calls == []


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_console_api_refuses_what_a_cross_site_page_can_send(s: Served, ctype: str) -> None:
    """A cross-site page can POST text/plain or a form without a CORS preflight, never JSON: the
    console API requires a JSON body type (follow_up driven from another site:
    docs/decisions.md#security-console-scope)."""
    body = {"user": "admin", "session_key": CONSOLE_KEY, "text": "csrf"}
    r = s.post("/console/api/follow_up", body, headers={"Content-Type": ctype})
    assert (r.status_code, r.json()) == (415, {"error": "send the body as application/json"})
    assert s.runtime.calls == []


def test_console_lists_console_sessions_only(s: Served) -> None:
    resp = httpx.get(s.url + "/console/api/sessions", params={"user": "admin"}, headers=PROOF, timeout=30)
    assert resp.json() == {
        "sessions": [
            {
                "session_key": CONSOLE_KEY,
                "session_id": f"{CONSOLE_KEY}#1",
                "shard": 0,
                "pending": 0,
                "turns": 1,
                "idle_s": 2.0,
                "host": -1,
                "actor_id": None,
                "epoch": 0,
                "actor": None,
            }
        ]
    }


def test_deliver_and_events_need_the_api_token(s: Served) -> None:
    reply = {
        "scene_type": "private",
        "scene_id": "admin",
        "segments": [{"type": "text", "data": {"text": "x"}}],
    }
    event = {"session_key": CONSOLE_KEY, "event": {"type": "notice", "text": "fake"}}
    refused = {
        "error": f"internal console endpoint: missing or wrong {API_TOKEN_HEADER} "
        f"(the value of ${API_TOKEN_ENV} on the server)"
    }
    for path, body in (("/console/api/deliver", reply), ("/console/api/events", event)):
        for headers in ({}, {API_TOKEN_HEADER: "wrong"}, {"X-Console-Token": API_TOKEN}):
            resp = s.post(path, body, headers=headers)
            assert (resp.status_code, resp.json()) == (401, refused)
        ok = s.post(path, body, headers={API_TOKEN_HEADER: API_TOKEN})
        assert (ok.status_code, ok.json()["ok"]) == (200, True)


def test_console_and_body_limit_exemption_check_the_token_the_same_way(
    s: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review S3 #8: one check (``api_token_matches``) reads the variable per request, so a
    rotated token is taken by the console's internal routes and by the ingress's body-size
    exemption at once, and the old one by neither."""
    reply = {
        "scene_type": "private",
        "scene_id": "admin",
        "segments": [{"type": "text", "data": {"text": "x"}}],
    }
    big = {**reply, "pad": "p" * 1_100_000}  # over server.max_body_bytes (1 MiB): exempt only with the token
    monkeypatch.setenv(API_TOKEN_ENV, "rotated-token")
    answers = [
        s.post("/console/api/deliver", body, headers={API_TOKEN_HEADER: token}).status_code
        for token in (API_TOKEN, "rotated-token")
        for body in (reply, big)
    ]
    assert answers == [401, 413, 200, 200]


async def test_the_codec_and_the_event_sink_send_the_api_token(s: Served) -> None:
    """The real callers (a DeliveryActor's codec, a console session's event sink) get through:
    both read the token from $SESSIONRAY_CONSOLE_API_TOKEN, as the console does."""
    from runtime.agent.events import ToolExecutionStartEvent
    from runtime.session.console_events import console_event_hook

    bot = BotConfig(platform="console", self_id="console", api_base=s.url)
    codec = get_codec(bot)
    (call,) = codec.render(
        Reply.model_validate({"segments": [{"type": "text", "data": {"text": "hi"}}]}),
        RenderTarget(scene_type="private", scene_id="admin"),
    )
    assert call.headers == {API_TOKEN_HEADER: API_TOKEN}
    async with httpx.AsyncClient(timeout=30) as client:
        resp = await client.post(call.url, json=call.json_body, headers=call.headers)
    assert codec.parse_send_result(resp.status_code, resp.headers, resp.content).ok is True

    sink = console_event_hook(Config(bots=[bot]), CONSOLE_KEY)
    assert sink is not None and getattr(sink, "api_token", None) == API_TOKEN
    async with (
        httpx.AsyncClient(base_url=s.url, timeout=30) as client,
        client.stream("GET", "/console/api/stream", params={"user": "admin"}) as stream,
    ):
        lines = stream.aiter_lines()
        assert await anext(lines) == ": connected"
        sink(ToolExecutionStartEvent(tool_call_id="1", tool_name="clock", args={}))
        await sink.drained()  # type: ignore[attr-defined]
        async for line in lines:
            if line.startswith("data: "):
                break
    assert json.loads(line[6:]) == {
        "type": "agent",
        "session_key": CONSOLE_KEY,
        "event": {"type": "tool_call", "name": "clock", "args": {}},
    }


def test_stream_survives_text_utf8_cannot_carry(s: Served) -> None:
    """A delivered reply with a lone surrogate is sent \\u-escaped; the stream goes on."""
    reply = {
        "scene_type": "private",
        "scene_id": "sam",
        "segments": [{"type": "text", "data": {"text": "a"}}],
    }
    raw = json.dumps(reply).replace('"a"', '"a\\ud800"').encode()
    with (
        httpx.Client(base_url=s.url, timeout=30) as client,
        client.stream("GET", "/console/api/stream", params={"user": "sam"}) as stream,
    ):
        lines = stream.iter_lines()
        assert next(lines) == ": connected"
        auth = {"Content-Type": "application/json", API_TOKEN_HEADER: API_TOKEN}
        assert client.post("/console/api/deliver", content=raw, headers=auth).status_code == 200
        assert client.post("/console/api/deliver", json=reply, headers=auth).status_code == 200
        data: list[str] = []
        for line in lines:
            if line.startswith("data: "):
                data.append(line)
            if len(data) == 2:
                break
    assert [json.loads(d[6:])["segments"] for d in data] == [
        [{"type": "text", "data": {"text": "a\ud800"}}],
        [{"type": "text", "data": {"text": "a"}}],
    ]
    assert "\\ud800" in data[0]


# --------------------------------------------------------------------------- item 2: bad bodies


@pytest.mark.parametrize(
    "path", ["/console/api/steer", "/console/api/follow_up", "/console/api/echo", "/console/api/deliver"]
)
def test_deeply_nested_json_is_a_400(s: Served, path: str) -> None:
    resp = s.post(path, raw=DEEP, headers={API_TOKEN_HEADER: API_TOKEN})
    assert (resp.status_code, resp.json()) == (400, {"error": "JSON body is nested too deeply"})


@pytest.mark.parametrize("kind", ["steer", "follow_up"])
def test_control_text_must_be_unicode_and_bounded(s: Served, kind: str) -> None:
    raw = json.dumps({"user": "admin", "session_key": CONSOLE_KEY, "text": "aXb"}).replace("X", "\\ud800")
    bad = s.post(f"/console/api/{kind}", raw=raw.encode())
    assert (bad.status_code, bad.json()) == (
        400,
        {"error": "`text` is not valid Unicode text (it contains a lone surrogate)"},
    )
    long = s.post(f"/console/api/{kind}", {"user": "admin", "session_key": CONSOLE_KEY, "text": "A" * 101})
    assert (long.status_code, long.json()) == (
        413,
        {"error": f"`text` is too long: 101 characters, at most {MAX_TEXT} (server.max_text_chars)"},
    )
    fits = s.post(f"/console/api/{kind}", {"user": "admin", "session_key": CONSOLE_KEY, "text": "A" * 100})
    assert fits.status_code == 200
    assert s.runtime.calls == [(kind, CONSOLE_KEY, "A" * 100, "admin")]


def test_echo_text_must_be_unicode(s: Served) -> None:
    raw = json.dumps({"user": "erin", "group_id": "lobby", "text": "hiX"}).replace("X", "\\udc00")
    resp = s.post("/console/api/echo", raw=raw.encode())
    assert (resp.status_code, resp.json()) == (
        400,
        {"error": "`text` is not valid Unicode text (it contains a lone surrogate)"},
    )


# --------------------------------------------------------------------------- item 4: names in full


def console_msg(**kw: Any) -> dict[str, Any]:
    return {"message_id": "c-1", "user": "alice", "text": "hello", "time_ms": 1767000000000, **kw}


def test_trailing_newline_names_are_400_everywhere(s: Served) -> None:
    hook = s.post("/webhooks/console/console", console_msg(user="admin\n"))
    assert (hook.status_code, hook.json()) == (
        400,
        {"error": "malformed event: console 'user' must be 1-32 letters, digits, '_', '.' or '-'"},
    )
    group = s.post("/webhooks/console/console", console_msg(scene="group", group_id="lobby\n"))
    assert group.status_code == 400
    stream = httpx.get(s.url + "/console/api/stream", params={"user": "a\n"}, timeout=30)
    assert (stream.status_code, stream.json()) == (
        400,
        {"error": "user and group must be 1-32 letters, digits, '_', '.' or '-'"},
    )
    steer = s.post("/console/api/steer", {"user": "admin\n", "session_key": CONSOLE_KEY, "text": "t"})
    assert (steer.status_code, steer.json()) == (
        400,
        {"error": "`user` must be 1-32 letters, digits, '_', '.' or '-'"},
    )
    assert (s.runtime.calls, s.runtime.taken) == ([], [])
    ok = s.post("/webhooks/console/console", console_msg(user="admin"))
    assert (ok.status_code, ok.json()) == (200, {"status": "accepted"})


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (DEEP, "nested too deeply"),
        (json.dumps(console_msg(time_ms=10**30)).encode(), r"'time_ms' must be an integer in \[0, "),
        (json.dumps(console_msg(time_ms=-1)).encode(), r"'time_ms' must be an integer in \[0, "),
        (json.dumps(console_msg(time_ms=True)).encode(), r"'time_ms' must be an integer in \[0, "),
        (json.dumps(console_msg(text="aX")).replace("X", "\\ud800").encode(), "'text' is not valid Unicode"),
        (json.dumps(console_msg(message_id="cX")).replace("X", "\\ud800").encode(), "'message_id' must be"),
        (json.dumps(console_msg(message_id="c" * 129)).encode(), "at most 128 characters"),
        (json.dumps(console_msg(user="admin\n")).encode(), "'user' must be"),
    ],
)
def test_codec_refuses_what_cannot_be_stored(body: bytes, match: str) -> None:
    with pytest.raises(MalformedEvent, match=match):
        ConsoleCodec().parse({}, body)


def test_codec_keeps_valid_edge_values() -> None:
    last = MAX_EVENT_TIME_MS - 1
    msg = ConsoleCodec().parse({}, json.dumps(console_msg(time_ms=last, message_id="c" * 128)).encode())
    assert msg is not None and (msg.time_ms, msg.message_id) == (last, "c" * 128)


def test_one_time_limit_for_every_codec() -> None:
    """docs/decisions.md#platform-strict-boundary: the console's Unix ms and OneBot/Telegram's Unix
    seconds end at the same instant, :data:`MAX_EVENT_TIME_MS` (2**32 s)."""
    assert MAX_EVENT_TIME_MS == 2**32 * 1000
    with pytest.raises(MalformedEvent, match=rf"'time_ms' must be an integer in \[0, {MAX_EVENT_TIME_MS}\)"):
        ConsoleCodec().parse({}, json.dumps(console_msg(time_ms=MAX_EVENT_TIME_MS)).encode())
    assert epoch_ms(2**32 - 1, "time", "OneBot") == MAX_EVENT_TIME_MS - 1000
    with pytest.raises(MalformedEvent, match=r"time must be within 0..2\*\*32 Unix seconds"):
        epoch_ms(2**32, "time", "OneBot")


# --------------------------------------------------------------------------- console.js links


def test_browser_never_links_a_non_http_url(s: Served) -> None:
    """A delivered share / file with javascript:, data: or file: URLs is shown as text, never a link
    or a media source; an https share stays a link."""
    from playwright.sync_api import sync_playwright

    segments = [
        {"type": "share", "data": {"url": "javascript:alert(1)", "title": "click"}},
        {"type": "share", "data": {"url": "data:text/html,<script>alert(1)</script>", "title": "d"}},
        {"type": "file", "data": {"media": {"kind": "url", "value": "javascript:alert(2)"}}},
        {"type": "image", "data": {"media": {"kind": "url", "value": "file:///etc/passwd"}}},
        {"type": "share", "data": {"url": "https://example.com/x", "title": "ok"}},
    ]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page()
            page.goto(f"{s.url}/console")
            page.wait_for_selector('[data-testid=connect][data-ready="1"]')
            page.fill("[data-testid=user]", "linkcheck")
            page.click("[data-testid=connect]")
            page.wait_for_function("document.getElementById('status').textContent.startsWith('connected')")
            body = {
                "bot_id": "console",
                "scene_type": "private",
                "scene_id": "linkcheck",
                "segments": segments,
            }
            assert (
                s.post("/console/api/deliver", body, headers={API_TOKEN_HEADER: API_TOKEN}).status_code == 200
            )
            page.wait_for_selector("[data-testid=reply]")
            hrefs = page.eval_on_selector_all("[data-testid=reply] a", "els => els.map(a => a.href)")
            srcs = page.eval_on_selector_all("[data-testid=reply] [src]", "els => els.map(e => e.src)")
            text = page.text_content("[data-testid=reply]")
        finally:
            browser.close()
    assert (hrefs, srcs) == (["https://example.com/x"], [])
    assert text == (
        "console🔗 click <javascript:alert(1)>🔗 d <data:text/html,<script>alert(1)</script>>"
        "[file javascript:alert(2)][image file:///etc/passwd]🔗 ok"
    )


MISSING_TOKEN = (
    f"environment variable {API_TOKEN_ENV} is not set: a console bot is configured, and its internal "
    "endpoints (/console/api/deliver, /console/api/events) need one shared token in the ingress and in "
    "every Ray worker. `sessionray serve` generates it; anywhere else (Ray Serve, a cluster) set "
    f"{API_TOKEN_ENV} to the same random value on every node, e.g. `openssl rand -hex 24`"
)


def test_console_routes_refuse_to_start_without_the_api_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review S3 #7: outside ``sessionray serve`` (which sets the variable before it builds the
    app) a console without the shared token fails at start, naming the variable, and makes up no
    token of its own; without a console bot nothing is needed."""
    from actors.http.console import console_routes

    monkeypatch.delenv(API_TOKEN_ENV, raising=False)
    with pytest.raises(ValueError) as err:
        console_routes(ControlRuntime(), Config(bots=[BotConfig(platform="console")]))
    assert (str(err.value), os.environ.get(API_TOKEN_ENV)) == (MISSING_TOKEN, None)
    onebot = BotConfig(platform="onebot11", self_id="10001", api_base="http://127.0.0.1:9")
    assert console_routes(ControlRuntime(), Config(bots=[onebot])) == []
    monkeypatch.setenv(API_TOKEN_ENV, "set-by-the-operator")
    assert len(console_routes(ControlRuntime(), Config(bots=[BotConfig(platform="console")]))) == 12


def test_serve_replica_refuses_to_start_without_the_api_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Ray Serve replica (``actors/serve/app.py``) checks before it starts anything."""
    from actors.serve.app import SessionrayIngress

    replica_class = SessionrayIngress.func_or_class.__bases__[0]  # ours, under Serve's ASGI wrapper
    assert replica_class.__qualname__ == "SessionrayIngress"
    config_file = tmp_path / "sessionray.yaml"
    config_file.write_text("bots: [{platform: console}]\n")
    monkeypatch.delenv(API_TOKEN_ENV, raising=False)
    with pytest.raises(ValueError) as err:
        replica_class(str(config_file))
    assert str(err.value) == MISSING_TOKEN
    monkeypatch.setenv(API_TOKEN_ENV, "set-by-the-operator")
    replica = replica_class(str(config_file))
    assert ([b.platform for b in replica.config.bots], replica.runtime) == (["console"], None)

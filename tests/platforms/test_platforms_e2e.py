"""End to end on a real local Ray: each fixture event POSTed to the running ingress, answered by the
scripted faux model, delivered to the platform API stand-in — exact API calls and bodies, and the
transcripts (one inbound and one outbound row per answered message)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import httpx
import pytest

from tests.actors.session_support import eventually
from tests.platforms.e2e_support import (
    ENV,
    ONEBOT_BOT,
    ONEBOT_CQ_BOT,
    TG_BOT,
    TG_TOKEN,
    Stack,
    onebot_headers,
    requests_to,
    running_stack,
    telegram_headers,
)

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def stack(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("e2e"), fixtures_dir) as s:
        yield s


async def post(stack: Stack, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=30) as client:
        return await client.post(path, content=body, headers=headers)


def text_msg(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "data": {"text": text}}]


PREFIX = "[sender:id=200000002 name= roles=owner,master]"
"""How the group sender prefix shows the fixture's sender to the model (its nickname U+3000 is
whitespace: the memory layer shows an empty name)."""
AUTH = f"Bearer {ENV['SR_E2E_ONEBOT_TOKEN']}"


# --------------------------------------------------------------------------- OneBot v11


async def test_onebot_private_array(stack: Stack, load: Any) -> None:
    body = load("onebot11/event_private_message_array.json")
    resp = await post(stack, f"/webhooks/onebot11/{ONEBOT_BOT}", body, onebot_headers(body))
    assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})
    sent = await eventually(
        lambda: requests_to(stack.api, "/send_private_msg", user_id=200000002), 60, "reply"
    )
    assert sent == [{"user_id": 200000002, "message": text_msg("re: 33")}]
    rec = next(
        r for r in stack.api.requests if r.path == "/send_private_msg" and r.json["user_id"] == 200000002
    )
    assert rec.headers["authorization"] == AUTH
    rows = await eventually(
        lambda: _two(stack.scene("onebot11", ONEBOT_BOT, "200000002")), 30, "outbound transcript"
    )
    assert rows == [("inbound", "33"), ("outbound", "re: 33")]


async def _two(coro: Any) -> Any:
    rows = await coro
    return rows if len(rows) >= 2 else None


async def test_onebot_group_untriggered_then_mentioned(stack: Stack, load_json: Any) -> None:
    event = load_json("onebot11/event_group_message_array.json")
    body = json.dumps(event).encode()
    resp = await post(stack, f"/webhooks/onebot11/{ONEBOT_BOT}", body, onebot_headers(body))
    assert (resp.status_code, resp.json()) == (200, {"status": "untriggered"})
    # the same group, now with an `at` of the bot (a new message id)
    at = {
        **event,
        "message_id": 70440312,
        "message": [{"type": "at", "data": {"qq": ONEBOT_BOT}}, *event["message"]],
    }
    body = json.dumps(at).encode()
    resp = await post(stack, f"/webhooks/onebot11/{ONEBOT_BOT}", body, onebot_headers(body))
    assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})
    sent = await eventually(
        lambda: requests_to(stack.api, "/send_group_msg", group_id=300000003), 60, "reply"
    )
    # the answered message is quoted; the scripted model sees the group sender prefix
    assert sent == [
        {
            "group_id": 300000003,
            "message": [
                {"type": "reply", "data": {"id": "70440312"}},
                *text_msg(f"re: {PREFIX} @1000000001 3"),
            ],
        }
    ]
    rows = await eventually(
        lambda: _n(stack.scene("onebot11", ONEBOT_BOT, "300000003"), 3), 30, "outbound transcript"
    )
    assert [d for d, _ in rows] == ["inbound", "inbound", "outbound"]
    assert rows == [
        ("inbound", "3"),
        ("inbound", "@1000000001 3"),
        ("outbound", f"re: {PREFIX} @1000000001 3"),
    ]


async def _n(coro: Any, n: int) -> Any:
    rows = await coro
    return rows if len(rows) >= n else None


async def test_onebot_cq_string_and_failed_retcode(stack: Stack, load: Any) -> None:
    """The go-cqhttp doc event (CQ string); the platform answers retcode 1404: a failed send with
    the platform's wording, not retried, and no outbound transcript row."""
    stack.api.fail_retcode("/send_private_msg")
    try:
        body = load("onebot11/event_private_message_cqstring.json")
        resp = await post(stack, f"/webhooks/onebot11/{ONEBOT_CQ_BOT}", body, onebot_headers(body))
        assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})
        sent = await eventually(
            lambda: requests_to(stack.api, "/send_private_msg", user_id=12345678), 60, "send"
        )
        assert sent == [{"user_id": 12345678, "message": text_msg("re: 你好～")}]
        rows = await stack.scene("onebot11", ONEBOT_CQ_BOT, "12345678")
        assert rows == [("inbound", "你好～")]
    finally:
        stack.api.reset_scripts()


@pytest.mark.parametrize("name", ["event_meta_heartbeat.json", "event_notice_friend_recall.json"])
async def test_onebot_meta_and_notice_ignored(stack: Stack, load: Any, name: str) -> None:
    body = load(f"onebot11/{name}")
    before = len(stack.api.requests)
    resp = await post(stack, f"/webhooks/onebot11/{ONEBOT_BOT}", body, onebot_headers(body))
    assert (resp.status_code, resp.json()) == (200, {"status": "ignored"})
    assert len(stack.api.requests) == before
    assert await stack.scene("onebot11", ONEBOT_BOT, ONEBOT_BOT) == []


async def test_bad_signature_401_and_nothing_stored(stack: Stack, load_json: Any) -> None:
    event = {**load_json("onebot11/event_private_message_array.json"), "user_id": 200000077, "message_id": 1}
    body = json.dumps(event).encode()
    resp = await post(stack, f"/webhooks/onebot11/{ONEBOT_BOT}", body, {"X-Signature": "sha1=" + "0" * 40})
    assert resp.status_code == 401
    assert resp.json() == {"error": "bad signature: X-Signature does not match the body"}
    resp = await post(stack, f"/webhooks/telegram/{TG_BOT}", b"{}", {"X-Telegram-Bot-Api-Secret-Token": "x"})
    assert resp.status_code == 401
    assert await stack.scene("onebot11", ONEBOT_BOT, "200000077") == []


async def test_malformed_400_and_nothing_stored(stack: Stack) -> None:
    body = b'{"post_type": "message", "message_type": "private", "user_id": 200000088'
    resp = await post(stack, f"/webhooks/onebot11/{ONEBOT_BOT}", body, onebot_headers(body))
    assert resp.status_code == 400
    assert resp.json()["error"].startswith("malformed event: OneBot event is not valid JSON")
    body = b'{"update_id": 3, "message": {"message_id": 5, "date": 1, "chat": {"id": 200000088}}}'
    resp = await post(stack, f"/webhooks/telegram/{TG_BOT}", body, telegram_headers())
    assert (resp.status_code, resp.json()) == (
        400,
        {"error": "malformed event: Telegram message lacks chat {id, type}"},
    )
    assert await stack.scene("onebot11", ONEBOT_BOT, "200000088") == []
    assert await stack.scene("telegram", TG_BOT, "200000088") == []


# --------------------------------------------------------------------------- Telegram

TG_SEND = f"/bot{TG_TOKEN}/sendMessage"


async def test_telegram_private_text(stack: Stack, load: Any) -> None:
    body = load("telegram/update_private_text.json")
    resp = await post(stack, f"/webhooks/telegram/{TG_BOT}", body, telegram_headers())
    assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})
    sent = await eventually(lambda: requests_to(stack.api, TG_SEND, chat_id=1111111), 60, "reply")
    assert sent == [{"chat_id": 1111111, "text": "re: /start", "parse_mode": "HTML"}]
    rows = await eventually(
        lambda: _two(stack.scene("telegram", TG_BOT, "1111111")), 30, "outbound transcript"
    )
    assert rows == [("inbound", "/start"), ("outbound", "re: /start")]


async def test_telegram_supergroup_command_reply(stack: Stack, load: Any) -> None:
    body = load("telegram/update_supergroup_reply_bot_command.json")
    resp = await post(stack, f"/webhooks/telegram/{TG_BOT}", body, telegram_headers())
    assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})
    sent = await eventually(lambda: requests_to(stack.api, TG_SEND, chat_id=-1001293752024), 60, "reply")
    assert len(sent) == 1
    assert sent[0]["reply_parameters"] == {"message_id": 134546}
    assert sent[0]["parse_mode"] == "HTML" and sent[0]["text"].startswith("re: ")
    rows = await eventually(
        lambda: _two(stack.scene("telegram", TG_BOT, "-1001293752024")), 30, "outbound transcript"
    )
    assert [d for d, _ in rows] == ["inbound", "outbound"] and rows[0] == ("inbound", "/report")


async def test_telegram_photo_caption_with_429_retry_after(stack: Stack, load_json: Any) -> None:
    """The first send is answered 429 with ``retry_after: 1``; the delivery waits and resends."""
    update = {"update_id": 7, "message": load_json("telegram/message_photo_caption.json")}
    stack.api.fail_next(1, 429, retry_after=1)
    resp = await post(stack, f"/webhooks/telegram/{TG_BOT}", json.dumps(update).encode(), telegram_headers())
    assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})
    photo = load_json("telegram/message_photo_caption.json")["photo"][-1]["file_id"]  # the largest size
    # the scripted model echoes what it read: the caption, then the photo's line
    # (docs/decisions.md#platform-placeholders)
    text = f"re: www.example.com\n[image file={photo}]"
    expected = {"chat_id": 10000001, "text": text, "parse_mode": "HTML"}
    sent = await eventually(
        lambda: (
            len(requests_to(stack.api, TG_SEND, chat_id=10000001)) >= 2
            and requests_to(stack.api, TG_SEND, chat_id=10000001)
        ),
        60,
        "two sends",
    )
    assert sent == [expected, expected]
    rows = await eventually(
        lambda: _two(stack.scene("telegram", TG_BOT, "10000001")), 30, "outbound transcript"
    )
    assert rows == [("inbound", "www.example.com"), ("outbound", text)]


# --------------------------------------------------------------------------- console in a browser

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def internal_headers() -> dict[str, str]:
    """What DeliveryActors and console sessions send to the internal /console/api/deliver and /events."""
    from runtime.platforms.console import API_TOKEN_HEADER, console_api_token

    return {API_TOKEN_HEADER: console_api_token() or ""}


PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


async def test_console_in_chromium(stack: Stack) -> None:
    """Open /console, chat, see the reply and a multi-segment reply rendered, steer as master."""
    from playwright.async_api import async_playwright, expect

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = await browser.new_page()
            await page.goto(f"{stack.base_url}/console")
            await page.wait_for_selector('[data-testid=connect][data-ready="1"]')
            await page.fill("[data-testid=user]", "admin")
            await page.fill("[data-testid=master-token]", ENV["SR_E2E_CONSOLE_MASTER"])
            await page.click("[data-testid=connect]")
            await expect(page.get_by_test_id("status")).to_have_text("connected as admin")
            await expect(page.get_by_test_id("control-key")).to_have_value("console:console:private:admin")

            # a message and its reply, delivered through the console platform API
            await page.fill("[data-testid=text]", "hello browser")
            await page.press("[data-testid=text]", "Enter")
            await expect(page.get_by_test_id("mine")).to_have_text(["adminhello browser"])
            await expect(page.get_by_test_id("reply")).to_have_text(
                ["consolere: hello browser"], timeout=60_000
            )

            # segment-by-segment rendering: what a DeliveryActor POSTs for a richer reply
            segments = [
                {"type": "text", "data": {"text": "see "}},
                {"type": "mention", "data": {"target": "admin"}},
                {"type": "image", "data": {"media": {"kind": "base64", "value": PNG_B64}}},
                {"type": "share", "data": {"url": "https://example.com/", "title": "Example"}},
            ]
            async with httpx.AsyncClient(base_url=stack.base_url) as client:
                resp = await client.post(
                    "/console/api/deliver",
                    json={
                        "bot_id": "console",
                        "scene_type": "private",
                        "scene_id": "admin",
                        "reply_to": None,
                        "segments": segments,
                    },
                    headers=internal_headers(),
                )
            assert resp.status_code == 200 and resp.json()["ok"] is True
            reply = page.get_by_test_id("reply").nth(1)
            await expect(reply).to_have_text("consolesee @admin🔗 Example")
            await expect(reply.get_by_test_id("mention")).to_have_class("mention me")
            await expect(reply.get_by_test_id("image")).to_have_attribute(
                "src", f"data:image/*;base64,{PNG_B64}"
            )
            assert await reply.get_by_test_id("image").evaluate("img => img.naturalWidth") == 1

            # live agent events (what a session posts to /console/api/events)
            async with httpx.AsyncClient(base_url=stack.base_url) as client:
                for event in (
                    {"type": "tool_call", "name": "clock", "args": {"tz": "UTC"}},
                    {"type": "notice", "text": "format corrected"},
                ):
                    body = {"session_key": "console:console:private:admin", "event": event}
                    answer = await client.post("/console/api/events", json=body, headers=internal_headers())
                    assert answer.json() == {
                        "ok": True,
                        "receivers": 1,
                    }
            await expect(page.get_by_test_id("agent-event")).to_have_text(
                ['🔧 clock({"tz":"UTC"})', "⚠ format corrected"]
            )

            # live sessions list (loaded and refreshed on its own)
            await expect(
                page.get_by_test_id("session").filter(has_text="console:console:private:admin")
            ).to_have_count(1)

            # steer as master while the scripted tool runs
            await page.fill("[data-testid=text]", "slow 2")
            await page.press("[data-testid=text]", "Enter")
            await eventually(lambda: stack.tool_starts() >= 1, 60, "the slow tool to start")
            await page.fill("[data-testid=control-text]", "answer in French")
            await page.click("[data-testid=steer]")
            await expect(page.get_by_test_id("control-result")).to_have_text("steer: steered")
            await expect(page.get_by_test_id("reply").nth(2)).to_have_text(
                "consoletool: slept 2; then: ['answer in French']", timeout=60_000
            )
            # the session's own live events of that turn: the tool call and its outcome
            await expect(page.get_by_test_id("agent-event")).to_have_text(
                ['🔧 clock({"tz":"UTC"})', "⚠ format corrected", '🔧 sleep({"seconds":2})', "✓ sleep"]
            )
            await expect(page.get_by_test_id("tool-result")).to_have_text(["slept 2"])
        finally:
            await browser.close()

    # a console user who is not a master is refused
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        resp = await client.post(
            "/console/api/steer",
            json={"user": "bob", "session_key": "console:console:private:admin", "text": "hi"},
        )
    assert (resp.status_code, resp.json()) == (
        403,
        {"error": "'bob' is not a master of console bot 'console'; only masters may steer"},
    )
    rows = await stack.scene("console", "console", "admin")
    assert [d for d, _ in rows] == ["inbound", "outbound", "inbound", "outbound"]


async def test_console_event_stream_fans_out_by_scene(stack: Stack) -> None:
    """A group member's SSE stream gets the group's echoes, replies and agent events, not others'."""
    received: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(base_url=stack.base_url, timeout=30) as client,
        client.stream("GET", "/console/api/stream", params={"user": "carol", "group": "lobby"}) as stream,
    ):
        lines = stream.aiter_lines()
        assert await anext(lines) == ": connected"
        posts = [
            ("/console/api/deliver", {"scene_type": "private", "scene_id": "dave", "segments": []}),
            (
                "/console/api/echo",
                {"user": "erin", "group_id": "lobby", "text": "hi all", "message_id": "c-9"},
            ),
            (
                "/console/api/events",
                {
                    "session_key": "console:console:group:lobby",
                    "event": {"type": "status", "text": "thinking…"},
                },
            ),
            (
                "/console/api/deliver",
                {
                    "bot_id": "console",
                    "scene_type": "group",
                    "scene_id": "lobby",
                    "reply_to": "c-9",
                    "segments": text_msg("hello"),
                },
            ),
        ]
        answers = [
            (await client.post(path, json=body, headers=internal_headers())).json() for path, body in posts
        ]
        assert answers[1:3] == [{"ok": True, "receivers": 1}, {"ok": True, "receivers": 1}]
        assert answers[0]["ok"] is True and answers[3]["ok"] is True
        async for line in lines:
            if line.startswith("data: "):
                received.append(json.loads(line[6:]))
            if len(received) == 3:
                break
    assert received == [
        {
            "type": "message",
            "scene_type": "group",
            "scene_id": "lobby",
            "user": "erin",
            "text": "hi all",
            "message_id": "c-9",
        },
        {
            "type": "agent",
            "session_key": "console:console:group:lobby",
            "event": {"type": "status", "text": "thinking…"},
        },
        {
            "type": "reply",
            "scene_type": "group",
            "scene_id": "lobby",
            "message_id": answers[3]["message_id"],
            "bot_id": "console",
            "reply_to": "c-9",
            "segments": text_msg("hello"),
        },
    ]
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        bad = await client.post(
            "/console/api/deliver",
            json={"scene_type": "private", "scene_id": "x"},
            headers=internal_headers(),
        )
        assert (bad.status_code, bad.json()) == (400, {"error": "deliver needs a segments array"})
        bad = await client.get("/console/api/stream", params={"user": "not ok"})
        assert bad.status_code == 400


async def test_console_session_posts_live_tool_events(stack: Stack) -> None:
    """A console turn with one tool call: the session posts the tool's start and end and the
    validated reply's preview to /console/api/events, and the user's SSE stream carries them next
    to the reply."""
    received: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client,
        client.stream("GET", "/console/api/stream", params={"user": "frank"}) as stream,
    ):
        lines = stream.aiter_lines()
        assert await anext(lines) == ": connected"
        body = {"message_id": "c-frank-1", "user": "frank", "text": "slow 0", "time_ms": 1767000000000}
        resp = await client.post("/webhooks/console/console", json=body)
        assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})

        async def collect() -> None:
            async for line in lines:
                if line.startswith("data: "):
                    received.append(json.loads(line[6:]))
                if len(received) == 4:
                    return

        try:
            await asyncio.wait_for(collect(), 60)  # bound: keepalives would otherwise wait forever
        except TimeoutError:
            pytest.fail(f"expected 3 agent events and a reply on the stream, got {received}")
    agent = [e for e in received if e["type"] == "agent"]
    replies = [e for e in received if e["type"] == "reply"]
    assert agent == [
        {
            "type": "agent",
            "session_key": "console:console:private:frank",
            "event": {"type": "tool_call", "name": "sleep", "args": {"seconds": 0.0}},
        },
        {
            "type": "agent",
            "session_key": "console:console:private:frank",
            "event": {"type": "tool_result", "name": "sleep", "is_error": False, "result": "slept 0"},
        },
        {  # the completed-reply line: the validated reply's preview (docs/decisions.md#reply-final-output)
            "type": "agent",
            "session_key": "console:console:private:frank",
            "event": {
                "type": "reply_preview",
                "text": "tool: slept 0; then: []",
                "outcome": ANY,
                "tier": ANY,
            },
        },
    ]
    assert [(r["scene_id"], r["reply_to"], r["segments"]) for r in replies] == [
        ("frank", "c-frank-1", text_msg("tool: slept 0; then: []"))
    ]


async def test_terminal_chat_is_a_client_of_the_console_platform(stack: Stack) -> None:
    """`sessionray chat --url …` (actors.cli.console_client): a line goes through the ingress and the
    runtime like a browser message, and the reply comes back on the console event stream."""
    from actors.cli.console_client import build_parser, run_console_chat

    out: list[str] = []
    replied = asyncio.Event()

    def write(line: str) -> None:
        out.append(line)
        if line.startswith("bot> "):
            replied.set()

    async def lines() -> AsyncIterator[str]:
        yield "hello terminal\n"
        await asyncio.wait_for(replied.wait(), 60)  # bounded: a regression fails, never hangs
        yield "/quit\n"

    code = await run_console_chat(stack.base_url, "tess", lines(), write)
    assert code == 0
    assert out[0] == f"connected to {stack.base_url} as tess (console:console:private:tess); /quit to leave"
    assert [line for line in out if line.startswith("bot> ")] == ["bot> re: hello terminal"]
    assert build_parser().parse_args(["--url", "http://x"]).user == "admin"


async def test_terminal_chat_piped_input_waits_for_replies_and_answers_help_itself(stack: Stack) -> None:
    """Piped input (every line available at once, then end of input): ``/help`` is answered by the
    client (not sent: no ``re: /help``), each message's reply is printed before the next line is
    read and before the chat ends, and the agent's tool events print as the standalone chat
    prints them (actors.cli.chat.tool_call_line / tool_result_line)."""
    from actors.cli.chat import tool_call_line, tool_result_line
    from actors.cli.console_client import HELP, run_console_chat

    out: list[str] = []

    async def piped() -> AsyncIterator[str]:
        for line in ("/help\n", "slow 0\n", "hello pipe\n"):
            yield line

    code = await run_console_chat(stack.base_url, "pia", piped(), out.append, wait_replies=True)
    assert code == 0
    assert out[1] == HELP and "/steer TEXT" in HELP and "/followup TEXT" in HELP
    assert [line for line in out if line.startswith("bot> ")] == [
        "bot> tool: slept 0; then: []",
        "bot> re: hello pipe",
    ]
    assert tool_call_line("sleep", {"seconds": 0.0}) in out
    assert tool_result_line("sleep", "slept 0") in out
    assert not any(line.startswith("[agent ") for line in out)


async def test_terminal_chat_bad_input_gets_a_clear_error(stack: Stack) -> None:
    """A name that cannot form a session key stops before any request; a control answer that is not
    JSON is shown, not raised."""
    from actors.cli.console_client import run_console_chat

    out: list[str] = []

    async def no_lines() -> AsyncIterator[str]:
        return
        yield ""

    assert await run_console_chat(stack.base_url, "", no_lines(), out.append) == 2
    assert out and out[0].startswith("error: ")
    out.clear()

    async def steer_unknown() -> AsyncIterator[str]:
        yield "/steer hello\n"
        yield "/quit\n"

    assert await run_console_chat(stack.base_url, "admin", steer_unknown(), out.append) == 0
    steer_lines = [line for line in out if line.startswith("[steer: ")]
    assert len(steer_lines) == 1 and steer_lines[0] != "[steer: None]"

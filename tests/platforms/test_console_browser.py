"""The web console in real Chromium at 390, 768 and 1280 px: login first, then the chat; the
``hidden`` attribute respected; long words and URLs wrap (no horizontal scrolling); list markers
not cut off; a new login starts a new view; the conversation comes back from SQL on
reload (own scene only, leak-checked); tool calls show their arguments and results; live sessions
and master controls for masters only; a favicon.

Layout is asserted on element boxes, visibility and the document's scroll size — never pixels.
The server side is real (:mod:`tests.platforms.console_browser_support`): the ingress app over
loopback, SQLite transcripts, replies sent by the real delivery core through the console codec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from actors.http.console import ConsoleHub, console_routes
from actors.http.console_history import HISTORY_LIMIT
from runtime.config import Config
from runtime.memory.db import Database
from runtime.memory.transcripts import TranscriptStore
from tests.actors.edge_support import serve_in_thread
from tests.platforms.console_browser_support import (
    API_TOKEN,
    HEIGHT,
    LIVE_KEYS,
    MASTER_TOKEN,
    PROOF,
    WIDTHS,
    Console,
    EchoRuntime,
    box,
    chromium,
    clipped_lists,
    expect,
    in_own_loop,
    log_texts,
    login,
    open_console,
    overflow,
    running_console,
    say,
    shown_despite_hidden,
    wait_connected,
)

LONG_URL = "https://example.com/" + "a" * 260  # 280 characters, no place to break
OpenPage = Callable[[int], Any]


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    with running_console(tmp_path_factory.mktemp("console-browser")) as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def open_page(browser: Any, console: Console) -> Iterator[OpenPage]:
    """``open_page(width)`` → a fresh console tab; every tab is closed after the test."""
    pages: list[Any] = []

    def opener(width: int) -> Any:
        page = open_console(browser, console.url, width)
        page.set_default_timeout(20_000)
        pages.append(page)
        return page

    yield opener
    for page in pages:
        page.context.close()


def visible(page: Any, testid: str) -> bool:
    return bool(page.get_by_test_id(testid).is_visible())


def replies(page: Any, n: int) -> None:
    """Wait until the log shows ``n`` bot replies."""
    page.wait_for_function("n => document.querySelectorAll('[data-testid=reply]').length >= n", arg=n)


def history_loaded(page: Any) -> None:
    page.wait_for_selector("[data-testid=log][data-history=loaded]", state="attached")


def role_known(page: Any) -> str:
    page.wait_for_selector("[data-testid=chat][data-role]", state="attached")
    return str(page.get_by_test_id("chat").get_attribute("data-role"))


# --------------------------------------------------------------------------- layout


@pytest.mark.parametrize("width", WIDTHS)
def test_login_first_then_chat(open_page: OpenPage, width: int) -> None:
    """Before login only the login card shows (no chat pane, no side panels, no token field when
    none is needed); after "Start chatting" the card is gone and the chat fills the first screen
    right below the header."""
    page = open_page(width)
    assert visible(page, "login")
    assert [visible(page, t) for t in ("chat", "master-panel", "token-label", "logout")] == [False] * 4
    assert shown_despite_hidden(page) == []
    card = box(page, "[data-testid=login]")
    assert card["x"] >= 0 and card["x"] + card["width"] <= width
    dims = overflow(page)
    assert dims["scrollWidth"] <= dims["innerWidth"] == width

    login(page, f"viewer{width}")
    assert role_known(page) == "user"
    shown = [visible(page, t) for t in ("login", "chat", "logout", "master-panel")]
    assert shown == [False, True, True, False]
    assert shown_despite_hidden(page) == []
    header, chat = box(page, "header"), box(page, "#conversation")
    composer = box(page, "[data-testid=composer]")
    assert header["y"] + header["height"] <= chat["y"] <= header["y"] + header["height"] + 40
    assert chat["x"] >= 0 and chat["x"] + chat["width"] <= width
    assert composer["y"] + composer["height"] <= HEIGHT  # typing needs no scrolling
    dims = overflow(page)
    assert dims["scrollWidth"] <= width and dims["scrollHeight"] <= HEIGHT, dims


@pytest.mark.parametrize("width", WIDTHS)
def test_list_markers_are_not_clipped(console: Console, open_page: OpenPage, width: int) -> None:
    """No shown list puts its numbers or bullets outside the room its padding gives them."""
    page = open_page(width)
    login(page, "admin", master_token=MASTER_TOKEN)
    console.event("console:console:private:admin", {"type": "status", "text": "thinking…"})
    page.wait_for_selector("[data-testid=agent-event]")
    page.wait_for_selector("[data-testid=session]")
    assert clipped_lists(page) == []


@pytest.mark.parametrize("width", WIDTHS)
def test_long_words_and_urls_wrap(console: Console, open_page: OpenPage, width: int) -> None:
    """A 280-character URL in a message, a reply, tool arguments and a tool result wraps inside
    the chat: the document is never wider than the viewport."""
    page = open_page(width)
    user = f"wrap{width}"
    login(page, user)
    say(page, "look at " + LONG_URL)
    replies(page, 1)
    key = f"console:console:private:{user}"
    console.event(key, {"type": "tool_call", "name": "fetch", "args": {"url": LONG_URL}})
    console.event(key, {"type": "tool_result", "name": "fetch", "is_error": False, "result": LONG_URL})
    console.event(key, {"type": "notice", "text": "x" * 300})
    page.wait_for_function("document.querySelectorAll('[data-testid=agent-event]').length === 3")
    for summary in page.locator("summary").all():
        summary.click()
    dims = overflow(page)
    assert dims["scrollWidth"] <= dims["innerWidth"] == width, dims
    chat_log = box(page, "[data-testid=log]")
    rights = page.eval_on_selector_all(
        "[data-testid=log] > li", "els => els.map(e => e.getBoundingClientRect().right)"
    )
    assert len(rights) == 5 and max(rights) <= chat_log["x"] + chat_log["width"]


# --------------------------------------------------------------------------- views and history


def test_switching_user_starts_a_new_view(console: Console, open_page: OpenPage) -> None:
    """Log out, log in as someone else: the previous user's log is gone and stays gone."""
    page = open_page(768)
    login(page, "switch_a")
    say(page, "hello from a")
    replies(page, 1)
    assert log_texts(page) == ["switch_ahello from a", "consolere: hello from a"]

    page.get_by_test_id("logout").click()
    assert [visible(page, t) for t in ("login", "chat", "logout")] == [True, False, False]
    assert page.get_by_test_id("status").text_content() == "not connected"
    login(page, "switch_b")
    history_loaded(page)
    assert log_texts(page) == []
    say(page, "hi")
    replies(page, 1)
    assert log_texts(page) == ["switch_bhi", "consolere: hi"]


def test_history_reloads_from_sql(console: Console, open_page: OpenPage) -> None:
    """A reload (or another tab) shows the stored conversation again, each message once, in order;
    another user sees none of it."""
    page = open_page(1280)
    login(page, "hist")
    say(page, "first")
    replies(page, 1)
    say(page, "second")
    replies(page, 2)
    expected = ["histfirst", "consolere: first", "histsecond", "consolere: second"]
    assert log_texts(page) == expected

    page.reload()
    wait_connected(page, "hist")  # this tab's login resumes
    history_loaded(page)
    assert log_texts(page) == expected

    other = open_page(390)
    login(other, "hist")
    history_loaded(other)
    assert log_texts(other) == expected
    other.get_by_test_id("logout").click()
    login(other, "snoop")
    history_loaded(other)
    assert log_texts(other) == []

    stored = console.get("/console/api/history", user="hist").json()["messages"]
    assert [(m["direction"], m["sender_id"], m["text"]) for m in stored] == [
        ("inbound", "hist", "first"),
        ("outbound", "console", "re: first"),
        ("inbound", "hist", "second"),
        ("outbound", "console", "re: second"),
    ]
    assert console.get("/console/api/history", user="snoop").json() == {"messages": []}
    # the group "hist" is another scene than hist's private chat
    group = console.get("/console/api/history", user="x", scene="group", group="hist")
    assert group.json() == {"messages": []}


def test_history_is_the_last_n_messages_and_leak_checked(console: Console, open_page: OpenPage) -> None:
    for i in range(HISTORY_LIMIT + 10):
        console.record(
            direction="inbound", message_id=f"m{i}", platform="console", bot_id="console",
            scene_id="many", scene_type="private", sender_id="many", sender_name="many",
            text=f"m{i}", time_ms=1_767_000_000_000 + i,
        )  # fmt: skip
    console.record(
        direction="outbound", message_id="leak-1", platform="console", bot_id="console",
        scene_id="many", scene_type="private", sender_id="console", sender_role="bot",
        segments=[{"type": "text", "data": {"text": f"token {API_TOKEN}"}},
                  {"type": "image", "data": {"media": {"kind": "path", "value": "/srv/media/x.png"}}}],
        time_ms=1_767_000_001_000,
    )  # fmt: skip
    page = open_page(390)
    login(page, "many")
    history_loaded(page)
    texts = log_texts(page)
    assert len(texts) == HISTORY_LIMIT
    assert texts[0] == "manym11" and texts[-2:] == ["manym59", "consoletoken [redacted][image]"]
    assert API_TOKEN not in page.content()

    few = console.get("/console/api/history", user="many", limit="2").json()["messages"]
    assert [m["message_id"] for m in few] == ["m59", "leak-1"]
    for bad in ({"limit": "0"}, {"limit": "201"}, {"limit": "x"}, {"user": "no such"}, {"scene": "channel"}):
        params = {"user": "many", **bad}
        assert console.get("/console/api/history", **params).status_code == 400, bad


# --------------------------------------------------------------------------- agent events


def test_tool_calls_show_arguments_and_results(console: Console, open_page: OpenPage) -> None:
    """Tool calls and results are collapsible lines with the arguments and the result inside;
    thinking previews and correction notices show; a secret in a result is redacted."""
    page = open_page(390)
    login(page, "tools")
    key = "console:console:private:tools"
    notice = "reply format was invalid; corrected by one extra call (native tier)"
    for event in (
        {"type": "tool_call", "name": "clock", "args": {"tz": "UTC"}},
        {"type": "tool_result", "name": "clock", "is_error": False, "result": "2026-01-01T00:00:00Z"},
        {"type": "thinking", "text": "the user wants the time"},
        {"type": "notice", "text": notice},
        {"type": "tool_result", "name": "env", "is_error": True, "result": f"token={API_TOKEN}"},
    ):
        console.event(key, event)
    page.wait_for_function("document.querySelectorAll('[data-testid=agent-event]').length === 5")
    events = page.get_by_test_id("agent-event")
    assert events.all_text_contents() == [
        '🔧 clock({"tz":"UTC"})',
        "✓ clock",
        "💭 the user wants the time",
        f"⚠ {notice}",
        "✗ env",
    ]
    args, results = page.get_by_test_id("tool-args"), page.get_by_test_id("tool-result")
    assert not args.is_visible() and not results.first.is_visible()  # collapsed until opened
    for summary in page.locator("summary").all():
        summary.click()
    assert args.is_visible() and args.text_content() == '{\n  "tz": "UTC"\n}'
    assert results.all_text_contents() == ["2026-01-01T00:00:00Z", "token=[redacted]"]
    assert API_TOKEN not in page.content()


def test_validated_reply_drives_the_completed_reply_line(console: Console, open_page: OpenPage) -> None:
    """A session's event sink, fed streamed half JSON and then the turn's validated outcome, shows
    one completed-reply line with the reply's preview (not an agent-event line, no half JSON)."""
    from runtime.agent.events import MessageUpdateEvent
    from runtime.llm.events import TextDeltaEvent
    from runtime.llm.types import AssistantMessage, TextContent
    from runtime.reply.im_reply import ReplyOutcome
    from runtime.reply.segments import Reply
    from runtime.session.console_events import ConsoleEventSink

    page = open_page(390)
    login(page, "previewer")
    segments = [
        {"type": "text", "data": {"text": "it is noon "}},
        {"type": "mention", "data": {"target": "previewer"}},
    ]
    reply = Reply.model_validate({"segments": segments})

    async def run_turn() -> None:
        sink = ConsoleEventSink(console.url, "console:console:private:previewer", api_token=API_TOKEN)
        partial = AssistantMessage(content=[TextContent(text='{"segments": [')])
        sink(
            MessageUpdateEvent(message=partial, assistant_message_event=TextDeltaEvent(0, '{"segm', partial))
        )
        sink(ReplyOutcome(reply, "native", "first_try", "raw"))  # type: ignore[arg-type]
        await sink.drained()

    in_own_loop(run_turn())
    summary = page.get_by_test_id("reply-preview")
    expect(summary).to_have_text("✔ reply ready: it is noon @previewer")
    assert page.get_by_test_id("agent-event").count() == 0
    summary.click()
    assert page.get_by_test_id("reply-preview-text").text_content() == "it is noon @previewer"
    assert '{"segm' not in page.content()


# --------------------------------------------------------------------------- master panel


def master_tools_fit(page: Any, width: int) -> None:
    """The live sessions, the steer controls and the chat's composer all lie on the first screen
    (no scrolling: a phone never scrolls past a full-height chat to steer), side by side from
    900 px, the panel above the chat below that; nothing is wider than the viewport."""
    chat, panel = box(page, "#conversation"), box(page, "[data-testid=master-panel]")
    for selector in ("[data-testid=steer]", "[data-testid=control-text]", "[data-testid=composer]"):
        found = box(page, selector)
        assert found["y"] >= 0 and found["y"] + found["height"] <= HEIGHT, (selector, found)
        assert found["x"] >= 0 and found["x"] + found["width"] <= width, (selector, found)
    if width >= 900:
        assert panel["x"] >= chat["x"] + chat["width"] and panel["y"] < chat["y"] + chat["height"]
    else:
        assert panel["y"] + panel["height"] <= chat["y"]
        assert chat["height"] >= 0.45 * HEIGHT  # the chat keeps most of the screen
    dims = overflow(page)
    assert dims["scrollWidth"] <= width and dims["scrollHeight"] <= HEIGHT, dims


@pytest.mark.parametrize("width", WIDTHS)
def test_master_panel_only_for_the_master(console: Console, open_page: OpenPage, width: int) -> None:
    """The master (name and master token) sees the live console sessions of their bot without
    asking (listed on login, then kept fresh) and the controls, on the first screen at every width;
    the master's name without the token gets only a request for the token (unlocking works);
    anyone else sees neither (docs/decisions.md#security-console-master-proof)."""
    page = open_page(width)
    login(page, "carol")
    expect(page.get_by_test_id("master-panel")).to_be_hidden()
    assert role_known(page) == "user"
    page.get_by_test_id("logout").click()
    login(page, "admin", master_token=MASTER_TOKEN)
    assert role_known(page) == "master"
    page.wait_for_selector("[data-testid=session]")  # listed on its own: no ↻ click
    assert (
        visible(page, "master-panel") and visible(page, "master-tools") and not visible(page, "unlock-form")
    )
    assert [s.split(" ")[0] for s in page.get_by_test_id("session").all_text_contents()] == [
        "console:console:private:admin",
        "console:console:group:lobby",
    ]
    master_tools_fit(page, width)

    page.get_by_test_id("logout").click()
    login(page, "admin")  # the name alone
    assert role_known(page) == "locked"
    assert visible(page, "unlock-form") and not visible(page, "master-tools")
    assert page.get_by_test_id("session").count() == 0 and shown_despite_hidden(page) == []
    page.fill("[data-testid=unlock-token]", "wrong")
    page.click("[data-testid=unlock]")
    expect(page.get_by_test_id("unlock-result")).to_have_text("wrong master token")
    assert not visible(page, "master-tools")
    page.fill("[data-testid=unlock-token]", MASTER_TOKEN)
    page.click("[data-testid=unlock]")
    expect(page.get_by_test_id("master-tools")).to_be_visible()
    page.wait_for_selector("[data-testid=session]")
    assert role_known(page) == "master"
    master_tools_fit(page, width)

    page.get_by_test_id("logout").click()
    login(page, "bob", master_token=MASTER_TOKEN)  # the token makes no other name a master
    expect(page.get_by_test_id("master-panel")).to_be_hidden()
    assert role_known(page) == "user"
    assert not visible(page, "master-panel") and shown_despite_hidden(page) == []


def test_live_session_list_follows_the_runtime_without_a_click(console: Console, open_page: OpenPage) -> None:
    """A chat that becomes live after the master logged in appears in the list on its own (the
    page refreshes it; no ↻ click), and one that ends leaves it."""
    console.runtime.live_keys = ()
    try:
        page = open_page(390)
        login(page, "admin", master_token=MASTER_TOKEN)
        assert role_known(page) == "master"
        expect(page.get_by_test_id("sessions")).to_contain_text("no live console session yet")
        console.runtime.live_keys = ("console:console:private:admin",)
        expect(page.get_by_test_id("session")).to_have_count(1, timeout=15_000)  # refreshed every 5 s
        assert page.get_by_test_id("session").text_content().startswith("console:console:private:admin ")
        console.runtime.live_keys = ()
        expect(page.get_by_test_id("session")).to_have_count(0, timeout=15_000)
    finally:
        console.runtime.live_keys = LIVE_KEYS


def test_steer_from_the_page_needs_the_master_token(console: Console, open_page: OpenPage) -> None:
    """A steer sent from the master panel carries the token; a request without it is refused."""
    page = open_page(390)
    login(page, "admin", master_token=MASTER_TOKEN)
    assert role_known(page) == "master"
    body = {"user": "admin", "session_key": "console:console:private:admin", "text": "stop"}
    refused = page.evaluate(
        "async b => (await fetch('/console/api/steer', {method: 'POST', headers: {'Content-Type':"
        " 'application/json'}, body: JSON.stringify(b)})).status", body
    )  # fmt: skip
    assert refused == 403
    page.fill("[data-testid=control-text]", "stop")
    page.click("[data-testid=steer]")
    expect(page.get_by_test_id("control-result")).to_contain_text("steer")
    assert console.runtime.controls[-1] == ("steer", "console:console:private:admin", "stop", "admin")


def test_a_master_token_in_the_link_fills_the_form_and_leaves_the_address_bar(
    browser: Any, console: Console
) -> None:
    """The banner's ``/console#master=…`` link: the token fills the form, then the fragment is
    removed from the address bar and the history entry (it was left there: the admin token by
    default, docs/decisions.md#security-console-master-proof)."""
    page = browser.new_context(viewport={"width": 1280, "height": HEIGHT}).new_page()
    try:
        page.goto(f"{console.url}/console#master={MASTER_TOKEN}")
        page.wait_for_selector('[data-testid=connect][data-ready="1"]')
        assert page.input_value("[data-testid=master-token]") == MASTER_TOKEN
        assert page.url == f"{console.url}/console"
        assert MASTER_TOKEN not in page.evaluate("location.href")
    finally:
        page.context.close()


def test_session_list_api_refuses_non_masters(console: Console) -> None:
    def keys(user: str) -> list[str]:
        answer = console.get("/console/api/sessions", user=user, headers=PROOF)
        assert answer.status_code == 200, answer.text
        return [s["session_key"] for s in answer.json()["sessions"]]

    assert keys("admin") == ["console:console:private:admin", "console:console:group:lobby"]
    assert keys("boss") == ["console:other:private:boss"]
    refused = console.get("/console/api/sessions", user="bob", headers=PROOF)
    assert (refused.status_code, refused.json()) == (
        403,
        {"error": "'bob' is not a master of a console bot; only masters see live sessions"},
    )
    assert console.get("/console/api/sessions", user="admin").status_code == 403  # no master token
    assert console.get("/console/api/sessions", headers=PROOF).status_code == 400
    assert [console.get("/console/api/me", headers=PROOF, **q).json() for q in (
        {"user": "admin"}, {"user": "admin", "bot": "other"}, {"user": "bob"},
    )] == [
        {"user": "admin", "bot": "console", "master": True, "master_name": True},
        {"user": "admin", "bot": "other", "master": False, "master_name": False},
        {"user": "bob", "bot": "console", "master": False, "master_name": False},
    ]  # fmt: skip
    assert console.get("/console/api/me", user="admin").json()["master"] is False
    assert console.get("/console/api/me", user="admin", bot="nope").status_code == 400


# --------------------------------------------------------------------------- favicon, message ids


def test_favicon(console: Console, open_page: OpenPage) -> None:
    resp = console.get("/favicon.ico")
    assert (resp.status_code, resp.headers["content-type"]) == (200, "image/svg+xml")
    page = open_page(390)
    assert page.eval_on_selector("link[rel=icon]", "l => l.href") == console.url + "/favicon.ico"
    size = page.evaluate(
        "async () => { const img = new Image(); img.src = '/favicon.ico'; await img.decode();"
        " return [img.naturalWidth, img.naturalHeight]; }"
    )
    assert size == [32, 32]


def test_reply_ids_stay_unique_across_restarts() -> None:
    """The id of a delivered reply keys its outbound transcript row: a restarted console (a new
    hub) must not hand out an id the last one used, or history loses those replies."""
    before, after = ConsoleHub(), ConsoleHub()
    first = [before.next_message_id() for _ in range(3)]
    assert len(set(first)) == 3
    assert after.next_message_id() not in first


def test_history_answers_503_when_the_store_fails(console: Console, tmp_path: Path) -> None:
    """A database that cannot be read makes the history a 503 the page reports, never a 500."""
    db = Database(f"sqlite:///{tmp_path / 'empty.db'}")  # no tables: every read fails
    app = Starlette(routes=console_routes(EchoRuntime(), Config(), transcripts=TranscriptStore(db)))
    try:
        with serve_in_thread(app) as url:
            resp = httpx.get(url + "/console/api/history", params={"user": "admin"}, timeout=30)
    finally:
        db.dispose()
    assert (resp.status_code, resp.json()) == (503, {"error": "history unavailable, try again"})

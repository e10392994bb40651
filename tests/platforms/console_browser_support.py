"""The web console served for browser tests: the ingress app (``actors.inbound.ingress.build_app``, console
routes mounted as ``sessionray serve`` mounts them) on loopback with a real SQLite store, and a
stand-in runtime that answers every message ``re: <text>`` through the real Ray-free delivery core
(:class:`runtime.delivery.core.DeliverySender`: console codec → ``/console/api/deliver`` →
outbound transcript row), as a DeliveryActor does. Plus Debian's Chromium under Playwright and the
layout probes the tests assert on.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from actors.inbound.ingress import build_app
from actors.placement.runtime import SessionInfo, SubmitResult
from runtime.config import BotConfig, Config, DatabaseConfig
from runtime.delivery.core import DeliveryJob, DeliverySender, DeliverySettings
from runtime.memory.db import Database
from runtime.memory.transcripts import TranscriptStore
from runtime.platforms.base import InboundMessage
from runtime.platforms.console import API_TOKEN_ENV, API_TOKEN_HEADER
from runtime.reply.segments import Reply
from runtime.session.control import ControlReply, ControlRequest
from tests.actors.edge_support import serve_in_thread

API_TOKEN = "console-browser-api-token"
MASTER_ENV = "CONSOLE_BROWSER_MASTER"
MASTER_TOKEN = "console-browser-master-token"
"""The console bots' master token (``master_token_env``): a master name needs it to act."""
PROOF = {"X-Console-Master-Token": MASTER_TOKEN}
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
T = TypeVar("T")
WIDTHS = (390, 768, 1280)
HEIGHT = 800
LIVE_KEYS = (
    "console:console:private:admin",
    "console:console:group:lobby",
    "console:other:private:boss",
    "telegram:1000000077:private:987654321",
)
"""What the stand-in runtime reports as live: two console bots' sessions and another platform's."""


class EchoRuntime:
    """Accepts every message and answers ``re: <text>`` through :attr:`sender` (set once the
    server's URL is known); lists :attr:`live_keys` (default :data:`LIVE_KEYS`); records steer /
    follow-up requests in :attr:`controls` (``(kind, session_key, text, sender_id)``, each answered
    ``steered``)."""

    def __init__(self) -> None:
        self.controls: list[tuple[str, str, str, str]] = []
        self.live_keys: tuple[str, ...] = LIVE_KEYS
        """What :meth:`sessions` lists (a test may change it while a page is open)."""
        self.sender: DeliverySender | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task[Any]] = set()

    async def submit(self, msg: InboundMessage) -> SubmitResult:
        self.loop = asyncio.get_running_loop()
        if self.sender is not None and msg.triggered:
            job = DeliveryJob(
                reply_id=uuid.uuid4().hex,
                session_key=f"console:{msg.bot_id}:{msg.scene_type}:{msg.scene_id}",
                platform="console",
                bot_id=msg.bot_id,
                scene_type=msg.scene_type,
                scene_id=msg.scene_id,
                reply_to=msg.message_id,
                reply=Reply.of_text(f"re: {msg.text}"),
            )
            task = asyncio.create_task(self.sender.deliver(job))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return SubmitResult(status="accepted", seq=1)

    async def control(self, request: ControlRequest) -> ControlReply:
        self.controls.append((request.kind, request.session_key, request.text, request.sender_id))
        return ControlReply(kind=request.kind, session_key=request.session_key, result="steered")

    async def sessions(self) -> list[SessionInfo]:
        return [
            SessionInfo(session_key=k, session_id=f"{k}#1", shard=0, pending=0, turns=2, idle_s=3.0)
            for k in self.live_keys
        ]

    async def status(self) -> dict[str, Any]:
        return {"live": len(LIVE_KEYS)}


@dataclass
class Console:
    """A running console: its base URL, the runtime stand-in and a transcript store on its database."""

    url: str
    runtime: EchoRuntime
    transcripts: TranscriptStore

    def get(self, path: str, *, headers: dict[str, str] | None = None, **params: Any) -> httpx.Response:
        return httpx.get(self.url + path, params=params, headers=headers, timeout=30)

    def event(self, session_key: str, event: dict[str, Any]) -> None:
        """POST one agent event as a console session does (internal endpoint)."""
        body = {"session_key": session_key, "event": event}
        resp = httpx.post(
            self.url + "/console/api/events", json=body, headers={API_TOKEN_HEADER: API_TOKEN}, timeout=30
        )
        assert resp.status_code == 200, resp.text

    def record(self, **fields: Any) -> None:
        """Store one transcript row directly (``TranscriptStore.record`` arguments)."""
        in_own_loop(self.transcripts.record(**fields))


def in_own_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a fresh event loop in a worker thread (the sync Playwright
    API keeps a loop running in the test's own thread, where ``asyncio.run`` is refused)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@contextmanager
def running_console(tmp: Path) -> Iterator[Console]:
    """Serve the ingress with two console bots (``console``: master ``admin``; ``other``: master
    ``boss``; both with the master token :data:`MASTER_TOKEN`) on SQLite in ``tmp``; stop
    everything afterwards."""
    old = os.environ.get(API_TOKEN_ENV)
    os.environ[API_TOKEN_ENV] = API_TOKEN
    os.environ[MASTER_ENV] = MASTER_TOKEN
    url = f"sqlite:///{tmp / 'console.db'}"
    bots = [
        BotConfig(platform="console", self_id="console", masters=["admin"], master_token_env=MASTER_ENV),
        BotConfig(platform="console", self_id="other", masters=["boss"], master_token_env=MASTER_ENV),
    ]
    config = Config(bots=bots, database=DatabaseConfig(url=url))
    runtime = EchoRuntime()
    db = Database(url)
    db.create_tables()
    try:
        with serve_in_thread(build_app(runtime, config)) as base:
            routed = [b.model_copy(update={"api_base": base}) for b in bots]
            runtime.sender = DeliverySender(DeliverySettings(database_url=url, bots=routed), 0, "browser:1")
            console = Console(base, runtime, TranscriptStore(db))
            try:
                yield console
            finally:
                closing = runtime.sender.close()
                if runtime.loop is None:  # never used: no loop holds its client
                    in_own_loop(closing)
                else:
                    asyncio.run_coroutine_threadsafe(closing, runtime.loop).result(30)
    finally:
        db.dispose()
        os.environ.pop(MASTER_ENV, None)
        if old is None:
            os.environ.pop(API_TOKEN_ENV, None)
        else:
            os.environ[API_TOKEN_ENV] = old


@contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium under Playwright (headless). Fails — never skips — when either is missing."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} not found: the console tests drive Debian's Chromium "
            "(`make test-deps` installs it: scripts/test-deps.sh)"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed: `pip install -e '.[dev]'` (no browser download needed)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def expect(target: Any) -> Any:
    """Playwright's ``expect`` (imported here, so a missing Playwright fails in :func:`chromium`
    with its message instead of at collection)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(target)


def open_console(browser: Any, url: str, width: int) -> Any:
    """A fresh tab (own context: no stored login) on ``/console`` at ``width`` x 800, ready."""
    page = browser.new_context(viewport={"width": width, "height": HEIGHT}).new_page()
    page.goto(f"{url}/console")
    page.wait_for_selector('[data-testid=connect][data-ready="1"]')
    return page


def login(page: Any, user: str, *, group: str | None = None, master_token: str = "") -> None:
    """Log in as ``user`` (a private chat, or the group ``group``; with ``master_token`` in the
    login form's master-token field) and wait for the stream."""
    page.fill("[data-testid=user]", user)
    page.fill("[data-testid=master-token]", master_token)
    page.select_option("[data-testid=scene]", "group" if group else "private")
    if group:
        page.fill("[data-testid=group]", group)
    page.click("[data-testid=connect]")
    wait_connected(page, user)


def wait_connected(page: Any, user: str) -> None:
    page.wait_for_function(
        "u => document.getElementById('status').textContent === 'connected as ' + u", arg=user
    )


def say(page: Any, text: str) -> None:
    page.fill("[data-testid=text]", text)
    page.press("[data-testid=text]", "Enter")


def box(page: Any, selector: str) -> dict[str, float]:
    """The element's bounding box (``x``, ``y``, ``width``, ``height``; CSS px, page coordinates)."""
    found = page.locator(selector).bounding_box()
    assert found is not None, f"{selector} has no box (not rendered)"
    return dict(found)


def overflow(page: Any) -> dict[str, int]:
    """``{"scrollWidth", "innerWidth", "scrollHeight", "innerHeight"}`` of the document."""
    return dict(
        page.evaluate(
            "({scrollWidth: document.scrollingElement.scrollWidth, innerWidth,"
            " scrollHeight: document.scrollingElement.scrollHeight, innerHeight})"
        )
    )


def shown_despite_hidden(page: Any) -> list[str]:
    """Elements carrying the ``hidden`` attribute that are displayed anyway (id or tag)."""
    return list(
        page.evaluate(
            "[...document.querySelectorAll('[hidden]')]"
            ".filter(e => getComputedStyle(e).display !== 'none').map(e => e.id || e.tagName)"
        )
    )


CLIPPED_LISTS_JS = """() => [...document.querySelectorAll('ol, ul')].filter(list => {
  const s = getComputedStyle(list);
  if (!list.getClientRects().length || s.listStyleType === 'none' || s.listStylePosition === 'inside')
    return false;
  const room = parseFloat(s.paddingLeft) + parseFloat(s.marginLeft);
  return room < (list.tagName === 'OL' ? 2.2 : 1.2) * parseFloat(s.fontSize);
}).map(list => list.id || list.tagName)"""
"""Shown lists whose markers sit outside in less room than they need (an ``ol`` "10." takes about
2.2 em, a bullet 1.2 em): their numbers are cut off at the left edge."""


def clipped_lists(page: Any) -> list[str]:
    return list(page.evaluate(CLIPPED_LISTS_JS))


def log_texts(page: Any) -> list[str]:
    """The text of every line of the chat log, in order."""
    return list(page.eval_on_selector_all("[data-testid=log] > li", "els => els.map(e => e.textContent)"))


def sse_json(line: str) -> dict[str, Any]:
    return dict(json.loads(line.removeprefix("data: ")))

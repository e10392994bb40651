"""examples/bot end to end: its ``sessionray.yaml`` runs on the session's local Ray with the real
setup factory, ingress and delivery; only the models are scripted faux ones
(``tests/examples/example_faux.py``). Messages go in as a browser and a OneBot implementation send
them (HTTP over loopback); what the console's SSE stream and the OneBot API stand-in receive, and
what SQL stores, is checked.

Overrides of the example's file, all environmental: the faux providers as default and vision
model; the database in a temporary folder; a free port; ``tools_dir`` and the MCP server's script
made absolute, and the MCP server run by this interpreter; the commented-out OneBot bot enabled
(its lines uncommented, as a user would) against the platform API stand-in; the admin token's
variable named ``EXAMPLE_ADMIN_TOKEN`` (set here; the console master logs in with that token, as
with ``make run``'s, docs/decisions.md#security-console-master-proof).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml

from actors.delivery.pool import DeliverySettings, create_pool
from actors.inbound.ingress import build_app
from actors.placement.runtime import SessionRuntime
from actors.serve.main import with_ingress_address
from runtime.config import Config, parse_config
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.memory.transcripts import TranscriptStore
from tests.actors.session_support import eventually
from tests.examples.example_faux import CHAT, FAUX_PROVIDERS, VISION, ExampleFauxSetup
from tests.platform_api_server import PlatformApiServer
from tests.platforms.e2e_support import free_port, requests_to

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "bot" / "sessionray.yaml"

# The OneBot bot's secrets, as its commented-out block names them. Set at import (test collection,
# before the session's ray.init) so delivery actors inherit them like workers of `sessionray serve`.
ONEBOT_ENV = {
    "EXAMPLE_ONEBOT_SECRET": "example-onebot-secret",
    "EXAMPLE_ONEBOT_TOKEN": "example-onebot-token",
}
for _k, _v in ONEBOT_ENV.items():
    os.environ.setdefault(_k, _v)
ADMIN_TOKEN_ENV, ADMIN_TOKEN = "EXAMPLE_ADMIN_TOKEN", "example-admin-token"
"""The admin token, which is also the console's master token (``master_token_env`` unset)."""
os.environ.setdefault(ADMIN_TOKEN_ENV, ADMIN_TOKEN)

QQ_BOT, QQ_GROUP, QQ_USER = "1000000001", 300000003, 200000002


def commented_bot(text: str, platform: str) -> dict[str, Any]:
    """The commented-out ``bots:`` entry of ``platform`` in the YAML ``text``, uncommented and parsed
    (commented-out lines are ``#-`` / ``#  `` right after the indentation)."""
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        if re.match(r"\s*#(- |  )", line):
            blocks[-1].append(line.replace("#", "", 1))
        elif blocks[-1]:
            blocks.append([])
    block = next(b for b in blocks if any(f"platform: {platform}" in line for line in b))
    [entry] = yaml.safe_load("\n".join(block))
    assert isinstance(entry, dict)
    return entry


def example_config(tmp: Path, api_base: str) -> Config:
    """The example's configuration with the overrides of the module docstring, validated whole."""
    text = EXAMPLE.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    ai = data["ai"]
    ai["providers"].update(FAUX_PROVIDERS)
    ai["default_model"], ai["vision_model"] = f"{CHAT}/chat", f"{VISION}/vision"
    ai["tools_dir"] = str(ROOT / ai["tools_dir"])
    faq = ai["mcp_servers"]["faq"]
    faq["command"], faq["args"] = sys.executable, [str(ROOT / a) for a in faq["args"]]
    data["database"]["url"] = f"sqlite:///{tmp / 'example-bot.db'}"
    data.setdefault("server", {})["admin_token_env"] = ADMIN_TOKEN_ENV
    data["bots"].append({**commented_bot(text, "onebot11"), "api_base": api_base})
    return parse_config(data, str(EXAMPLE))


@dataclass
class Bot:
    """The running example bot."""

    base_url: str
    api: PlatformApiServer
    rt: SessionRuntime
    config: Config
    repo: ContextRepository
    transcripts: TranscriptStore

    async def stored(self, session_key: str, epoch: int | None = None) -> list[Any]:
        """The stored messages of the session's active (or given) epoch, oldest first."""
        infos = await self.repo.list_sessions(session_key)
        info = next(
            i
            for i in infos
            if (i.status == "active" if epoch is None else i.session_id.endswith(f"#{epoch}"))
        )
        return [s.message for s in await self.repo.load_stored(info.session_id)]


@pytest.fixture(scope="module")
def bot(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Bot]:
    tmp = tmp_path_factory.mktemp("example-bot")
    port = free_port()
    with PlatformApiServer(fixtures_dir, vary_message_ids=True) as api:
        config = with_ingress_address(example_config(tmp, api.base_url), "127.0.0.1", port)
        settings = DeliverySettings.from_config(config)
        delivery = create_pool(
            settings, config.runtime.delivery_actors, prefix=f"example-delivery-{uuid.uuid4().hex[:8]}"
        )
        rt = SessionRuntime(prefix=f"example-{uuid.uuid4().hex[:8]}")
        asyncio.run(
            rt.start(config, setup_factory=ExampleFauxSetup(config), delivery=delivery, wait_warm=True)
        )
        db = Database(config.database.url)
        server = uvicorn.Server(
            uvicorn.Config(
                build_app(rt, config), host="127.0.0.1", port=port, lifespan="off", log_level="warning"
            )
        )
        thread = threading.Thread(target=server.run, name="example-ingress", daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:  # start-up wait, not a timing assertion
            assert thread.is_alive() and time.monotonic() < deadline, "ingress did not start"
            time.sleep(0.02)
        try:
            yield Bot(f"http://127.0.0.1:{port}", api, rt, config, ContextRepository(db), TranscriptStore(db))
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            asyncio.run(rt.stop())
            delivery.stop()
            db.dispose()


# --------------------------------------------------------------------------- the console, as a browser


@dataclass
class Browser:
    """One console tab: its SSE events, and sending as its user."""

    client: httpx.AsyncClient
    user: str
    events: list[dict[str, Any]]

    async def say(self, text: str, *, group: str | None = None, mention: bool = False) -> str:
        """POST a message to the console webhook; returns the ingress's ``status``."""
        body: dict[str, Any] = {"message_id": f"c-{uuid.uuid4().hex}", "user": self.user, "text": text}
        if group is not None:
            body.update(scene="group", group_id=group, mention_bot=mention)
        resp = await self.client.post("/webhooks/console/console", json=body)
        assert resp.status_code == 200, resp.text
        return str(resp.json()["status"])

    def replies(self, scene_id: str) -> list[str]:
        """Text of every reply delivered to the scene, in arrival order."""
        return [
            "".join(s["data"].get("text", "") for s in e["segments"] if s["type"] == "text")
            for e in list(self.events)
            if e["type"] == "reply" and e["scene_id"] == scene_id
        ]

    async def reply(self, scene_id: str, n: int) -> str:
        """Wait for the scene's ``n``-th reply (1-based) and return it."""
        got = await eventually(lambda: self.replies(scene_id)[n - 1 :], 90, f"reply {n} in {scene_id}")
        return str(got[0])

    def agent_events(self, session_key: str) -> list[dict[str, Any]]:
        """The live agent events of a session (tool calls and results) this tab received."""
        return [
            e["event"] for e in list(self.events) if e["type"] == "agent" and e["session_key"] == session_key
        ]


@contextlib.asynccontextmanager
async def browser(
    bot: Bot, user: str, group: str | None = None, *, master: bool = False
) -> AsyncIterator[Browser]:
    """A console tab of ``user`` (watching ``group`` too), connected before anything is sent; with
    ``master``, every request carries the master token (the admin token)."""
    params = {"user": user, **({"group": group} if group else {})}
    headers = {"X-Console-Master-Token": ADMIN_TOKEN} if master else {}
    async with (
        httpx.AsyncClient(base_url=bot.base_url, timeout=60, headers=headers) as client,
        client.stream("GET", "/console/api/stream", params=params) as stream,
    ):
        lines = stream.aiter_lines()
        assert await anext(lines) == ": connected"
        tab = Browser(client, user, [])

        async def read() -> None:
            async for line in lines:
                if line.startswith("data: "):
                    tab.events.append(json.loads(line[6:]))

        reader = asyncio.create_task(read())
        try:
            yield tab
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


def roles(messages: list[Any]) -> list[str]:
    """Roles of stored messages; a custom message shows its type (the turn records
    ``im_inbound`` / ``im_reply`` frame every answered turn)."""
    return [f"custom:{m.custom_type}" if m.role == "custom" else m.role for m in messages]


TOOL_TURN = ["custom:im_inbound", "user", "assistant", "toolResult", "assistant", "custom:im_reply"]
PLAIN_TURN = ["custom:im_inbound", "user", "assistant", "custom:im_reply"]


def tool_results(messages: list[Any]) -> list[tuple[str, str, bool]]:
    """``(tool name, text, is_error)`` of every stored tool result."""
    return [
        (m.tool_name, "".join(b.text for b in m.content if b.type == "text"), m.is_error)
        for m in messages
        if m.role == "toolResult"
    ]


def user_texts(messages: list[Any]) -> list[str]:
    out = []
    for m in messages:
        if m.role == "user":
            out.append(
                m.content
                if isinstance(m.content, str)
                else "".join(b.text for b in m.content if b.type == "text")
            )
    return out


# --------------------------------------------------------------------------- behaviours


async def test_group_answers_only_when_mentioned_and_runs_the_python_tool(bot: Bot) -> None:
    key = "console:console:group:lobby"
    async with browser(bot, "alice", "lobby") as tab:
        assert await tab.say("convert 5 km to mi", group="lobby") == "untriggered"
        assert await tab.say("convert 5 km to mi", group="lobby", mention=True) == "accepted"
        assert await tab.reply("lobby", 1) == "convert_units: 5 km = 3.107 mi"
        assert tab.replies("lobby") == ["convert_units: 5 km = 3.107 mi"]  # one reply for two messages
        calls = await eventually(
            lambda: [e for e in tab.agent_events(key) if e["type"] == "tool_call"], 30, "event"
        )
    assert calls == [
        {
            "type": "tool_call",
            "name": "convert_units",
            "args": {"value": "5", "from_unit": "km", "to_unit": "mi"},
        }
    ]
    messages = await eventually(lambda: _at_least(bot.stored(key), 6), 30, "the stored turn")
    assert roles(messages) == TOOL_TURN  # the un-mentioned message is in the transcript only
    assert tool_results(messages) == [("convert_units", "5 km = 3.107 mi", False)]
    assert messages[3].details == {"result": pytest.approx(3.10686, abs=1e-5)}
    # the outbound row is written when the delivery closes the reply, after the browser saw it
    rows = await eventually(
        lambda: _at_least(bot.transcripts.scene("console", "console", "lobby"), 3), 30, "the outbound row"
    )
    assert [(r.direction, r.sender_id) for r in rows] == [
        ("inbound", "alice"),
        ("inbound", "alice"),
        ("outbound", "console"),
    ]


async def _at_least(coro: Any, n: int) -> Any:
    rows = await coro
    return rows if len(rows) >= n else None


async def test_a_turn_without_tools(bot: Bot) -> None:
    async with browser(bot, "dora") as tab:
        assert await tab.say("hello there") == "accepted"
        assert await tab.reply("dora", 1) == "You said: hello there"
    messages = await eventually(
        lambda: _at_least(bot.stored("console:console:private:dora"), 4), 30, "stored"
    )
    assert roles(messages) == PLAIN_TURN
    assert (messages[2].provider, messages[2].model, messages[2].tool_calls()) == (CHAT, "chat", [])
    # no tool events; the validated reply preview may already be there (the turn ends once its
    # reply is queued, before the console shows the reply: docs/decisions.md#delivery-outbox)
    assert [e for e in tab.agent_events("console:console:private:dora") if e["type"] != "reply_preview"] == []


async def test_tool_md_and_mcp_tools(bot: Bot) -> None:
    key = "console:console:private:erin"
    async with browser(bot, "erin") as tab:
        await tab.say("count: hello big world")
        assert await tab.reply("erin", 1) == 'text_stats: {"words": 3, "characters": 15, "lines": 1}'
        # the turn's closing record is written once delivery took the reply: wait for it, so the
        # next turn's records follow it (turns of one session may overlap)
        await eventually(lambda: _at_least(bot.stored(key), 6), 30, "the first turn stored")
        await tab.say("faq how do I steer?")
        assert await tab.reply("erin", 2) == (
            "faq_search: Only a master of the bot may steer a running turn: /steer <text> in the chat, "
            "or the console's Steer button. Anyone else is refused."
        )
    messages = await eventually(lambda: _at_least(bot.stored(key), 12), 30, "both turns stored")
    assert roles(messages) == TOOL_TURN * 2
    assert [(name, is_error) for name, _, is_error in tool_results(messages)] == [
        ("text_stats", False),
        ("faq_search", False),
    ]
    assert messages[3].details == {"words": 3, "characters": 15, "lines": 1}  # the handler's dict


async def test_delegate_runs_a_sub_agent_with_the_business_tools(bot: Bot) -> None:
    key = "console:console:private:carol"
    async with browser(bot, "carol") as tab:
        await tab.say("delegate convert 10 km to mi")
        assert await tab.reply("carol", 1) == "delegate: helper: convert_units: 10 km = 6.214 mi"
    messages = await eventually(lambda: _at_least(bot.stored(key), 6), 30, "stored")
    # The sub-agent's own messages stay inside the tool; its plain-text answer (no IM preset: the
    # script answers JSON only under the preset) is the delegate tool's result.
    assert roles(messages) == TOOL_TURN
    assert tool_results(messages) == [("delegate", "helper: convert_units: 10 km = 6.214 mi", False)]
    assert messages[2].tool_calls()[0].arguments == {"task": "convert 10 km to mi"}


def onebot_group_event(message_id: int, segments: list[dict[str, Any]]) -> bytes:
    event = {
        "self_id": int(QQ_BOT),
        "user_id": QQ_USER,
        "time": int(time.time()),
        "message_id": message_id,
        "message_type": "group",
        "sub_type": "normal",
        "group_id": QQ_GROUP,
        "sender": {"user_id": QQ_USER, "nickname": "carol", "card": "", "role": "member"},
        "raw_message": "",
        "font": 14,
        "message": segments,
        "message_format": "array",
        "post_type": "message",
    }
    return json.dumps(event).encode()


async def test_an_image_goes_to_the_vision_model(bot: Bot) -> None:
    image = "http://127.0.0.1:9/cat.png"
    body = onebot_group_event(
        70440401,
        [
            {"type": "at", "data": {"qq": QQ_BOT}},
            {"type": "text", "data": {"text": " what is this?"}},
            {"type": "image", "data": {"file": "cat.png", "url": image}},
        ],
    )
    digest = hmac.new(ONEBOT_ENV["EXAMPLE_ONEBOT_SECRET"].encode(), body, hashlib.sha1).hexdigest()
    async with httpx.AsyncClient(base_url=bot.base_url, timeout=30) as client:
        resp = await client.post(
            f"/webhooks/onebot11/{QQ_BOT}",
            content=body,
            headers={"X-Signature": f"sha1={digest}", "Content-Type": "application/json"},
        )
    assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})
    sent = await eventually(lambda: requests_to(bot.api, "/send_group_msg", group_id=QQ_GROUP), 90, "reply")
    assert sent == [
        {
            "group_id": QQ_GROUP,
            "message": [
                {"type": "reply", "data": {"id": "70440401"}},
                {"type": "text", "data": {"text": f"vision model saw 1 image(s): [image url={image}]"}},
            ],
        }
    ]
    call = next(r for r in bot.api.requests if r.path == "/send_group_msg")
    assert call.headers["authorization"] == f"Bearer {ONEBOT_ENV['EXAMPLE_ONEBOT_TOKEN']}"
    key = f"onebot11:{QQ_BOT}:group:{QQ_GROUP}"
    messages = await eventually(lambda: _at_least(bot.stored(key), 4), 30, "stored")
    assert roles(messages) == PLAIN_TURN
    assert (messages[2].provider, messages[2].model) == (VISION, "vision")


async def test_models_lists_the_configured_models(bot: Bot) -> None:
    async with browser(bot, "admin", master=True) as tab:
        await tab.say("/models")
        assert (await tab.reply("admin", 1)).split("\n") == [
            "Configured models:",
            "- local/qwen2.5:7b: api openai-completions, context 32768 tokens, input text, "
            "structured output unknown",
            "- local/qwen2.5vl:7b: api openai-completions, context 32768 tokens, input text+image, "
            "structured output unknown",
            f"- {CHAT}/chat (default): api faux, context 8192 tokens, input text, "
            "structured output native (config)",
            f"- {VISION}/vision (vision): api faux, context 8192 tokens, input text+image, "
            "structured output native (config)",
        ]
    # a command never reaches the model: only the record of the delivered answer is stored
    stored = await eventually(lambda: bot.stored("console:console:private:admin"), 30, "the reply record")
    assert roles(stored) == ["custom:im_reply"]
    assert stored[0].data["preview"].startswith("Configured models:\n- local/qwen2.5:7b: ")


async def test_new_archives_the_group_conversation_masters_only(bot: Bot) -> None:
    key = "console:console:group:team"
    async with browser(bot, "admin", "team", master=True) as admin, browser(bot, "bob", "team") as bob:
        await admin.say("hello team", group="team", mention=True)
        assert await admin.reply("team", 1) == "You said: hello team"
        await eventually(lambda: _at_least(bot.stored(key), 4), 30, "the first turn stored")
        await bob.say("/new", group="team", mention=True)
        assert await admin.reply("team", 2) == "Only a master of this bot may use /new."
        # the refusal's record is stored in the same epoch; nothing was archived
        refused = await eventually(lambda: _at_least(bot.stored(key), 5), 30, "the refusal's record")
        assert roles(refused) == [*PLAIN_TURN, "custom:im_reply"]
        assert refused[-1].data["preview"] == "Only a master of this bot may use /new."
        assert [i.status for i in await bot.repo.list_sessions(key)] == ["active"]
        await admin.say("/new", group="team", mention=True)
        assert (
            await admin.reply("team", 3)
            == "New conversation started (epoch 2). Earlier messages are archived."
        )
        assert bob.replies("team") == admin.replies("team")  # both members see every reply
    infos = await bot.repo.list_sessions(key)
    assert [(i.session_id, i.status) for i in infos] == [(f"{key}#1", "archived"), (f"{key}#2", "active")]
    archived = await bot.stored(key, epoch=1)
    assert archived == refused
    assert user_texts(archived) == ["hello team"]
    fresh = await eventually(lambda: bot.stored(key), 30, "the record of the /new answer")
    assert roles(fresh) == ["custom:im_reply"]  # the new epoch starts empty; only /new's answer
    assert fresh[0].data["preview"] == "New conversation started (epoch 2). Earlier messages are archived."


async def _turns_ended(bot: Bot, session_key: str, timeout_s: float = 60.0) -> None:
    """Poll (20 ms) until the live session runs no turn; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = await bot.rt.session(session_key)
        if info is not None and info.actor is not None and info.actor["active_turns"] == 0:
            return
        assert time.monotonic() < deadline, f"a turn of {session_key} still runs"
        await asyncio.sleep(0.02)


async def test_a_non_master_cannot_steer(bot: Bot) -> None:
    async with browser(bot, "bob") as bob, browser(bot, "admin", master=True) as admin:
        # from the chat
        await bob.say("/steer answer in French")
        assert await bob.reply("bob", 1) == "Only a master of this bot may use /steer."
        # from the console's steer endpoint, on bob's own live session and on the master's
        resp = await bob.client.post(
            "/console/api/steer",
            json={"user": "bob", "session_key": "console:console:private:bob", "text": "answer in French"},
        )
        assert resp.status_code == 403 and "'bob' is not a master" in resp.json()["error"]
        await admin.say("hi")
        assert await admin.reply("admin", 1) == "You said: hi"
        resp = await bob.client.post(
            "/console/api/steer",
            json={"user": "bob", "session_key": "console:console:private:admin", "text": "answer in French"},
        )
        assert resp.status_code == 403
        # the master may: once the "hi" turn has ended (its reply is shown a moment before the turn
        # records it and ends), no turn is running, so the text runs as a turn of its own
        await _turns_ended(bot, "console:console:private:admin")
        resp = await admin.client.post(
            "/console/api/steer",
            json={
                "user": "admin",
                "session_key": "console:console:private:admin",
                "text": "answer in French",
            },
        )
        assert (resp.status_code, resp.json()) == (200, {"ok": True, "outcome": "started"})
        assert await admin.reply("admin", 2) == "You said: answer in French"
    assert user_texts(await bot.stored("console:console:private:bob")) == []
    assert user_texts(await bot.stored("console:console:private:admin")) == ["hi", "answer in French"]

"""Chat commands end to end through the actor runtime on real local Ray
(docs/decisions.md#chat-commands): the command is answered before the agent, delivered through the
same path as any reply (the platform API test server receives it), and never reaches the model's
context."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.placement.runtime import SessionRuntime
from runtime.config import BotConfig, Config, DatabaseConfig, RuntimeConfig
from runtime.platforms.base import InboundMessage, Sender
from tests.actors.edge_support import BOT_ID, delivery_pool
from tests.actors.session_support import MASTER, Harness, eventually, key_of, submit_until_accepted
from tests.platform_api_server import PlatformApiServer
from tests.session.feature_scripts import FeatureSetup

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    tmp = tmp_path_factory.mktemp("features-runtime")
    db_url = f"sqlite:///{tmp / 'sessionray.db'}"
    with PlatformApiServer(fixtures_dir) as api, delivery_pool(db_url, api.base_url) as delivery:
        config = Config(
            bots=[BotConfig(platform="onebot11", self_id=BOT_ID, api_base=api.base_url, masters=[MASTER])],
            database=DatabaseConfig(url=db_url),
            runtime=RuntimeConfig(min_hosts=1, router_shards=1, delivery_actors=1, idle_ttl_s=120),
        )
        rt = SessionRuntime(prefix=f"test-feat-{uuid.uuid4().hex[:8]}")
        factory = FeatureSetup(str(tmp / "markers"), names={"clear": "reset"})
        asyncio.run(rt.start(config, setup_factory=factory, delivery=delivery, wait_warm=True))
        try:
            yield Harness(rt, api, tmp / "markers", config)
        finally:
            asyncio.run(rt.stop())


def said(user: str, text: str, *, master: bool = False) -> InboundMessage:
    return InboundMessage(
        platform="onebot11",
        bot_id=BOT_ID,
        message_id=uuid.uuid4().hex[:12],
        scene_type="private",
        scene_id=user,
        sender=Sender(id=user, name=f"user{user}", roles=["master"] if master else []),
        text=text,
        segments=[{"type": "text", "data": {"text": text}}],
        time_ms=int(time.time() * 1000),
    )


async def idle(h: Harness, user: str) -> bool:
    info = await h.rt.session(key_of(user))
    return info is not None and info.pending == 0 and (info.actor or {}).get("active_turns") == 0


async def converse(h: Harness, user: str, *texts: str, master: bool = False) -> list[str]:
    """Send each text once the previous turn has ended; return the new replies."""
    start = len(h.sent(user))
    for i, text in enumerate(texts, 1):
        await submit_until_accepted(h.rt, said(user, text, master=master))
        await eventually(lambda i=i: len(h.sent(user)) >= start + i, 60, f"reply to {text!r}")
        await eventually(lambda: idle(h, user), 60, "the turn to end")
    return h.sent(user)[start:]


def user_texts(context: list[dict[str, Any]]) -> list[str]:
    out = []
    for m in context:
        if m.get("role") == "user":
            c = m["content"]
            out.append(c if isinstance(c, str) else "".join(b.get("text", "") for b in c))
    return out


async def test_status_models_new_and_renamed_clear(h: Harness) -> None:
    user = "51001"
    assert await converse(h, user, "hello", "/status", "/models") == [
        "re: hello",
        "Model: script/script-model\nMessages: 4\nEpoch: 1\nTurn running: no",
        "Configured models:\n- script/script-model (default): api faux, context 8192 tokens, input text, "
        "structured output native (probe, <1 min old)",
    ]
    assert user_texts(await h.rt.context(key_of(user))) == ["hello"]  # commands never reach the model
    assert await converse(h, user, "/new", "echo after", "/status") == [
        "New conversation started (epoch 2). Earlier messages are archived.",
        "after",
        "Model: script/script-model\nMessages: 5\nEpoch: 2\nTurn running: no",
    ]
    assert user_texts(await h.rt.context(key_of(user))) == ["echo after"]
    assert await converse(h, user, "/reset", "/clear") == [
        "New conversation started (epoch 3). Earlier messages are archived.",
        "re: /clear",  # renamed in the config: /clear is now an ordinary message
    ]
    assert user_texts(await h.rt.context(key_of(user))) == ["/clear"]


async def test_steer_and_followup_from_the_chat_masters_only(h: Harness) -> None:
    user = "51002"
    assert await converse(h, user, "/steer go left", "/followup more") == [
        "Only a master of this bot may use /steer.",
        "Only a master of this bot may use /followup.",
    ]
    # a master steers a running turn from the chat
    await submit_until_accepted(h.rt, said(user, "slow 1.5", master=True))
    await eventually(lambda: h.tool_starts() >= 1, 30, "the slow tool to start")
    await submit_until_accepted(h.rt, said(user, "/steer answer in French", master=True))
    await eventually(lambda: len(h.sent(user)) >= 4, 60, "both replies")
    assert h.sent(user)[2:] == ["tool: slept 1.5; then: ['answer in French']", "Steering the running turn."]
    # no turn running: the follow-up runs as a turn of its own, after the command's answer
    await submit_until_accepted(h.rt, said(user, "/followup and more", master=True))
    await eventually(lambda: len(h.sent(user)) >= 6, 60, "command answer + follow-up turn")
    assert h.sent(user)[4:] == ["No turn was running; started one with your message.", "re: and more"]
    assert user_texts(await h.rt.context(key_of(user)))[-1] == "and more"


async def test_a_bad_tool_md_stops_runtime_start(ray_session: None, tmp_path: Path) -> None:
    from runtime.config import parse_config
    from runtime.session.tool_md import ToolMdError

    tools = tmp_path / "tools"
    tools.mkdir()
    bad = tools / "x.tool.md"
    bad.write_text(
        "---\nname: x\ndescription: d\nhandler: {type: http, url: 'http://127.0.0.1:9/x'}\n"
        "parameters: {type: object, properties: {a: {type: string, if: {maxLength: 1}}}}\n---\n"
    )
    config = parse_config(
        {"ai": {"tools_dir": str(tools)}, "database": {"url": f"sqlite:///{tmp_path / 'x.db'}"}}
    )
    rt = SessionRuntime(prefix=f"test-feat-bad-{uuid.uuid4().hex[:8]}")
    with pytest.raises(ToolMdError) as err:
        await rt.start(config)
    assert str(err.value) == f"{bad}: /parameters/properties/a/if: unsupported JSON Schema feature 'if'"
    assert rt.routers == [] and rt.hosts is None  # nothing was started

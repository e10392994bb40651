"""Console codec, the codec registry and the ``bots:`` config defaults."""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.config import BotConfig, Config
from runtime.platforms.base import (
    InboundMessage,
    MalformedEvent,
    RenderTarget,
    Sender,
    SendResult,
    SignatureError,
    UnknownPlatformError,
    get_codec,
)
from runtime.platforms.console import ConsoleCodec, agent_event_call, agent_event_payload
from runtime.platforms.onebot11 import OneBot11Codec
from runtime.platforms.telegram import TelegramCodec
from runtime.reply.segments import SEGMENT_TYPES, Reply


def browser(**kw: Any) -> bytes:
    return json.dumps(
        {"message_id": "c-1", "user": "alice", "text": "hello", "time_ms": 1767000000000, **kw}
    ).encode()


def test_private_message() -> None:
    msg = ConsoleCodec().parse({}, browser())
    assert msg == InboundMessage(
        platform="console",
        bot_id="console",
        message_id="c-1",
        scene_type="private",
        scene_id="alice",
        sender=Sender(id="alice", name="alice", roles=[]),
        text="hello",
        segments=[{"type": "text", "data": {"text": "hello"}}],
        reply_to=None,
        mentioned_bot=False,
        triggered=True,
        time_ms=1767000000000,
    )
    assert msg.session_key == "console:console:private:alice"


def test_group_message_mention_and_master(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSOLE_CODEC_MASTER", "m-token")
    c = ConsoleCodec(masters=["admin"], master_token_env="CONSOLE_CODEC_MASTER")
    proof = {"X-Console-Master-Token": "m-token"}
    msg = c.parse(proof, browser(user="admin", scene="group", group_id="lobby", text="@console what's up"))
    assert msg == InboundMessage(
        platform="console",
        bot_id="console",
        message_id="c-1",
        scene_type="group",
        scene_id="lobby",
        sender=Sender(id="admin", name="admin", roles=["master"]),
        text="@console what's up",
        segments=[
            {"type": "mention", "data": {"target": "console"}},
            {"type": "text", "data": {"text": "what's up"}},
        ],
        reply_to=None,
        mentioned_bot=True,
        triggered=True,
        time_ms=1767000000000,
    )
    flagged = c.parse({}, browser(scene="group", group_id="lobby", mention_bot=True))
    assert flagged is not None and (flagged.mentioned_bot, flagged.triggered) == (True, True)
    quiet = c.parse({}, browser(scene="group", group_id="lobby"))
    assert quiet is not None and (quiet.mentioned_bot, quiet.triggered) == (False, False)
    always = ConsoleCodec(trigger="always").parse({}, browser(scene="group", group_id="lobby"))
    assert always is not None and always.triggered is True


def test_console_master_token_defaults_to_the_admin_token_variable() -> None:
    config = Config.model_validate(
        {
            "bots": [
                {"platform": "console"},
                {"platform": "console", "self_id": "c2", "master_token_env": "PW"},
            ],
            "server": {"admin_token_env": "MY_ADMIN"},
        }
    )
    assert [b.master_token_env for b in config.bots] == ["MY_ADMIN", "PW"]
    assert Config().bots[0].master_token_env == "SESSIONRAY_ADMIN_TOKEN"
    assert get_codec(Config().bots[0]).master_token_env == "SESSIONRAY_ADMIN_TOKEN"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="master_token_env` is for console bots only"):
        BotConfig(platform="onebot11", self_id="1", master_token_env="X")


@pytest.mark.parametrize(
    ("headers", "env_value", "configured"),
    [
        ({}, "m-token", "CONSOLE_CODEC_MASTER"),  # the name alone
        ({"X-Console-Master-Token": "wrong"}, "m-token", "CONSOLE_CODEC_MASTER"),
        ({"X-Console-Master-Token": "m-token"}, None, "CONSOLE_CODEC_MASTER"),  # variable unset
        ({"X-Console-Master-Token": "m-token"}, "m-token", None),  # no master token configured
        ({"X-Console-Master-Token": ""}, "m-token", "CONSOLE_CODEC_MASTER"),
    ],
)
def test_a_master_name_without_the_master_token_is_no_master(
    monkeypatch: pytest.MonkeyPatch, headers: dict[str, str], env_value: str | None, configured: str | None
) -> None:
    """docs/decisions.md#security-console-master-proof: ``admin`` typed without the proof gets no
    ``master`` role (so no ``/steer``, ``/followup``, group ``/new`` or master-only tool)."""
    if env_value is None:
        monkeypatch.delenv("CONSOLE_CODEC_MASTER", raising=False)
    else:
        monkeypatch.setenv("CONSOLE_CODEC_MASTER", env_value)
    c = ConsoleCodec(masters=["admin"], master_token_env=configured)
    msg = c.parse(headers, browser(user="admin", text="/steer stop"))
    assert msg is not None and msg.sender.roles == []
    named_other = ConsoleCodec(masters=["boss"], master_token_env="CONSOLE_CODEC_MASTER")
    monkeypatch.setenv("CONSOLE_CODEC_MASTER", "m-token")
    other = named_other.parse({"X-Console-Master-Token": "m-token"}, browser(user="admin"))
    assert other is not None and other.sender.roles == []  # the token does not make any name a master


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{", "not valid JSON"),
        (b'"x"', "JSON object"),
        (browser(user="a b"), "'user'"),
        (browser(user="a:b"), "'user'"),
        (browser(scene="group"), "'group_id'"),
        (browser(scene="channel"), "'scene'"),
        (browser(message_id=""), "'message_id'"),
        (browser(text="  "), "'text'"),
        (browser(time_ms="now"), "'time_ms'"),
    ],
)
def test_malformed(body: bytes, match: str) -> None:
    with pytest.raises(MalformedEvent, match=match):
        ConsoleCodec().parse({}, body)


def test_token() -> None:
    c = ConsoleCodec(secret="tok")
    c.verify({"X-Console-Token": "tok"}, b"{}")
    with pytest.raises(SignatureError):
        c.verify({"X-Console-Token": "bad"}, b"{}")
    with pytest.raises(SignatureError):
        c.verify({}, b"{}")
    ConsoleCodec().verify({}, b"{}")


def test_render_every_segment_without_degradation(tmp_path: Path, degraded: Any) -> None:
    (tmp_path / "a.bin").write_bytes(b"\x00\x01")
    segments: list[dict[str, Any]] = [
        {"type": "markdown", "data": {"content": "**x**"}},
        {"type": "text", "data": {"text": "t"}},
        {"type": "mention", "data": {"target": "alice"}},
        {"type": "image", "data": {"media": {"kind": "url", "value": "https://e.com/a.png"}}},
        {"type": "audio", "data": {"media": {"kind": "base64", "value": "AAE="}}},
        {"type": "video", "data": {"media": {"kind": "file", "value": "ref"}}},
        {"type": "file", "data": {"media": {"kind": "path", "value": "a.bin"}}},
        {"type": "reply", "data": {"message_id": "c-1"}},
        {"type": "forward", "data": {"forward_id": "f"}},
        {"type": "face", "data": {"id": 3}},
        {"type": "dice", "data": {}},
        {"type": "rps", "data": {}},
        {"type": "share", "data": {"url": "https://e.com", "title": "E"}},
    ]
    c = ConsoleCodec(api_base="http://127.0.0.1:8123", media_dir=tmp_path)
    (call,) = c.render(
        Reply.model_validate({"segments": segments}),
        RenderTarget(scene_type="group", scene_id="lobby", reply_to="c-1"),
    )
    inlined = {
        "type": "file",
        "data": {"media": {"kind": "base64", "value": base64.b64encode(b"\x00\x01").decode()}},
    }
    assert (call.url, call.headers) == ("http://127.0.0.1:8123/console/api/deliver", {})
    assert call.json_body == {
        "bot_id": "console",
        "scene_type": "group",
        "scene_id": "lobby",
        "reply_to": "c-1",
        "segments": [*segments[:6], inlined, *segments[7:]],
    }
    assert degraded.delta() == {}
    assert c.supported_segments == frozenset(SEGMENT_TYPES)
    assert c.render(Reply(segments=[]), RenderTarget(scene_type="private", scene_id="alice")) == []


def test_send_results() -> None:
    c = ConsoleCodec()
    assert c.parse_send_result(200, {}, b'{"ok": true, "message_id": "console-3"}') == SendResult(
        ok=True, message_id="console-3"
    )
    assert c.parse_send_result(400, {}, b'{"error": "x"}') == SendResult(
        ok=False, error='HTTP 400: {"error": "x"}'
    )
    assert c.parse_send_result(503, {"Retry-After": "1"}, b"") == SendResult(
        ok=False, error="HTTP 503: ", retry_after_s=1.0, retryable=True
    )


def test_agent_event_payloads() -> None:
    from runtime.agent.events import AgentStartEvent, ToolExecutionStartEvent, TurnStartEvent

    start = ToolExecutionStartEvent(tool_call_id="1", tool_name="clock", args={"tz": "UTC"})
    assert agent_event_payload(start) == {"type": "tool_call", "name": "clock", "args": {"tz": "UTC"}}
    assert agent_event_payload(AgentStartEvent()) == {"type": "status", "text": "thinking…"}
    assert agent_event_payload(TurnStartEvent()) is None
    assert agent_event_payload({"type": "notice", "text": "format corrected"}) == {
        "type": "notice",
        "text": "format corrected",
    }
    call = agent_event_call("http://h:1", "console:console:private:alice", {"type": "notice", "text": "x"})
    assert (call.url, call.json_body) == (
        "http://h:1/console/api/events",
        {"session_key": "console:console:private:alice", "event": {"type": "notice", "text": "x"}},
    )


# --------------------------------------------------------------------------- registry and config


def test_get_codec_from_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_TOKEN", "1000000099:abc")
    monkeypatch.setenv("OB_SECRET", "s")
    cfg = Config.model_validate(
        {
            "server": {"port": 9001},
            "bots": [
                {"platform": "console", "masters": ["admin"]},
                {
                    "platform": "onebot11",
                    "self_id": 10001,
                    "secret_env": "OB_SECRET",
                    "trigger": "keyword",
                    "keyword": "bot",
                    "masters": [20002],
                },
                {
                    "platform": "telegram",
                    "self_id": "1000000099",
                    "token_env": "TG_TOKEN",
                    "username": "sr_bot",
                },
            ],
        }
    )
    console, onebot, telegram = (get_codec(b) for b in cfg.bots)
    assert isinstance(console, ConsoleCodec)
    assert (console.bot_id, console.api_base, console.masters) == (
        "console",
        "http://127.0.0.1:9001",
        frozenset({"admin"}),
    )
    assert isinstance(onebot, OneBot11Codec)
    assert (onebot.self_id, onebot.trigger, onebot.keywords, onebot.masters) == (
        "10001",
        "keyword",
        ("bot",),
        frozenset({"20002"}),
    )
    with pytest.raises(SignatureError):
        onebot.verify({}, b"{}")  # the secret was read from OB_SECRET
    assert isinstance(telegram, TelegramCodec)
    assert (telegram.bot_id, telegram.username, telegram.api_base) == (
        "1000000099",
        "sr_bot",
        "https://api.telegram.org",
    )


def test_registry_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MISSING_SECRET", raising=False)
    with pytest.raises(UnknownPlatformError, match="unknown platform 'irc'"):
        get_codec(SimpleNamespace(platform="irc"))
    with pytest.raises(ValueError, match="MISSING_SECRET"):
        get_codec(BotConfig(platform="onebot11", self_id="1", secret_env="MISSING_SECRET"))


def test_default_config_is_one_console_bot_with_master_admin() -> None:
    (bot,) = Config().bots
    assert (bot.platform, bot.self_id, bot.masters, bot.api_base) == (
        "console",
        "console",
        ["admin"],
        "http://127.0.0.1:8000",
    )
    with pytest.raises(ValueError, match="needs `self_id`"):
        BotConfig(platform="onebot11")
    with pytest.raises(ValueError, match="token_env"):
        BotConfig(platform="telegram", self_id="1")


# --------------------------------------------------------------------------- live agent events (item 4)


def _outcome(outcome: str, reason: str | None = None) -> Any:
    from runtime.reply.im_reply import ReplyOutcome

    return ReplyOutcome(Reply.of_text("hi"), "native", outcome, "raw", reason)  # type: ignore[arg-type]


def test_console_payloads() -> None:
    from runtime.agent.events import MessageEndEvent, ToolExecutionEndEvent, ToolExecutionStartEvent
    from runtime.llm.types import AssistantMessage, TextContent, ThinkingContent, ToolResultMessage
    from runtime.session.console_events import console_payload

    start = ToolExecutionStartEvent(tool_call_id="c1", tool_name="sleep", args={"seconds": 0})
    result = ToolResultMessage(
        tool_call_id="c1", tool_name="sleep", content=[TextContent(text="x")], is_error=True
    )
    end = ToolExecutionEndEvent(tool_call_id="c1", tool_name="sleep", result=result, is_error=True)
    assert console_payload(start) == {"type": "tool_call", "name": "sleep", "args": {"seconds": 0}}
    assert console_payload(end) == {"type": "tool_result", "name": "sleep", "is_error": True, "result": "x"}
    thought = MessageEndEvent(
        message=AssistantMessage(content=[ThinkingContent(thinking="t" * 250), TextContent(text="answer")])
    )
    assert console_payload(thought) is None  # thinking preview is off unless configured
    assert console_payload(thought, thinking=True) == {"type": "thinking", "text": "t" * 200 + "…"}
    plain = MessageEndEvent(message=AssistantMessage(content=[TextContent(text="answer")]))
    assert console_payload(plain, thinking=True) is None
    assert console_payload(_outcome("corrected", "segments: field required")) == {
        "type": "notice",
        "text": "reply format was invalid; corrected by one extra call (native tier): "
        "segments: field required",
        "outcome": "corrected",
        "tier": "native",
    }
    assert console_payload(_outcome("failed")) == {
        "type": "notice",
        "text": "reply could not be validated; sent the fixed failure message (native tier)",
        "outcome": "failed",
        "tier": "native",
    }
    for quiet in ("first_try", "plain", "aborted"):
        assert console_payload(_outcome(quiet)) is None


async def test_console_event_sink_posts_in_order_and_never_raises(api_server: Any) -> None:
    from runtime.agent.events import ToolExecutionStartEvent, TurnStartEvent
    from runtime.session.console_events import ConsoleEventSink

    key = "console:console:private:alice"
    api_server.respond_with("/console/api/events", 200, b'{"ok": true, "receivers": 1}')
    sink = ConsoleEventSink(api_server.base_url, key, token="tok")
    for i in range(3):
        sink(ToolExecutionStartEvent(tool_call_id=f"c{i}", tool_name=f"t{i}", args={"i": i}))
    sink(TurnStartEvent())  # not shown: nothing posted
    sink(_outcome("first_try"))  # no notice; only the completed-reply preview
    await sink.drained()
    sent = [r for r in api_server.requests if r.path == "/console/api/events"]
    preview = {"type": "reply_preview", "text": "hi", "outcome": "first_try", "tier": "native"}
    assert [(r.json, r.headers.get("x-console-token")) for r in sent] == [
        ({"session_key": key, "event": {"type": "tool_call", "name": f"t{i}", "args": {"i": i}}}, "tok")
        for i in range(3)
    ] + [({"session_key": key, "event": preview}, "tok")]
    # a refusing console and an unreachable one: the event is dropped, nothing raises
    api_server.respond_with("/console/api/events", 500, b"down")
    sink(_outcome("failed"))
    await sink.drained()
    assert len([r for r in api_server.requests if r.path == "/console/api/events"]) == 6  # notice + preview
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    dead = ConsoleEventSink(f"http://127.0.0.1:{port}", key, timeout_s=1.0)
    dead(_outcome("corrected"))
    await dead.drained()
    dead(object())  # unknown objects are ignored


def test_console_event_hook_only_for_console_sessions(tmp_path: Path) -> None:
    from actors.placement.hosts.setup import ConfigSetupFactory
    from runtime.session.console_events import ConsoleEventSink, console_event_hook

    cfg = Config.model_validate(
        {
            "server": {"port": 9002},
            "database": {"url": f"sqlite:///{tmp_path / 'db.sqlite'}"},
            "bots": [
                {"platform": "console", "thinking_preview": True},
                {"platform": "onebot11", "self_id": 10001},
            ],
        }
    )
    hook = console_event_hook(cfg, "console:console:group:lobby")
    assert isinstance(hook, ConsoleEventSink)
    assert (hook.api_base, hook.session_key, hook.token, hook.thinking) == (
        "http://127.0.0.1:9002",
        "console:console:group:lobby",
        None,
        True,
    )
    assert console_event_hook(cfg, "onebot11:10001:private:20002") is None
    assert console_event_hook(cfg, "console:other:private:alice") is None  # no such console bot
    assert Config().bots[0].thinking_preview is False
    factory = ConfigSetupFactory(cfg)
    try:
        assert isinstance(factory("console:console:private:alice").on_event, ConsoleEventSink)
        assert factory("onebot11:10001:private:20002").on_event is None
    finally:
        factory._db.dispose()


async def test_finalize_reply_hands_the_outcome_to_on_event() -> None:
    from actors.models.builtin import builtin_model
    from runtime.session.turn import SessionSetup, TurnInput
    from runtime.session.turn_agent import TurnControl, finalize_reply

    class Contract:
        async def finalize(self, final: Any, identity: Any, *, signal: Any) -> Any:
            return _outcome("corrected", "bad json")

    seen: list[Any] = []
    turn = TurnInput(seq=1, session_key="console:console:private:alice", platform="console", bot_id="console",
                     message_id="c-1", scene_type="private", scene_id="alice")  # fmt: skip
    ctl = TurnControl(turn, "one-at-a-time", "one-at-a-time")
    setup = SessionSetup(model=builtin_model(), on_event=seen.append)
    reply = await finalize_reply(setup, None, [], "alice", ctl, contract=Contract())
    assert (reply, [(o.outcome, o.reason) for o in seen]) == (
        Reply.of_text("hi"),
        [("corrected", "bad json")],
    )

    def broken(event: Any) -> None:
        raise RuntimeError("console down")

    setup = SessionSetup(model=builtin_model(), on_event=broken)  # a failing hook never breaks the turn
    assert await finalize_reply(setup, None, [], "alice", ctl, contract=Contract()) == Reply.of_text("hi")


def test_tool_result_text_is_what_the_console_shows() -> None:
    from runtime.llm.types import ImageContent, TextContent, ToolResultMessage
    from runtime.platforms.console import TOOL_RESULT_PREVIEW_CHARS, tool_result_text

    mixed = ToolResultMessage(
        tool_call_id="c1",
        tool_name="shot",
        content=[TextContent(text="a"), ImageContent(data="", mime_type="image/png"), TextContent(text="b")],
    )
    assert tool_result_text(mixed) == "a\n[image image/png]\nb"
    long = ToolResultMessage(tool_call_id="c2", tool_name="t", content=[TextContent(text="y" * 2100)])
    assert tool_result_text(long) == "y" * TOOL_RESULT_PREVIEW_CHARS + "…"
    assert tool_result_text(None) == ""

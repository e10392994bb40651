"""Group chat commands (docs/decisions.md#chat-commands): ``@bot /new`` is the command, not a
message for the model; in groups and channels only masters may run ``/new`` / ``/clear`` (the
context is shared by every member, so control stays with masters), in a private
chat anyone. Real codecs parse the inbound, a real Ray-free SessionCore on SQLite answers it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from providers.faux import faux_assistant_message, faux_text, register_faux_provider
from runtime.keys import parse_session_id
from runtime.platforms.console import ConsoleCodec
from runtime.platforms.onebot11 import OneBot11Codec
from runtime.platforms.telegram import TelegramCodec
from runtime.reply.segments import Reply
from runtime.session.commands import CommandHandler, ParsedCommand, command_text
from runtime.session.core import SessionCore
from runtime.session.features import AgentFeatures
from runtime.session.turn import SessionSetup, TurnInput
from tests.session.recorder import Recorder

ONEBOT = OneBot11Codec(self_id="10001", masters=["20002"])
TELEGRAM = TelegramCodec(
    bot_id="123456789", token="123456789:AAF-test", username="my_sessionray_bot", masters=["987654321"]
)
NOT_MASTER = "Only a master of this bot may use /new."


def onebot_group(message: list[dict[str, Any]], user_id: int = 20003, message_id: int = 9001) -> TurnInput:
    event = {
        "self_id": 10001, "user_id": user_id, "time": 1756168837, "message_id": message_id,
        "message_type": "group", "group_id": 880001, "post_type": "message", "sub_type": "normal",
        "sender": {"user_id": user_id, "nickname": "n", "card": "", "role": "member"},
        "message": message, "message_format": "array",
    }  # fmt: skip
    inbound = ONEBOT.parse({}, json.dumps(event).encode())
    assert inbound is not None
    return TurnInput.from_inbound(inbound, seq=1)


def at(qq: str) -> dict[str, Any]:
    return {"type": "at", "data": {"qq": qq}}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": t}}


def telegram_group(t: str, entities: list[dict[str, Any]], user_id: int = 7200) -> TurnInput:
    msg = {
        "message_id": 77, "date": 1721592580, "chat": {"id": -100777, "type": "group", "title": "g"},
        "from": {"id": user_id, "is_bot": False, "first_name": "M"}, "text": t, "entities": entities,
    }  # fmt: skip
    inbound = TELEGRAM.parse({}, json.dumps({"update_id": 1, "message": msg}).encode())
    assert inbound is not None
    return TurnInput.from_inbound(inbound, seq=1)


def entity(kind: str, length: int) -> dict[str, Any]:
    return {"type": kind, "offset": 0, "length": length}


FEATURES = AgentFeatures(commands=CommandHandler())
NEW = ParsedCommand("new", "new", "")


def test_a_command_after_the_bots_mention_is_recognised() -> None:
    assert [
        FEATURES.command(onebot_group([at("10001"), text(" /new")])),
        FEATURES.command(onebot_group([at("10001"), text("/status")])),
        FEATURES.command(onebot_group([at("10001"), at("10001"), text(" /clear ")])),
        FEATURES.command(onebot_group([{"type": "reply", "data": {"id": "5"}}, at("10001"), text(" /new")])),
        FEATURES.command(onebot_group([text("/status "), at("10001")])),  # before the mention, as before
        FEATURES.command(telegram_group("@my_sessionray_bot /new", [entity("mention", 18)])),
        FEATURES.command(telegram_group("/new@my_sessionray_bot", [entity("bot_command", 22)])),
    ] == [
        NEW,
        ParsedCommand("status", "status", ""),
        ParsedCommand("clear", "clear", ""),
        NEW,
        ParsedCommand("status", "status", "@10001"),
        NEW,
        NEW,
    ]  # fmt: skip
    body = {
        "user": "admin",
        "scene": "group",
        "group_id": "lobby",
        "message_id": "c1",
        "text": "@console /new",
    }
    console = ConsoleCodec().parse({}, json.dumps(body).encode())
    assert console is not None
    assert FEATURES.command(TurnInput.from_inbound(console, seq=1)) == NEW


def test_only_a_real_leading_mention_of_the_bot_is_skipped() -> None:
    assert [
        FEATURES.command(onebot_group([at("20004"), text(" /new")])),  # someone else
        FEATURES.command(onebot_group([text("hey "), at("10001"), text(" /new")])),  # text first
        FEATURES.command(onebot_group([text("@10001 /new")])),  # typed, not a mention
        FEATURES.command(onebot_group([at("100012"), text(" /new")])),  # a longer id
    ] == [None, None, None, None]
    segs = [{"type": "mention", "data": {"target": "1"}}, {"type": "text", "data": {"text": "/new"}}]
    assert command_text("@1/new", segs, "1") == "/new"
    assert command_text("@10 /new", segs, "1") == "@10 /new"


async def test_group_new_is_masters_only_private_new_is_anyones(
    repo: Any, metric: Callable[..., float]
) -> None:
    model = register_faux_provider(
        [faux_assistant_message([faux_text(json.dumps({"segments": [text("hi all")]}))])],
        provider="cmd-hardening",
    )
    setup = SessionSetup(model=model.get_model(), features=AgentFeatures(commands=CommandHandler()))
    rec = Recorder()
    chat = onebot_group([at("10001"), text(" hello")], message_id=1)
    core = await SessionCore.open(chat.session_key, repo, setup, rec, max_concurrent_turns=4)
    assert (await core.submit(chat)).outcome == "ok"
    epoch = parse_session_id(core.session_id).epoch

    member_new = onebot_group([at("10001"), text(" /new")], message_id=2).model_copy(update={"seq": 2})
    assert (await core.submit(member_new)).outcome == "ok"
    assert parse_session_id(core.session_id).epoch == epoch  # nothing archived
    master_new = onebot_group([at("10001"), text(" /new")], user_id=20002, message_id=3)
    assert (await core.submit(master_new.model_copy(update={"seq": 3}))).outcome == "ok"
    assert parse_session_id(core.session_id).epoch == epoch + 1
    assert [j.reply for j in rec.jobs] == [
        Reply.of_text("hi all"),
        Reply.of_text(NOT_MASTER),
        Reply.of_text(f"New conversation started (epoch {epoch + 1}). Earlier messages are archived."),
    ]
    assert model.call_count == 1  # the commands never reached the model
    assert [
        metric("sessionray_chat_commands_total", command="new", outcome="refused"),
        metric("sessionray_chat_commands_total", command="new", outcome="ok"),
    ] == [1.0, 1.0]


async def test_handle_per_scene_type() -> None:
    class Host:
        archived = 0

        async def archive(self) -> int:
            self.archived += 1
            return 7

    h, host = CommandHandler(), Host()
    member = {"id": "42", "roles": ["member", "admin"]}
    replies = [
        await h.handle(NEW, member, host, scene_type="group"),  # type: ignore[arg-type]
        await h.handle(ParsedCommand("clear", "clear", ""), member, host, scene_type="channel"),  # type: ignore[arg-type]
        await h.handle(NEW, member, host, scene_type="private"),  # type: ignore[arg-type]
        await h.handle(NEW, {"id": "1", "roles": ["master"]}, host, scene_type="group"),  # type: ignore[arg-type]
    ]
    assert [r.preview_text() for r in replies] == [
        NOT_MASTER,
        "Only a master of this bot may use /clear.",
        "New conversation started (epoch 7). Earlier messages are archived.",
        "New conversation started (epoch 7). Earlier messages are archived.",
    ]
    assert host.archived == 2

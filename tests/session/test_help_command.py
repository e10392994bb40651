"""``/help`` lists the chat commands the sender may use there, by the names users type
(docs/decisions.md#chat-commands): masters see every command, others never /steer or /followup,
and in groups not /new or /clear either."""

from __future__ import annotations

import pytest

from runtime.session.commands import CommandHandler


async def help_text(handler: CommandHandler, roles: list[str], scene_type: str) -> str:
    cmd = handler.parse("/help")
    assert cmd is not None
    reply = await handler.handle(cmd, {"id": "7", "roles": roles}, host=None, scene_type=scene_type)  # type: ignore[arg-type]
    (segment,) = reply.segments
    return segment.data.text  # type: ignore[union-attr]


LINES = {
    "new": "/new — start a new conversation (earlier messages are archived)",
    "clear": "/clear — the same as /new",
    "models": "/models — list the configured models",
    "status": "/status — show this conversation's model, size and state",
    "usage": "/usage — show what you used and what is left of your quotas",
    "steer": "/steer — steer the running turn: /steer <text>",
    "followup": "/followup — queue a follow-up message: /followup <text>",
    "help": "/help — this list",
}


@pytest.mark.parametrize(
    ("roles", "scene_type", "shown"),
    [
        (["master"], "group", ["new", "clear", "models", "status", "usage", "steer", "followup", "help"]),
        (["master"], "private", ["new", "clear", "models", "status", "usage", "steer", "followup", "help"]),
        (["member"], "private", ["new", "clear", "models", "status", "usage", "help"]),
        (["admin"], "group", ["models", "status", "usage", "help"]),
        ([], "channel", ["models", "status", "usage", "help"]),
    ],
)
async def test_help_lists_what_the_sender_may_use(
    roles: list[str], scene_type: str, shown: list[str]
) -> None:
    text = await help_text(CommandHandler(), roles, scene_type)
    assert text.split("\n") == ["Commands you can use here:", *(LINES[c] for c in shown)]


async def test_help_uses_the_configured_names_and_texts() -> None:
    handler = CommandHandler(
        names={"new": "reset", "help": "hilfe"}, texts={"help_header": "Befehle:", "help_models": "Modelle"}
    )
    assert handler.parse("/help") is None  # renamed: /help is an ordinary message now
    cmd = handler.parse("/hilfe")
    assert cmd is not None and cmd.command == "help"
    reply = await handler.handle(cmd, {"id": "7", "roles": []}, host=None, scene_type="private")  # type: ignore[arg-type]
    assert reply.segments[0].data.text.split("\n") == [  # type: ignore[union-attr]
        "Befehle:",
        "/reset — start a new conversation (earlier messages are archived)",
        "/clear — the same as /reset",
        "/models — Modelle",
        "/status — show this conversation's model, size and state",
        "/usage — show what you used and what is left of your quotas",
        "/hilfe — this list",
    ]


def test_help_is_not_a_command_when_commands_are_off() -> None:
    assert CommandHandler(enabled=False).parse("/help") is None

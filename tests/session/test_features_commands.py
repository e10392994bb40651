"""Chat commands, Ray-free: parsing, configurable names/texts, master-only steer/followup, /models
and /status output (docs/decisions.md#chat-commands)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from runtime.config import get_model, parse_config
from runtime.reply.capability import CapabilityCache
from runtime.reply.segments import Reply
from runtime.session.commands import CommandHandler, ParsedCommand, SessionStatus

MASTER = {"id": "1", "roles": ["master"]}
MEMBER = {"id": "42", "roles": ["member"]}


@dataclass
class Host:
    epoch: int = 1
    running: int = 0
    calls: list[tuple[str, str, str]] = field(default_factory=list)

    async def archive(self) -> int:
        self.epoch += 1
        self.calls.append(("archive", "", ""))
        return self.epoch

    async def status(self) -> SessionStatus:
        return SessionStatus("p/m1", 12, self.epoch, self.running)

    def steer(self, text: str, sender_id: str) -> str:
        self.calls.append(("steer", text, sender_id))
        return "steered" if self.running else "started"

    def follow_up(self, text: str, sender_id: str) -> str:
        self.calls.append(("follow_up", text, sender_id))
        return "queued" if self.running else "started"


CONFIG = parse_config(
    {
        "ai": {
            "default_model": "local/qwen",
            "vision_model": "cloud/gpt-v",
            "providers": {
                "local": {"api": "openai-completions", "base_url": "http://127.0.0.1:1/v1",
                          "models": [{"id": "qwen", "context_window": 32768}]},
                "cloud": {"api": "anthropic-messages", "compat": {"structured_output": "tool"},
                          "models": [{"id": "gpt-v", "input": ["text", "image"], "context_window": 200000}]},
            },
            "commands": {
                "names": {"new": "reset", "followup": "fu"},
                "texts": {"not_master": "Nope, /{name} is for masters."},
            },
        }
    }
)  # fmt: skip


def test_parse_names_bot_suffix_and_plain_text() -> None:
    h = CommandHandler.from_config(CONFIG)
    assert h.parse("/reset") == ParsedCommand("new", "reset", "")
    assert h.parse("  /Clear@my_bot  ") == ParsedCommand("clear", "clear", "")
    assert h.parse("/fu  please also\nsummarize ") == ParsedCommand(
        "followup", "fu", "please also\nsummarize"
    )
    assert h.parse("/steer go left") == ParsedCommand("steer", "steer", "go left")
    assert [h.parse(t) for t in ("/new", "hello /status", "/unknown x", "status", "")] == [None] * 5
    assert CommandHandler(enabled=False).parse("/status") is None


def test_bad_command_config_is_refused() -> None:
    with pytest.raises(ValueError) as err:
        CommandHandler({"restart": "r"})
    assert str(err.value) == (
        "ai.commands.names: unknown command(s) ['restart']; known: "
        "['new', 'clear', 'models', 'status', 'usage', 'steer', 'followup', 'help']"
    )
    with pytest.raises(ValueError) as err:
        CommandHandler({"new": "status"})
    assert str(err.value) == "ai.commands.names: /status is used by both new and status"
    with pytest.raises(ValueError) as err:
        CommandHandler(texts={"hello": "x"})
    assert str(err.value).startswith("ai.commands.texts: unknown key(s) ['hello']; known: [")


async def test_new_models_status(metric: Callable[..., float]) -> None:
    cache = CapabilityCache()
    cache.record(get_model("local", "qwen", CONFIG), "native")
    h = CommandHandler.from_config(CONFIG)
    h.capabilities = cache
    host = Host(running=1)
    assert await h.handle(h.parse("/reset"), MEMBER, host) == Reply.of_text(  # type: ignore[arg-type]
        "New conversation started (epoch 2). Earlier messages are archived."
    )
    assert await h.handle(h.parse("/models"), MEMBER, host) == Reply.of_text(  # type: ignore[arg-type]
        "Configured models:\n"
        "- local/qwen (default): api openai-completions, context 32768 tokens, input text, "
        "structured output native (probe, <1 min old)\n"
        "- cloud/gpt-v (vision): api anthropic-messages, context 200000 tokens, input text+image, "
        "structured output tool (config)"
    )
    assert await h.handle(h.parse("/status"), MEMBER, host) == Reply.of_text(  # type: ignore[arg-type]
        "Model: p/m1\nMessages: 12\nEpoch: 2\nTurn running: yes"
    )
    assert host.calls == [("archive", "", "")]
    assert [
        metric("sessionray_chat_commands_total", command="new", outcome="ok"),
        metric("sessionray_chat_commands_total", command="models", outcome="ok"),
        metric("sessionray_chat_commands_total", command="status", outcome="ok"),
    ] == [1.0, 1.0, 1.0]


async def test_steer_and_followup_are_master_only(metric: Callable[..., float]) -> None:
    h = CommandHandler.from_config(CONFIG)
    host = Host(running=1)

    async def say(text: str, sender: dict) -> str:  # type: ignore[type-arg]
        reply = await h.handle(h.parse(text), sender, host)  # type: ignore[arg-type]
        return reply.preview_text()

    assert await say("/steer stop that", MEMBER) == "Nope, /steer is for masters."
    assert await say("/fu and then?", MEMBER) == "Nope, /fu is for masters."
    assert await say("/steer", MASTER) == "Usage: /steer <text>"
    assert await say("/steer stop that", MASTER) == "Steering the running turn."
    assert await say("/fu and then?", MASTER) == "Queued as a follow-up."
    host.running = 0
    assert await say("/steer idle?", MASTER) == "No turn was running; started one with your message."
    assert host.calls == [
        ("steer", "stop that", "1"),
        ("follow_up", "and then?", "1"),
        ("steer", "idle?", "1"),
    ]
    assert [
        metric("sessionray_chat_commands_total", command="steer", outcome="refused"),
        metric("sessionray_chat_commands_total", command="followup", outcome="refused"),
        metric("sessionray_chat_commands_total", command="steer", outcome="ok"),
    ] == [2.0, 1.0, 2.0]


async def test_models_lists_referenced_but_unlisted_models() -> None:
    cfg = parse_config({"ai": {"default_model": "x/unlisted", "providers": {"x": {"api": "faux"}}}})
    h = CommandHandler.from_config(cfg)
    h.capabilities = CapabilityCache()
    reply = await h.handle(h.parse("/models"), MEMBER, Host())  # type: ignore[arg-type]
    assert reply == Reply.of_text(
        "Configured models:\n- x/unlisted (default): api faux, context 128000 tokens, input text, "
        "structured output unknown"
    )
    empty = CommandHandler()
    assert await empty.handle(empty.parse("/models"), MEMBER, Host()) == Reply.of_text(  # type: ignore[arg-type]
        "No models are configured."
    )


async def test_models_lists_the_builtin_model_that_status_names() -> None:
    """No model configured: sessions run on the built-in model (actors.placement.hosts.setup passes it), and
    ``/models`` lists it as such instead of "No models are configured" while ``/status`` names it."""
    from actors.models.builtin import builtin_model

    model = builtin_model()
    h = CommandHandler.from_config(parse_config({}), builtin_model=model)
    h.capabilities = CapabilityCache()
    host = BuiltinHost()
    models = await h.handle(h.parse("/models"), MEMBER, host)  # type: ignore[arg-type]
    assert models == Reply.of_text(
        "Configured models:\n- builtin/sessionray-builtin (default, built-in offline model, not an LLM): "
        "api faux, context 32768 tokens, input text, structured output unknown"
    )
    status = await h.handle(h.parse("/status"), MEMBER, host)  # type: ignore[arg-type]
    assert status.preview_text().splitlines()[0] == f"Model: {model.ref()}"
    assert model.ref() in models.preview_text()


@dataclass
class BuiltinHost(Host):
    async def status(self) -> SessionStatus:
        from actors.models.builtin import builtin_model

        return SessionStatus(builtin_model().ref(), 0, self.epoch, self.running)

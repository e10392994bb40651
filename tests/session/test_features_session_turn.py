"""The agent features inside a real (Ray-free) session turn: SessionCore + SQLite + faux models —
vision routing with an inbound image, the fallback chain recording the answering model, tool
permissions in a group, and media provenance of the delivered reply."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from providers.faux import faux_assistant_message, faux_text, faux_tool_call, register_faux_provider
from runtime.agent.tools import AgentTool, AgentToolResult
from runtime.config.tool_permissions import ToolPermissions
from runtime.llm.types import Model, TextContent, ToolResultMessage, UserMessage
from runtime.reply.segments import Reply
from runtime.session.core import SessionCore
from runtime.session.features import AgentFeatures
from runtime.session.tool_policy import set_permissions
from runtime.session.turn import SessionSetup, TurnInput
from tests.session.recorder import Recorder

PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
FAIL = "Sorry, something went wrong while answering. Please try again."


def reply_json(*segments: dict[str, Any]) -> str:
    return json.dumps({"segments": list(segments)})


def text_seg(text: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": text}}


def image_seg(kind: str, value: str) -> dict[str, Any]:
    return {"type": "image", "data": {"media": {"kind": kind, "value": value}}}


def turn(
    key: str, text: str, *, segments: list[dict[str, Any]] | None = None, roles: list[str] | None = None
) -> TurnInput:
    platform, bot, scope, scene = key.split(":")
    return TurnInput(
        seq=1,
        session_key=key,
        platform=platform,
        bot_id=bot,
        message_id="m1",
        scene_type=scope,
        scene_id=scene,
        sender={"id": "42", "name": "Bob", "roles": roles or []},
        text=text,
        segments=segments or [text_seg(text)],
        time_ms=1_700_000_000_000,
    )


async def run_turn(repo: Any, setup: SessionSetup, t: TurnInput) -> tuple[Recorder, SessionCore]:
    rec = Recorder()
    core = await SessionCore.open(t.session_key, repo, setup, rec, max_concurrent_turns=4)
    result = await core.submit(t)
    assert result.outcome == "ok", result
    return rec, core


async def test_image_inbound_routes_to_vision_model_and_session_records_it(repo: Any) -> None:
    main = register_faux_provider([], provider="s-text", models=["text-model"])
    vision = register_faux_provider(
        [faux_assistant_message([faux_text(reply_json(text_seg("a red pixel")))])],
        provider="s-vision",
        models=[Model(id="vision-model", api="faux", input=["text", "image"])],
    )
    setup = SessionSetup(model=main.get_model(), features=AgentFeatures(vision_model=vision.get_model()))
    key = "onebot11:10001:private:42"
    rec, core = await run_turn(
        repo,
        setup,
        turn(key, "what is this?", segments=[text_seg("what is this?"), image_seg("base64", PNG_B64)]),
    )
    assert [j.reply for j in rec.jobs] == [Reply.of_text("a red pixel")]
    assert main.call_count == 0
    sent = vision.calls[0].context.messages[-1]
    assert isinstance(sent, UserMessage) and isinstance(sent.content, list)
    assert [(b.type, getattr(b, "text", None), getattr(b, "mime_type", None)) for b in sent.content] == [
        ("text", "what is this?\n[image]", None),  # its line (inline data: no reference), then the image
        ("image", None, "image/png"),
    ]
    info = await repo.get_session(core.session_id)
    assert info.model == "s-vision/vision-model"


async def test_fallback_inside_a_session_turn(repo: Any) -> None:
    main = register_faux_provider(
        [faux_assistant_message([], "error", error_message="HTTP 503: upstream down")], provider="s-main"
    )
    backup = register_faux_provider(
        [faux_assistant_message([faux_text(reply_json(text_seg("backup here")))])], provider="s-backup"
    )
    setup = SessionSetup(model=main.get_model(), features=AgentFeatures(fallback_models=[backup.get_model()]))
    rec, core = await run_turn(repo, setup, turn("onebot11:10001:private:43", "hi"))
    assert [j.reply for j in rec.jobs] == [Reply.of_text("backup here")]
    info = await repo.get_session(core.session_id)
    assert info.model == "s-backup/faux-model"


class NoArgs(BaseModel):
    pass


async def test_group_member_does_not_see_master_tool_and_forged_call_is_blocked(repo: Any) -> None:
    ran: list[str] = []

    async def shutdown(call_id: str, params: Any, signal: Any, on_update: Any) -> AgentToolResult:
        ran.append("shutdown")
        return AgentToolResult.text("bye")

    tool = set_permissions(
        AgentTool("shutdown", "Stop the bot.", NoArgs, shutdown),
        ToolPermissions(required_any_role=frozenset({"master"})),
    )
    model = register_faux_provider(
        [
            faux_assistant_message([faux_tool_call("shutdown", {}, id="forged")]),
            faux_assistant_message([faux_text(reply_json(text_seg("I cannot do that")))]),
        ],
        provider="s-policy",
    )
    setup = SessionSetup(model=model.get_model(), tools=[tool], features=AgentFeatures())
    rec, core = await run_turn(repo, setup, turn("onebot11:10001:group:777", "shut down", roles=["member"]))
    assert [j.reply for j in rec.jobs] == [Reply.of_text("I cannot do that")]
    assert [c.context.tools for c in model.calls] == [None, None]  # the model never saw it
    results = [m for m in core.writer.snapshot() if isinstance(m, ToolResultMessage)]
    assert [(r.tool_call_id, r.is_error, r.content) for r in results] == [
        (
            "forged",
            True,
            [
                TextContent(
                    text='tool "shutdown" is not available to you here: it needs one of the roles [master]'
                )
            ],
        )
    ]
    assert ran == []


async def test_reply_media_must_come_from_the_context(repo: Any) -> None:
    url = "https://cdn.example/made/1.png"

    async def draw(call_id: str, params: Any, signal: Any, on_update: Any) -> AgentToolResult:
        return AgentToolResult.text("drawn", details={"url": url})

    model = register_faux_provider(
        [
            faux_assistant_message([faux_tool_call("draw", {}, id="d1")]),
            faux_assistant_message([faux_text(reply_json(text_seg("here"), image_seg("url", url)))]),
            # second session: an invented address, and the correction repeats it
            faux_assistant_message([faux_text(reply_json(image_seg("url", "https://made.up/x.png")))]),
            faux_assistant_message([faux_text(reply_json(image_seg("url", "https://made.up/x.png")))]),
        ],
        provider="s-prov",
    )
    setup = SessionSetup(
        model=model.get_model(), tools=[AgentTool("draw", "Draw.", NoArgs, draw)], features=AgentFeatures()
    )
    rec, _ = await run_turn(repo, setup, turn("onebot11:10001:private:44", "draw"))
    assert [j.reply for j in rec.jobs] == [
        Reply.model_validate_json(reply_json(text_seg("here"), image_seg("url", url)))
    ]
    rec2, _ = await run_turn(repo, setup, turn("onebot11:10001:private:45", "show me"))
    assert [j.reply for j in rec2.jobs] == [Reply.of_text(FAIL)]
    assert model.call_count == 4


async def test_inbound_url_reference_is_shown_to_the_model_and_may_be_reused(repo: Any) -> None:
    inbound_url = "https://qq.example/in/cat.jpg"
    model = register_faux_provider(
        [faux_assistant_message([faux_text(reply_json(image_seg("url", inbound_url)))])], provider="s-inb"
    )
    setup = SessionSetup(model=model.get_model(), features=AgentFeatures())
    t = turn(
        "onebot11:10001:private:46", "again", segments=[text_seg("again"), image_seg("url", inbound_url)]
    )
    rec, _ = await run_turn(repo, setup, t)
    assert [j.reply for j in rec.jobs] == [
        Reply.model_validate_json(reply_json(image_seg("url", inbound_url)))
    ]
    # a text-only model and no vision model: the image is not fetched, the model sees its reference line
    assert model.calls[0].context.messages[-1] == UserMessage(
        content=f"again\n[image url={inbound_url}]",
        sender={"id": "42", "name": "Bob", "roles": []},
        timestamp=1_700_000_000_000,
    )


async def test_mcp_tools_in_session_turns_connect_once_and_close_on_passivation(repo: Any) -> None:
    import sys

    from runtime.config import McpServerConfig
    from runtime.session.mcp_tools import McpToolset

    server = str(Path(__file__).with_name("mcp_server.py"))
    toolset = McpToolset(
        {"calc": McpServerConfig(command=sys.executable, args=[server, "stdio"], timeout_s=60)}
    )
    model = register_faux_provider(
        [
            faux_assistant_message([faux_tool_call("calc_add", {"a": 20, "b": 22}, id="a1")]),
            faux_assistant_message([faux_text(reply_json(text_seg("42")))]),
            faux_assistant_message([faux_tool_call("calc_echo", {"text": "hi"}, id="a2")]),
            faux_assistant_message([faux_text(reply_json(text_seg("hi")))]),
        ],
        provider="s-mcp",
    )
    setup = SessionSetup(model=model.get_model(), features=AgentFeatures(mcp=toolset))
    key = "onebot11:10001:private:47"
    rec = Recorder()
    core = await SessionCore.open(key, repo, setup, rec, max_concurrent_turns=4)
    first = turn(key, "add")
    second = first.model_copy(update={"seq": 2, "message_id": "m2", "text": "echo"})
    assert [(await core.submit(t)).outcome for t in (first, second)] == ["ok", "ok"]
    assert [j.reply for j in rec.jobs] == [Reply.of_text("42"), Reply.of_text("hi")]
    results = [(m.tool_name, m.content) for m in core.writer.snapshot() if isinstance(m, ToolResultMessage)]
    assert results == [("calc_add", [TextContent(text="42")]), ("calc_echo", [TextContent(text="hi")])]
    assert (toolset.servers[0].connects, toolset.servers[0].connected) == (1, True)  # once, reused
    await core.close()  # passivation closes the connection (and the stdio subprocess)
    assert toolset.servers[0].connected is False


@pytest.mark.parametrize("features", [True, False])
async def test_a_qq_face_alone_reaches_the_model_as_its_placeholder(repo: Any, features: bool) -> None:
    """docs/decisions.md#platform-placeholders: never an empty user message."""
    answer = faux_assistant_message([faux_text(reply_json(text_seg("nice face")))])
    model = register_faux_provider([answer], provider="s-face", models=["m"])
    setup = SessionSetup(model=model.get_model(), features=AgentFeatures() if features else None)
    face = {"type": "face", "data": {"id": "14"}}
    rec, _ = await run_turn(repo, setup, turn("onebot11:10001:private:42", "", segments=[face]))
    assert [j.reply for j in rec.jobs] == [Reply.of_text("nice face")]
    assert model.calls[0].context.messages[-1].content == "[face 14]"

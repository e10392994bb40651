"""The built-in offline model (a documented function of its input) and the `sessionray chat` CLI."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from actors.cli.chat import main, run_chat
from actors.models.builtin import (
    CountArgs,
    builtin_model,
    builtin_respond,
    builtin_tools,
    set_builtin_responder,
)
from providers.faux import faux_assistant_message, faux_tool_call
from runtime import Agent, Context, ImageContent, TextContent, ToolResultMessage, UserMessage
from runtime.agent.tools import AgentToolResult
from runtime.llm.abort import AbortController
from runtime.reply.sender import convert_for_llm

ROOT = Path(__file__).resolve().parents[2]
TOOLS = [t.to_tool() for t in builtin_tools()]


def reply(*messages: object, tools: bool = True) -> object:
    msg = builtin_respond(Context(messages=list(messages), tools=TOOLS if tools else None))  # type: ignore[arg-type]
    return (msg.text(), [(c.id, c.name, c.arguments) for c in msg.tool_calls()])


def test_builtin_answers_the_users_text_without_the_group_sender_prefix() -> None:
    """In a group the LLM conversion puts ``[sender:…]`` before the text; the built-in model answers
    the user's words (runtime.reply.sender strips the prefix it renders)."""
    stored = UserMessage(
        content="hello there", sender={"id": "20002", "name": "Alice", "roles": ["member", "master"]}
    )
    (seen,) = convert_for_llm([stored], "group")
    assert (
        isinstance(seen, UserMessage)
        and seen.content == "[sender:id=20002 name=Alice roles=member,master] hello there"
    )
    assert reply(seen) == ("You said: hello there", [])
    blocks = seen.model_copy(update={"content": [TextContent(text=str(seen.content))]})
    assert reply(blocks) == ("You said: hello there", [])
    assert reply(
        convert_for_llm([stored.model_copy(update={"content": "count to 3 slowly"})], "group")[0]
    ) == (
        "",
        [("builtin-1", "count_slowly", {"to": 3})],
    )
    assert reply(UserMessage(content="count slowly please")) == (
        "",
        [("builtin-1", "count_slowly", {"to": 10})],
    )


async def test_count_slowly_counts_step_by_step_and_stops_on_abort() -> None:
    tool = next(t for t in builtin_tools() if t.name == "count_slowly")
    updates: list[str] = []
    done = await tool.execute(
        "c1", CountArgs(to=3, step_s=0), None, lambda r: updates.append(r.content[0].text)
    )
    assert (done.content[0].text, updates) == ("counted to 3: 1 2 3", ["1", "2", "3"])
    controller = AbortController()
    updates.clear()

    def abort_after_one(result: AgentToolResult) -> None:
        updates.append(result.content[0].text)
        controller.abort()

    # a 10 s step: the pause ends as soon as the signal fires (between steps), not after 10 s
    stopped = await asyncio.wait_for(
        tool.execute("c2", CountArgs(to=5, step_s=10), controller.signal, abort_after_one), 5
    )
    assert (stopped.content[0].text, updates) == ("stopped at 1 of 5 (aborted): 1", ["1"])


def test_builtin_respond_is_a_documented_function_of_the_input() -> None:
    assert reply() == (
        "Hello! I am sessionray's built-in offline model. I am not an LLM: I echo what you write, and I "
        "call the demo tools when you mention the time or a tool. Configure a provider in sessionray.yaml "
        "for real answers.",
        [],
    )
    assert reply(UserMessage(content="hello")) == ("You said: hello", [])
    assert reply(UserMessage(content="What TIME is it?")) == ("", [("builtin-1", "clock", {})])
    assert reply(UserMessage(content="a"), UserMessage(content="use a tool")) == (
        "",
        [("builtin-2", "echo", {"text": "use a tool"})],
    )
    assert reply(UserMessage(content="what time is it"), tools=False) == ("You said: what time is it", [])
    img = ImageContent(data="AA==", mime_type="image/png")
    assert reply(UserMessage(content=[TextContent(text="pic"), img, img])) == (
        "You said: pic [+2 image(s)]",
        [],
    )
    assert reply(UserMessage(content="   ")) == ("You sent no text.", [])
    results = [
        ToolResultMessage(tool_call_id="a", tool_name="clock", content=[TextContent(text="12:00")]),
        ToolResultMessage(
            tool_call_id="b", tool_name="echo", content=[TextContent(text="bad")], is_error=True
        ),
    ]
    assert reply(UserMessage(content="x"), *results) == (
        "Tool clock returned: 12:00\nTool echo failed: bad",
        [],
    )


async def test_builtin_model_with_agent_and_replaceable_responder() -> None:
    model = builtin_model()
    assert (model.api, model.provider, model.id) == ("faux", "builtin", "sessionray-builtin")
    assert builtin_model() == model  # idempotent
    agent = Agent(model=model, tools=builtin_tools())
    await agent.prompt("say tool")
    assert [(m.role, getattr(m, "stop_reason", None)) for m in agent.state.messages] == [
        ("user", None),
        ("assistant", "toolUse"),
        ("toolResult", None),
        ("assistant", "stop"),
    ]
    assert agent.state.messages[-1].text() == "Tool echo returned: say tool"  # type: ignore[union-attr]
    set_builtin_responder(lambda ctx, opts: faux_assistant_message('{"ok": true}'))
    try:
        await agent.prompt("anything")
        assert agent.state.messages[-1].text() == '{"ok": true}'  # type: ignore[union-attr]
    finally:
        set_builtin_responder(None)
    await agent.prompt("back to echo")
    assert agent.state.messages[-1].text() == "You said: back to echo"  # type: ignore[union-attr]


def test_a_steered_message_gets_the_turns_tool_results_with_its_answer() -> None:
    """docs/providers.md#the-built-in-model: a user message steered in after the running turn's
    tool results is answered together with them, so what the tools did reaches the user (the
    README's steer demo); a steer that asks for a tool reports every result of the turn at its end."""
    asked = UserMessage(content="count to 3 slowly")
    call = faux_assistant_message([faux_tool_call("count_slowly", {"to": 3}, id="builtin-1")])
    counted = ToolResultMessage(
        tool_call_id="builtin-1", tool_name="count_slowly", content=[TextContent(text="counted to 3: 1 2 3")]
    )
    assert reply(asked, call, counted, UserMessage(content="then say goodbye")) == (
        "Tool count_slowly returned: counted to 3: 1 2 3\nYou said: then say goodbye",
        [],
    )
    assert reply(asked, call, counted, UserMessage(content="also tell me the time")) == (
        "",
        [("builtin-4", "clock", {})],
    )
    clock_call = faux_assistant_message([faux_tool_call("clock", {}, id="builtin-4")])
    clock = ToolResultMessage(
        tool_call_id="builtin-4", tool_name="clock", content=[TextContent(text="12:00")]
    )
    steered = UserMessage(content="also tell me the time")
    assert reply(asked, call, counted, steered, clock_call, clock) == (
        "Tool count_slowly returned: counted to 3: 1 2 3\nTool clock returned: 12:00",
        [],
    )
    earlier = faux_assistant_message("Tool count_slowly returned: counted to 3: 1 2 3")  # a finished turn
    assert reply(asked, call, counted, earlier, UserMessage(content="hi")) == ("You said: hi", [])


async def test_steering_the_builtin_model_mid_count_reports_the_count() -> None:
    """The README's tour on the real agent loop: a steer sent while ``count_slowly`` runs."""
    agent = Agent(model=builtin_model(), tools=builtin_tools())

    def steer_once_counting(event: object, signal: object) -> None:
        if getattr(event, "type", None) == "tool_execution_start":
            agent.steer("then say goodbye")

    agent.subscribe(steer_once_counting)
    await agent.prompt("count to 1 slowly")
    assert agent.state.messages[-1].text() == (  # type: ignore[union-attr]
        "Tool count_slowly returned: counted to 1: 1\nYou said: then say goodbye"
    )


async def test_clock_tool_bad_zone_is_an_error_result() -> None:
    from providers.faux import register_faux_provider
    from runtime.agent.loop import AgentContext, AgentLoopConfig, agent_loop

    h = register_faux_provider(
        [
            faux_assistant_message([faux_tool_call("clock", {"timezone": "Mars/Base"}, id="c")]),
            faux_assistant_message("ok"),
        ]
    )
    ends = [
        ev
        async for ev in agent_loop(
            [UserMessage(content="t")],
            AgentContext(tools=builtin_tools()),
            AgentLoopConfig(model=h.get_model()),
        )
        if ev.type == "tool_execution_end"
    ]
    assert [(ev.is_error, ev.result.content) for ev in ends] == [
        (True, [TextContent(text="Tool 'clock' failed: ValueError: unknown time zone 'Mars/Base'")])
    ]


async def test_run_chat_in_process() -> None:
    agent = Agent(model=builtin_model(), tools=builtin_tools())
    out = io.StringIO()
    code = await run_chat(agent, io.StringIO("hi\n\n/help\nplease use a tool\n/reset\nagain\n"), out)
    assert code == 0
    assert out.getvalue() == (
        "bot> You said: hi\n"
        "commands: /quit or /exit (or Ctrl-D) to leave, /reset to forget the conversation, /help\n"
        '[tool echo {"text": "please use a tool"}]\n'
        "[tool echo -> please use a tool]\n"
        "bot> Tool echo returned: please use a tool\n"
        "[conversation cleared]\n"
        "bot> You said: again\n"
    )
    assert [m.role for m in agent.state.messages] == ["user", "assistant"]


def _chat(stdin: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "actors.cli.chat", *args],
        input=stdin,
        text=True,
        capture_output=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )


def test_chat_cli_subprocess_quit_and_eof(tmp_path: Path) -> None:
    done = _chat("hello\nwhat time is it\n/quit\nnot read\n", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert lines[0] == "bot> You said: hello"
    assert lines[1] == "[tool clock {}]"
    assert re.fullmatch(r"\[tool clock -> \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00\]", lines[2])
    assert lines[3] == "bot> Tool clock returned: " + lines[2][len("[tool clock -> ") : -1]
    assert len(lines) == 4

    eof = _chat("bye", cwd=tmp_path)  # no newline, then Ctrl-D (end of input)
    assert (eof.returncode, eof.stdout, eof.stderr) == (0, "bot> You said: bye\n", "")


def test_chat_cli_help_and_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: sessionray chat [-h] [--config PATH] [--builtin]")
    assert "NOT an LLM" in " ".join(out.split())
    missing = tmp_path / "missing.yaml"
    assert main(["--config", str(missing)]) == 2
    assert capsys.readouterr() == ("", f"sessionray chat: {missing}: configuration file not found\n")

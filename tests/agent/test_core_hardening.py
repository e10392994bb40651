"""Bad input at the agent core: broken tool-argument JSON, wrong return types from tools and hooks,
huge arguments, listeners that raise, malformed prompts and queue items. Each must end as a clear
error with nothing lost (docs/decisions.md#agent-tool-errors-contained)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from providers.faux import faux_assistant_message, faux_tool_call, register_faux_provider
from runtime import (
    Agent,
    AgentTool,
    AssistantMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    validate_tool_call,
)
from runtime.agent.config import AfterToolCallResult, BeforeToolCallResult
from runtime.agent.tools import MAX_ARGUMENTS_ECHO_CHARS, AgentToolResult, ToolValidationError


class TextArgs(BaseModel):
    text: str


ran: list[str] = []


async def echo_exec(call_id: str, params: TextArgs, signal: Any, on_update: Any) -> str:
    ran.append(params.text)
    return f"echo: {params.text}"


ECHO = AgentTool("echo", "Echo.", TextArgs, echo_exec)


def d(m: Any) -> tuple[Any, ...]:
    if isinstance(m, UserMessage):
        return ("user", m.content if isinstance(m.content, str) else [b.type for b in m.content])
    if isinstance(m, AssistantMessage):
        return ("assistant", m.stop_reason, m.text(), m.error_message)
    if isinstance(m, ToolResultMessage):
        return (
            "toolResult",
            m.tool_call_id,
            m.is_error,
            "".join(b.text for b in m.content if b.type == "text"),
        )
    return (type(m).__name__,)


async def run_one_call(call: ToolCall, tools: list[AgentTool[Any]], **agent_kw: Any) -> list[tuple[Any, ...]]:
    h = register_faux_provider([faux_assistant_message([call]), faux_assistant_message("ok")], chunk_size=5)
    agent = Agent(model=h.get_model(), tools=tools, **agent_kw)
    await agent.prompt("go")
    assert not agent.state.is_streaming
    return [d(m) for m in agent.state.messages]


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ('{"text": "abc', "tool arguments are not valid JSON (Unterminated string starting at)"),
        ('{"text": "abc"}}', "tool arguments are not valid JSON (Extra data)"),
        ("[1, 2]", "tool arguments must be a JSON object, got list"),
    ],
)
async def test_broken_argument_json_is_refused_not_run_on_a_guess(raw: str, why: str) -> None:
    ran.clear()
    msgs = await run_one_call(faux_tool_call("echo", raw, id="c"), [ECHO])
    text = f'Validation failed for tool "echo":\n  - (arguments): {why}: {raw!r}\nReceived arguments: {raw}'
    assert msgs == [
        ("user", "go"),
        ("assistant", "toolUse", "", None),
        ("toolResult", "c", True, text),
        ("assistant", "stop", "ok", None),
    ]
    assert ran == []  # the tool never ran on the best-effort partial parse


async def test_marked_call_keeps_its_partial_parse_and_equality() -> None:
    h = register_faux_provider([faux_assistant_message([faux_tool_call("echo", '{"text": "ab', id="p")])])
    from runtime import Context, complete

    msg = await complete(h.get_model(), Context(messages=[UserMessage(content="x")]))
    call = msg.tool_calls()[0]
    assert (call.arguments, call.raw_arguments) == ({"text": "ab"}, '{"text": "ab')
    assert (
        call.arguments_error
        == 'tool arguments are not valid JSON (Unterminated string starting at): \'{"text": "ab\''
    )
    assert call == ToolCall(
        id="p", name="echo", arguments={"text": "ab"}
    )  # the mark is not part of the value
    with pytest.raises(ToolValidationError, match=r"\(arguments\): tool arguments are not valid JSON"):
        validate_tool_call([ECHO], call)


def test_huge_received_arguments_are_cut_in_the_error_text() -> None:
    call = ToolCall(id="h", name="echo", arguments={"txt": "x" * 100_000})
    with pytest.raises(ToolValidationError) as info:
        validate_tool_call([ECHO], call)
    dumped = '{"txt": "' + "x" * 100_000 + '"}'
    assert str(info.value) == (
        'Validation failed for tool "echo":\n  - text: Field required\n'
        f"Received arguments: {dumped[:MAX_ARGUMENTS_ECHO_CHARS]}… (cut; {len(dumped)} characters in all)"
    )
    assert info.value.arguments == {"txt": "x" * 100_000}  # the exception keeps them whole


async def _returns_none(call_id: str, params: TextArgs, signal: Any, on_update: Any) -> Any:
    return None


async def _returns_bad_blocks(call_id: str, params: TextArgs, signal: Any, on_update: Any) -> Any:
    return AgentToolResult(content=["not a block"])  # type: ignore[list-item]


def _sync_tool(call_id: str, params: TextArgs, signal: Any, on_update: Any) -> str:
    return f"sync {params.text}"


@pytest.mark.parametrize(
    ("execute", "expected"),
    [
        (_returns_none, (True, "Tool 'echo' returned NoneType; expected AgentToolResult or str")),
        (
            _returns_bad_blocks,
            (
                True,
                "Tool 'echo' returned invalid content: content.0: Input should be a valid dictionary or "
                "object to extract fields from (1 error(s))",
            ),
        ),
        (_sync_tool, (False, "sync a")),
    ],
)
async def test_wrong_tool_return_types_become_error_results(execute: Any, expected: tuple[bool, str]) -> None:
    tool = AgentTool("echo", "", TextArgs, execute)
    msgs = await run_one_call(faux_tool_call("echo", {"text": "a"}, id="t"), [tool])
    assert msgs == [
        ("user", "go"),
        ("assistant", "toolUse", "", None),
        ("toolResult", "t", *expected),
        ("assistant", "stop", "ok", None),
    ]


@pytest.mark.parametrize(
    ("hooks", "text"),
    [
        (
            {"before_tool_call": lambda c, s: True},
            "before_tool_call returned bool for 'echo'; expected BeforeToolCallResult or None",
        ),
        (
            {"after_tool_call": lambda c, s: {"is_error": False}},
            "after_tool_call returned dict for 'echo'; expected AfterToolCallResult or None",
        ),
        (
            {"after_tool_call": lambda c, s: AfterToolCallResult(content=[42])},
            "Tool 'echo' returned invalid content: content.0: Input should be a valid dictionary or "
            "object to extract fields from (1 error(s))",
        ),
        (
            {"before_tool_call": lambda c, s: BeforeToolCallResult(block=True)},
            "Tool call 'echo' was blocked.",
        ),
    ],
)
async def test_wrong_hook_results_become_error_results(hooks: dict[str, Any], text: str) -> None:
    msgs = await run_one_call(faux_tool_call("echo", {"text": "a"}, id="t"), [ECHO], **hooks)
    assert msgs == [
        ("user", "go"),
        ("assistant", "toolUse", "", None),
        ("toolResult", "t", True, text),
        ("assistant", "stop", "ok", None),
    ]


async def test_listener_failing_on_the_prompt_keeps_the_prompt_and_stops_the_stream() -> None:
    h = register_faux_provider([faux_assistant_message("x" * 50)], chunk_size=1)
    agent = Agent(model=h.get_model())

    def bad(event: Any, signal: Any) -> None:
        if event.type == "message_start" and isinstance(event.message, UserMessage):
            raise RuntimeError("boom")

    agent.subscribe(bad)
    await agent.prompt("keep me")
    assert [d(m) for m in agent.state.messages] == [
        ("user", "keep me"),
        ("assistant", "error", "", "RuntimeError: boom"),
    ]
    assert (agent.state.error, agent.state.is_streaming, h.call_count) == ("RuntimeError: boom", False, 0)


async def test_listener_failing_mid_stream_aborts_the_provider_call() -> None:
    h = register_faux_provider([faux_assistant_message("y" * 400)], chunk_size=1)
    agent = Agent(model=h.get_model())
    signals: list[Any] = []

    def bad(event: Any, signal: Any) -> None:
        if event.type == "message_update":
            signals.append(signal)
            raise ValueError("update bug")

    agent.subscribe(bad)
    await agent.prompt("x")
    assert [d(m) for m in agent.state.messages] == [
        ("user", "x"),
        ("assistant", "error", "", "ValueError: update bug"),
    ]
    assert (signals[0].aborted, signals[0].reason) == (True, "run failed: ValueError: update bug")


async def test_listener_failing_on_agent_end_keeps_the_finished_run() -> None:
    h = register_faux_provider([faux_assistant_message("fine")])
    agent = Agent(model=h.get_model())
    ends: list[str] = []

    def bad(event: Any, signal: Any) -> None:
        if event.type == "agent_end":
            ends.append(event.reason)
            raise ValueError("end bug")

    agent.subscribe(bad)
    await agent.prompt("x")  # does not raise
    assert [d(m) for m in agent.state.messages] == [("user", "x"), ("assistant", "stop", "fine", None)]
    assert (ends, agent.state.error, agent.state.is_streaming) == (["stop"], "ValueError: end bug", False)


async def test_malformed_prompts_and_queue_items_are_refused_up_front() -> None:
    h = register_faux_provider([faux_assistant_message("a"), faux_assistant_message("b")])
    agent = Agent(model=h.get_model())
    with pytest.raises(TypeError, match=r"prompt takes agent messages \(UserMessage, .*\), got str$"):
        await agent.prompt(["hello"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="prompt takes text, an agent message or a list of them, got dict"):
        await agent.prompt({"role": "user", "content": "hi"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="images= goes with a text prompt"):
        await agent.prompt(UserMessage(content="x"), images=[])  # empty: allowed
        await agent.prompt(UserMessage(content="x"), images=[object()])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"steer takes text or an agent message \(.*\), got int$"):
        agent.steer(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"follow_up takes text or an agent message \(.*\), got dict$"):
        agent.follow_up({"role": "user"})  # type: ignore[arg-type]
    agent.steer("steered as text")
    agent.follow_up("followed as text")
    assert [d(m) for m in agent.state.messages] == [("user", "x"), ("assistant", "stop", "a", None)]
    await agent.prompt("p")
    assert [d(m) for m in agent.state.messages][2:] == [
        ("user", "p"),
        ("user", "steered as text"),
        ("assistant", "stop", "b", None),
        ("user", "followed as text"),
        (
            "assistant",
            "error",
            "",
            "faux provider 'faux': no scripted response left for call #3 "
            "(script more with set_responses/append_responses)",
        ),
    ]


async def test_abort_before_start_after_end_and_twice() -> None:
    h = register_faux_provider([faux_assistant_message("one"), faux_assistant_message("two")])
    agent = Agent(model=h.get_model())
    agent.abort()
    agent.abort("twice")  # idle: no-op, nothing remembered
    await agent.prompt("a")
    agent.abort()
    agent.abort()

    def abort_at_start(event: Any, signal: Any) -> None:
        if event.type == "agent_start":
            agent.abort("early")
            agent.abort("again")  # the first reason wins

    unsubscribe = agent.subscribe(abort_at_start)
    await agent.prompt("b")
    unsubscribe()
    await agent.prompt("c")
    assert [d(m) for m in agent.state.messages] == [
        ("user", "a"),
        ("assistant", "stop", "one", None),
        ("user", "b"),
        ("assistant", "aborted", "", "early"),
        ("user", "c"),
        ("assistant", "stop", "two", None),
    ]
    assert h.call_count == 2  # the aborted run never called the model
    assert [[d(m) for m in c.context.messages] for c in h.calls][1] == [
        ("user", "a"),
        ("assistant", "stop", "one", None),
        ("user", "b"),
        ("user", "c"),
    ]


async def test_concurrent_prompts_one_runs_the_other_is_told_to_steer() -> None:
    h = register_faux_provider([faux_assistant_message("only")])
    agent = Agent(model=h.get_model())
    results = await asyncio.gather(agent.prompt("1"), agent.prompt("2"), return_exceptions=True)
    assert results[0] is None
    assert isinstance(results[1], RuntimeError) and "Use steer() or follow_up()" in str(results[1])
    assert [d(m) for m in agent.state.messages] == [("user", "1"), ("assistant", "stop", "only", None)]


def test_text_block_helper_is_plain() -> None:
    assert TextContent(text="x").model_dump() == {"type": "text", "text": "x", "text_signature": None}


async def test_unregister_api_providers_removes_only_its_source() -> None:
    from providers.faux import _stream, _stream_simple
    from runtime.llm.registry import (
        UnknownApiError,
        list_api_providers,
        register_api_provider,
        unregister_api_providers,
    )
    from runtime.llm.stream import stream
    from runtime.llm.types import Context, Model

    before = list_api_providers()
    register_api_provider("review-a", _stream, _stream_simple, source_id="review")
    register_api_provider("review-b", _stream, _stream_simple, source_id="review")
    assert list_api_providers() == sorted([*before, "review-a", "review-b"])
    assert unregister_api_providers("review") == 2
    assert unregister_api_providers("review") == 0
    assert list_api_providers() == before
    with pytest.raises(UnknownApiError, match=r"no provider registered for api 'review-a'; registered: "):
        stream(Model(id="m", api="review-a"), Context())


async def test_loop_config_and_queue_hooks_refuse_bad_values() -> None:
    from runtime import AgentLoopConfig, agent_loop
    from runtime.agent.config import AgentContext

    h = register_faux_provider([faux_assistant_message("a")])
    with pytest.raises(ValueError, match=r"^max_iterations must be >= 1 or None, got 0$"):
        AgentLoopConfig(model=h.get_model(), max_iterations=0)
    with pytest.raises(ValueError, match=r"^tool_execution must be 'parallel' or 'sequential', got 'both'$"):
        AgentLoopConfig(model=h.get_model(), tool_execution="both")  # type: ignore[arg-type]
    agent = Agent(model=h.get_model(), max_iterations=0)
    with pytest.raises(ValueError, match="max_iterations must be >= 1"):
        await agent.prompt("x")
    assert (agent.state.messages, agent.state.is_streaming, h.call_count) == ([], False, 0)

    config = AgentLoopConfig(model=h.get_model(), get_follow_up_messages=lambda: (UserMessage(content="t"),))
    h.set_responses([faux_assistant_message("one"), faux_assistant_message("two")])
    ends = [
        ev
        async for ev in agent_loop([UserMessage(content="q")], AgentContext(), config)
        if ev.type == "agent_end"
    ]
    # a tuple is accepted (it used to be dropped silently); the hook keeps returning it, so the
    # run goes on until the script runs dry
    assert [d(m) for m in ends[0].messages][:4] == [
        ("user", "q"),
        ("assistant", "stop", "one", None),
        ("user", "t"),
        ("assistant", "stop", "two", None),
    ]
    bad = AgentLoopConfig(model=h.get_model(), get_steering_messages=lambda: "not a list")
    h.set_responses([faux_assistant_message("x")])
    with pytest.raises(
        TypeError, match=r"^steering/follow-up hook returned str; expected a list of messages$"
    ):
        async for _ in agent_loop([UserMessage(content="q")], AgentContext(), bad):
            pass


async def test_reset_while_running_is_refused() -> None:
    gate = asyncio.Event()

    async def slow(context: Any, options: Any) -> AssistantMessage:
        await gate.wait()
        return faux_assistant_message("late")

    h = register_faux_provider([slow])
    agent = Agent(model=h.get_model())
    run = asyncio.create_task(agent.prompt("x"))
    while h.call_count == 0:
        await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match=r"^cannot reset while a run is in progress"):
        agent.reset()
    gate.set()
    await run
    assert [d(m) for m in agent.state.messages] == [("user", "x"), ("assistant", "stop", "late", None)]
    agent.reset()
    assert agent.state.messages == []


async def test_listener_failing_before_the_prompt_is_added_keeps_prompt_and_queue() -> None:
    h = register_faux_provider([faux_assistant_message("a"), faux_assistant_message("b")])
    agent = Agent(model=h.get_model())
    fail_on = {"agent_start"}

    def bad(event: Any, signal: Any) -> None:
        if event.type in fail_on:
            fail_on.discard(event.type)
            raise RuntimeError(f"{event.type} bug")

    agent.subscribe(bad)
    agent.steer("steer me")
    await agent.prompt("first")
    assert [d(m) for m in agent.state.messages] == [
        ("user", "first"),
        ("assistant", "error", "", "RuntimeError: agent_start bug"),
    ]
    assert agent.has_queued_messages()  # the steering message was never taken
    # now fail on the turn_start that follows the steering poll of the first turn
    fail_on.add("turn_start")
    agent.state.messages.clear()
    agent.follow_up("later")
    await agent.prompt("second")
    # turn_start is emitted before the prompt is added and before steering is polled, so the
    # steering message is still queued; the prompt is kept
    assert [d(m) for m in agent.state.messages] == [
        ("user", "second"),
        ("assistant", "error", "", "RuntimeError: turn_start bug"),
    ]
    await agent.prompt("third")
    assert [d(m) for m in agent.state.messages][2:] == [
        ("user", "third"),
        ("user", "steer me"),
        ("assistant", "stop", "a", None),
        ("user", "later"),
        ("assistant", "stop", "b", None),
    ]


async def test_steering_taken_but_never_added_goes_back_to_its_queue() -> None:
    h = register_faux_provider(
        [faux_assistant_message([faux_tool_call("echo", {"text": "1"}, id="e")]), faux_assistant_message("z")]
    )
    agent = Agent(model=h.get_model(), tools=[ECHO], steering_mode="all")
    state = {"armed": False}

    def bad(event: Any, signal: Any) -> None:
        if event.type == "tool_execution_end":
            agent.steer("s1")
            agent.steer("s2")
            state["armed"] = True
        elif event.type == "turn_start" and state["armed"]:
            raise RuntimeError("turn_start bug")  # after the steering poll took s1 and s2

    agent.subscribe(bad)
    await agent.prompt("go")
    assert [d(m) for m in agent.state.messages] == [
        ("user", "go"),
        ("assistant", "toolUse", "", None),
        ("toolResult", "e", False, "echo: 1"),
        ("assistant", "error", "", "RuntimeError: turn_start bug"),
    ]
    assert [d(m) for m in agent._steering] == [("user", "s1"), ("user", "s2")]


async def test_huge_streamed_arguments_are_not_reparsed_on_every_delta(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import runtime.llm.builder as builder
    from runtime import Context, complete

    calls: list[int] = []
    real = builder.parse_partial_json

    def counting(text: str) -> dict[str, Any]:
        calls.append(len(text))
        return real(text)

    monkeypatch.setattr(builder, "parse_partial_json", counting)
    big = "y" * 1_000_000
    h = register_faux_provider(
        [faux_assistant_message([faux_tool_call("echo", {"text": big}, id="b")])], chunk_size=1000
    )
    msg = await complete(h.get_model(), Context(messages=[UserMessage(content="x")]))
    assert msg.tool_calls()[0].arguments == {"text": big}
    assert calls[:3] == [1000, 2000, 3000]  # small: every delta
    assert 64 < len(calls) < 64 + 40  # 1 MB in 1,000 deltas: ~90 parses instead of 1,000


def test_chat_entry_point_runs_on_uvloop(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """uvloop is the event loop of the ``sessionray chat`` entry point."""
    import io
    import sys

    import uvloop

    import actors.cli.chat as chat_cli

    seen: list[type] = []
    real = chat_cli.run_chat

    async def recording(agent: Any, stdin: Any, stdout: Any, *, interactive: bool = False) -> int:
        seen.append(type(asyncio.get_running_loop()))
        return await real(agent, stdin, stdout, interactive=interactive)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(chat_cli, "run_chat", recording)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hi\n/quit\n"))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    assert chat_cli.main(["--builtin"]) == 0
    assert (seen, out.getvalue()) == ([uvloop.Loop], "bot> You said: hi\n")


async def test_cancelling_prompt_aborts_the_provider_call() -> None:
    h = register_faux_provider([faux_assistant_message("z" * 100)], chunk_size=1, chunk_delay_s=30.0)
    agent = Agent(model=h.get_model())
    started = asyncio.Event()
    agent.subscribe(lambda ev, sig: started.set() if ev.type == "message_update" else None)
    run = asyncio.create_task(agent.prompt("x"))
    await started.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    options = h.calls[0].options
    assert options is not None and options.signal is not None
    assert (options.signal.aborted, options.signal.reason) == (True, "cancelled")
    assert (agent.state.is_streaming, [d(m) for m in agent.state.messages]) == (False, [("user", "x")])

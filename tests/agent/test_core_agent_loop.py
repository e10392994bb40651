"""agent_loop / agent_loop_continue with the faux model: whole event sequences and final contexts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from providers.faux import (
    FauxProviderHandle,
    faux_assistant_message,
    faux_text,
    faux_thinking,
    faux_tool_call,
    register_faux_provider,
)
from runtime import (
    AbortController,
    AbortSignal,
    AgentLoopConfig,
    AgentTool,
    AssistantMessage,
    CustomMessage,
    Model,
    StreamOptions,
    TextContent,
    ToolResultMessage,
    UserMessage,
    agent_loop,
    agent_loop_continue,
)
from runtime.agent.config import AfterToolCallResult, AgentContext, BeforeToolCallResult
from runtime.agent.tools import AgentToolResult

# --------------------------------------------------------------------------- helpers


def text_of(m: Any) -> str:
    if isinstance(m, UserMessage):
        return (
            m.content
            if isinstance(m.content, str)
            else "".join(b.text for b in m.content if isinstance(b, TextContent))
        )
    if isinstance(m, AssistantMessage):
        return m.text()
    return "".join(b.text for b in m.content if isinstance(b, TextContent))


def d(m: Any) -> tuple[Any, ...]:
    """Describe a message as a whole comparable value."""
    if isinstance(m, UserMessage):
        return ("user", text_of(m))
    if isinstance(m, AssistantMessage):
        return ("assistant", m.stop_reason, text_of(m), [(c.id, c.name, c.arguments) for c in m.tool_calls()])
    if isinstance(m, ToolResultMessage):
        return ("toolResult", m.tool_call_id, m.is_error, text_of(m))
    return ("custom", m.custom_type)


def e(ev: Any) -> tuple[Any, ...]:
    """Describe an agent event at the moment it is received."""
    t = ev.type
    if t in ("message_start", "message_end"):
        if t == "message_start" and isinstance(ev.message, AssistantMessage):
            return (t, "assistant")
        return (t, d(ev.message))
    if t == "message_update":
        return (t, ev.assistant_message_event.type)
    if t == "tool_execution_start":
        return (t, ev.tool_call_id, ev.args)
    if t == "tool_execution_update":
        return (t, ev.tool_call_id, text_of(ev.partial_result))
    if t == "tool_execution_end":
        return (t, ev.tool_call_id, ev.is_error, text_of(ev.result))
    if t == "turn_end":
        return (t, d(ev.message), [r.tool_call_id for r in ev.tool_results])
    if t == "agent_end":
        return (t, ev.reason, [d(m) for m in ev.messages])
    return (t,)


async def run(it: Any) -> list[tuple[Any, ...]]:
    return [e(ev) async for ev in it]


def user(text: str) -> UserMessage:
    return UserMessage(content=text)


TEXT_UPDATES = [
    ("message_update", "text_start"),
    ("message_update", "text_delta"),
    ("message_update", "text_end"),
]


def tool_updates(n_calls: int) -> list[tuple[str, str]]:
    one = [
        ("message_update", "toolcall_start"),
        ("message_update", "toolcall_delta"),
        ("message_update", "toolcall_end"),
    ]
    return one * n_calls


class EchoArgs(BaseModel):
    text: str


class CountArgs(BaseModel):
    n: int


class NoArgs(BaseModel):
    pass


async def echo_exec(
    call_id: str, params: EchoArgs, signal: AbortSignal | None, on_update: Any
) -> AgentToolResult:
    return AgentToolResult.text(f"echo: {params.text}", details={"len": len(params.text)})


ECHO = AgentTool("echo", "Echo text.", EchoArgs, echo_exec)


def faux(*steps: Any, **kw: Any) -> FauxProviderHandle:
    return register_faux_provider(list(steps), chunk_size=1000, **kw)


def cfg(h: FauxProviderHandle, **kw: Any) -> AgentLoopConfig:
    return AgentLoopConfig(model=h.get_model(), **kw)


# --------------------------------------------------------------------------- tests


async def test_text_only_turn() -> None:
    h = faux(faux_assistant_message("Hello there"))
    ctx = AgentContext(system_prompt="be brief", messages=[])
    events = await run(agent_loop([user("hi")], ctx, cfg(h)))
    answer = ("assistant", "stop", "Hello there", [])
    assert events == [
        ("agent_start",),
        ("turn_start",),
        ("message_start", ("user", "hi")),
        ("message_end", ("user", "hi")),
        ("message_start", "assistant"),
        *TEXT_UPDATES,
        ("message_end", answer),
        ("turn_end", answer, []),
        ("agent_end", "stop", [("user", "hi"), answer]),
    ]
    assert ctx.messages == []  # the caller's context is not mutated
    sent = h.calls[0].context
    assert (sent.system_prompt, [d(m) for m in sent.messages], sent.tools) == (
        "be brief",
        [("user", "hi")],
        None,
    )


async def test_tool_call_then_final_answer() -> None:
    h = faux(
        faux_assistant_message([faux_text("let me echo"), faux_tool_call("echo", {"text": "x"}, id="c1")]),
        faux_assistant_message("done: echo: x"),
    )
    ctx = AgentContext(messages=[], tools=[ECHO])
    events = await run(agent_loop([user("echo x")], ctx, cfg(h)))
    first = ("assistant", "toolUse", "let me echo", [("c1", "echo", {"text": "x"})])
    result = ("toolResult", "c1", False, "echo: x")
    final = ("assistant", "stop", "done: echo: x", [])
    assert events == [
        ("agent_start",),
        ("turn_start",),
        ("message_start", ("user", "echo x")),
        ("message_end", ("user", "echo x")),
        ("message_start", "assistant"),
        *TEXT_UPDATES,
        *tool_updates(1),
        ("message_end", first),
        ("tool_execution_start", "c1", {"text": "x"}),
        ("tool_execution_end", "c1", False, "echo: x"),
        ("message_start", result),
        ("message_end", result),
        ("turn_end", first, ["c1"]),
        ("turn_start",),
        ("message_start", "assistant"),
        *TEXT_UPDATES,
        ("message_end", final),
        ("turn_end", final, []),
        ("agent_end", "stop", [("user", "echo x"), first, result, final]),
    ]
    second = h.calls[1].context
    assert [d(m) for m in second.messages] == [("user", "echo x"), first, result]
    assert second.tools is not None and [t.model_dump() for t in second.tools] == [
        {
            "name": "echo",
            "description": "Echo text.",
            "parameters": {
                "properties": {"text": {"title": "Text", "type": "string"}},
                "required": ["text"],
                "title": "EchoArgs",
                "type": "object",
            },
        }
    ]
    results = [m for m in second.messages if isinstance(m, ToolResultMessage)]
    assert results[0].details == {"len": 1}


class SpinArgs(BaseModel):
    spins: int


async def spin_exec(call_id: str, params: SpinArgs, signal: AbortSignal | None, on_update: Any) -> str:
    for _ in range(params.spins):  # yields to the event loop: a longer tool, without wall-clock timing
        await asyncio.sleep(0)
    return f"spun {params.spins}"


SPIN = AgentTool("spin", "Spin.", SpinArgs, spin_exec)


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
async def test_parallel_vs_sequential_ordering(mode: str) -> None:
    h = faux(
        faux_assistant_message(
            [
                faux_tool_call("spin", {"spins": 50}, id="slow"),
                faux_tool_call("spin", {"spins": 0}, id="fast"),
            ]
        ),
        faux_assistant_message("ok"),
    )
    events = await run(agent_loop([user("go")], AgentContext(tools=[SPIN]), cfg(h, tool_execution=mode)))
    tool_events = [
        ev
        for ev in events
        if ev[0].startswith("tool_execution") or (ev[0] == "message_end" and ev[1][0] == "toolResult")
    ]
    slow_res = ("toolResult", "slow", False, "spun 50")
    fast_res = ("toolResult", "fast", False, "spun 0")
    if mode == "parallel":
        assert tool_events == [
            ("tool_execution_start", "slow", {"spins": 50}),
            ("tool_execution_start", "fast", {"spins": 0}),
            ("tool_execution_end", "fast", False, "spun 0"),
            ("tool_execution_end", "slow", False, "spun 50"),
            ("message_end", slow_res),
            ("message_end", fast_res),
        ]
    else:
        assert tool_events == [
            ("tool_execution_start", "slow", {"spins": 50}),
            ("tool_execution_end", "slow", False, "spun 50"),
            ("tool_execution_start", "fast", {"spins": 0}),
            ("tool_execution_end", "fast", False, "spun 0"),
            ("message_end", slow_res),
            ("message_end", fast_res),
        ]
    assert [d(m) for m in h.calls[1].context.messages][-2:] == [slow_res, fast_res]


async def test_invalid_arguments_error_result_then_corrected_call() -> None:
    h = faux(
        faux_assistant_message([faux_tool_call("count", {"n": "many", "extra": 1}, id="bad")]),
        faux_assistant_message([faux_tool_call("count", {"n": "500"}, id="good")]),
        faux_assistant_message("counted"),
    )

    async def count_exec(call_id: str, params: CountArgs, signal: Any, on_update: Any) -> str:
        return f"n={params.n!r}"

    tool = AgentTool("count", "Count.", CountArgs, count_exec)
    events = await run(agent_loop([user("count")], AgentContext(tools=[tool]), cfg(h)))
    error_text = (
        'Validation failed for tool "count":\n'
        "  - n: Input should be a valid integer, unable to parse string as an integer\n"
        'Received arguments: {"n": "many", "extra": 1}'
    )
    assert events[-1] == (
        "agent_end",
        "stop",
        [
            ("user", "count"),
            ("assistant", "toolUse", "", [("bad", "count", {"n": "many", "extra": 1})]),
            ("toolResult", "bad", True, error_text),
            ("assistant", "toolUse", "", [("good", "count", {"n": "500"})]),
            ("toolResult", "good", False, "n=500"),  # lax validation: "500" -> 500
            ("assistant", "stop", "counted", []),
        ],
    )
    assert ("tool_execution_end", "bad", True, error_text) in events
    assert d(h.calls[1].context.messages[-1]) == ("toolResult", "bad", True, error_text)


@pytest.mark.parametrize("raw", ["", "null"])
async def test_empty_and_null_arguments_mean_empty_object(raw: str) -> None:
    h = faux(faux_assistant_message([faux_tool_call("ping", raw, id="p")]), faux_assistant_message("pong"))

    async def ping_exec(call_id: str, params: NoArgs, signal: Any, on_update: Any) -> str:
        return f"pinged with {params.model_dump()}"

    events = await run(
        agent_loop([user("ping")], AgentContext(tools=[AgentTool("ping", "", NoArgs, ping_exec)]), cfg(h))
    )
    assert ("tool_execution_start", "p", {}) in events
    assert events[-1][2][1:3] == [
        ("assistant", "toolUse", "", [("p", "ping", {})]),
        ("toolResult", "p", False, "pinged with {}"),
    ]


async def test_unknown_tool_is_an_error_result() -> None:
    h = faux(faux_assistant_message([faux_tool_call("nope", {}, id="u")]), faux_assistant_message("sorry"))
    events = await run(agent_loop([user("x")], AgentContext(tools=[ECHO, SPIN]), cfg(h)))
    msg = 'Tool "nope" not found. Available tools: echo, spin'
    assert events[-1] == (
        "agent_end",
        "stop",
        [
            ("user", "x"),
            ("assistant", "toolUse", "", [("u", "nope", {})]),
            ("toolResult", "u", True, msg),
            ("assistant", "stop", "sorry", []),
        ],
    )
    assert [ev for ev in events if ev[0].startswith("tool_execution")] == [
        ("tool_execution_start", "u", {}),
        ("tool_execution_end", "u", True, msg),
    ]


async def test_before_tool_call_blocks_with_reason() -> None:
    h = faux(
        faux_assistant_message(
            [
                faux_tool_call("echo", {"text": "secret"}, id="b"),
                faux_tool_call("echo", {"text": "fine"}, id="ok"),
            ]
        ),
        faux_assistant_message("end"),
    )
    seen: list[Any] = []

    def before(ctx: Any, signal: Any) -> BeforeToolCallResult | None:
        seen.append((ctx.tool_call.id, ctx.args.model_dump(), ctx.assistant_message.stop_reason))
        if ctx.args.text == "secret":
            return BeforeToolCallResult(block=True, reason="echoing secrets is not allowed")
        return None

    events = await run(agent_loop([user("x")], AgentContext(tools=[ECHO]), cfg(h, before_tool_call=before)))
    assert seen == [("b", {"text": "secret"}, "toolUse"), ("ok", {"text": "fine"}, "toolUse")]
    assert events[-1][2][2:4] == [
        ("toolResult", "b", True, "echoing secrets is not allowed"),
        ("toolResult", "ok", False, "echo: fine"),
    ]


async def test_after_tool_call_overrides_result() -> None:
    h = faux(
        faux_assistant_message([faux_tool_call("echo", {"text": "a"}, id="a1")]),
        faux_assistant_message("end"),
    )

    async def after(ctx: Any, signal: Any) -> AfterToolCallResult:
        assert (ctx.result.details, ctx.is_error) == ({"len": 1}, False)
        return AfterToolCallResult(content=[TextContent(text="redacted")], details={"x": 1}, is_error=True)

    events = await run(agent_loop([user("x")], AgentContext(tools=[ECHO]), cfg(h, after_tool_call=after)))
    assert ("tool_execution_end", "a1", True, "redacted") in events
    result = h.calls[1].context.messages[-1]
    assert isinstance(result, ToolResultMessage)
    assert (result.details, result.is_error, text_of(result)) == ({"x": 1}, True, "redacted")


async def test_steering_during_a_two_tool_batch_runs_both_tools_then_reaches_next_call() -> None:
    h = faux(
        faux_assistant_message(
            [
                faux_tool_call("steerer", {"text": "1"}, id="t1"),
                faux_tool_call("steerer", {"text": "2"}, id="t2"),
            ]
        ),
        faux_assistant_message("noted the steer"),
    )
    queue: list[Any] = []
    polls: list[int] = []

    async def steerer_exec(call_id: str, params: EchoArgs, signal: Any, on_update: Any) -> str:
        if params.text == "1":
            queue.append(user("change of plan"))
        await asyncio.sleep(0)
        return f"ran {params.text}"

    def get_steering() -> list[Any]:
        polls.append(len(queue))
        out = list(queue)
        queue.clear()
        return out

    tool = AgentTool("steerer", "", EchoArgs, steerer_exec)
    events = await run(
        agent_loop([user("go")], AgentContext(tools=[tool]), cfg(h, get_steering_messages=get_steering))
    )
    assert polls == [0, 1, 0]  # loop start, after the batch, after the final turn
    r1, r2 = ("toolResult", "t1", False, "ran 1"), ("toolResult", "t2", False, "ran 2")
    steer = ("user", "change of plan")
    assert events[-1][2] == [
        ("user", "go"),
        ("assistant", "toolUse", "", [("t1", "steerer", {"text": "1"}), ("t2", "steerer", {"text": "2"})]),
        r1,
        r2,
        steer,
        ("assistant", "stop", "noted the steer", []),
    ]
    assert [d(m) for m in h.calls[1].context.messages][-3:] == [r1, r2, steer]
    i = events.index(("turn_end", events[-1][2][1], ["t1", "t2"]))
    assert events[i + 1 : i + 4] == [("turn_start",), ("message_start", steer), ("message_end", steer)]


async def test_follow_up_polled_only_when_the_loop_would_stop() -> None:
    h = faux(
        faux_assistant_message([faux_tool_call("echo", {"text": "a"}, id="a")]),
        faux_assistant_message("first answer"),
        faux_assistant_message("second answer"),
    )
    follow = [user("and another thing")]
    polled_after: list[int] = []

    def get_follow_ups() -> list[Any]:
        polled_after.append(h.call_count)
        out = list(follow)
        follow.clear()
        return out

    events = await run(
        agent_loop([user("q")], AgentContext(tools=[ECHO]), cfg(h, get_follow_up_messages=get_follow_ups))
    )
    assert polled_after == [2, 3]
    assert events[-1] == (
        "agent_end",
        "stop",
        [
            ("user", "q"),
            ("assistant", "toolUse", "", [("a", "echo", {"text": "a"})]),
            ("toolResult", "a", False, "echo: a"),
            ("assistant", "stop", "first answer", []),
            ("user", "and another thing"),
            ("assistant", "stop", "second answer", []),
        ],
    )


async def test_length_with_tool_call_asks_to_reissue() -> None:
    h = faux(
        faux_assistant_message([faux_tool_call("echo", '{"text": "trunc', id="L")], "length"),
        faux_assistant_message([faux_tool_call("echo", {"text": "whole"}, id="W")]),
        faux_assistant_message("fine"),
    )
    events = await run(agent_loop([user("x")], AgentContext(tools=[ECHO]), cfg(h)))
    reissue = (
        "Tool call 'echo' was not executed: the response hit the output token limit (stop_reason "
        "'length'), so its arguments may be truncated. Re-issue the call in a new response."
    )
    assert events[-1] == (
        "agent_end",
        "stop",
        [
            ("user", "x"),
            ("assistant", "length", "", [("L", "echo", {"text": "trunc"})]),
            ("toolResult", "L", True, reissue),
            ("assistant", "toolUse", "", [("W", "echo", {"text": "whole"})]),
            ("toolResult", "W", False, "echo: whole"),
            ("assistant", "stop", "fine", []),
        ],
    )
    assert [ev for ev in events if ev[0].startswith("tool_execution")] == [
        ("tool_execution_start", "W", {"text": "whole"}),
        ("tool_execution_end", "W", False, "echo: whole"),
    ]


async def test_max_iterations_stops_after_the_budget() -> None:
    h = faux(
        *[faux_assistant_message([faux_tool_call("echo", {"text": str(i)}, id=f"c{i}")]) for i in range(5)]
    )
    follow_polls: list[int] = []
    events = await run(
        agent_loop(
            [user("loop")],
            AgentContext(tools=[ECHO]),
            cfg(h, max_iterations=2, get_follow_up_messages=lambda: follow_polls.append(1) or []),
        )
    )
    assert h.call_count == 2 and follow_polls == []
    assert events[-1] == (
        "agent_end",
        "max_iterations",
        [
            ("user", "loop"),
            ("assistant", "toolUse", "", [("c0", "echo", {"text": "0"})]),
            ("toolResult", "c0", False, "echo: 0"),
            ("assistant", "toolUse", "", [("c1", "echo", {"text": "1"})]),
            ("toolResult", "c1", False, "echo: 1"),
        ],
    )


async def test_abort_during_streaming() -> None:
    h = register_faux_provider([faux_assistant_message("a long answer " * 10)], chunk_size=3)
    ctrl = AbortController()
    events = []
    deltas: list[str] = []
    async for ev in agent_loop([user("talk")], AgentContext(), cfg(h), ctrl.signal):
        events.append(e(ev))
        if ev.type == "message_update" and ev.assistant_message_event.type == "text_delta":
            deltas.append(ev.assistant_message_event.delta)
            ctrl.abort()
    # The provider streams in its own task, so a chunk or two may already be in flight when the
    # abort lands; what was streamed is exactly what the aborted message keeps.
    streamed = "".join(deltas)
    assert 3 <= len(streamed) < len("a long answer " * 10)
    aborted = ("assistant", "aborted", streamed, [])
    assert events[-3:] == [
        ("message_end", aborted),
        ("turn_end", aborted, []),
        ("agent_end", "aborted", [("user", "talk"), aborted]),
    ]


async def test_abort_during_first_in_flight_tool_leaves_a_valid_context() -> None:
    started = asyncio.Event()

    async def hang_exec(call_id: str, params: NoArgs, signal: Any, on_update: Any) -> str:
        started.set()
        await asyncio.Event().wait()  # never returns by itself
        return "unreachable"

    h = faux(
        faux_assistant_message(
            [faux_tool_call("hang", {}, id="h1"), faux_tool_call("echo", {"text": "e"}, id="e1")]
        ),
        faux_assistant_message("after abort"),
    )
    ctrl = AbortController()
    tools = [AgentTool("hang", "", NoArgs, hang_exec), ECHO]

    async def abort_when_started() -> None:
        await started.wait()
        ctrl.abort("user stop")

    task = asyncio.create_task(abort_when_started())
    raw = [
        ev
        async for ev in agent_loop(
            [user("go")], AgentContext(tools=tools), cfg(h, tool_execution="sequential"), ctrl.signal
        )
    ]
    events = [e(ev) for ev in raw]  # lockstep iteration: describing afterwards is safe here
    await task
    interrupted_h = "Tool call 'hang' was interrupted (user stop) and returned no result."
    interrupted_e = "Tool call 'echo' was interrupted (user stop) and returned no result."
    call_msg = ("assistant", "toolUse", "", [("h1", "hang", {}), ("e1", "echo", {"text": "e"})])
    final = ("assistant", "aborted", "", [])
    assert [ev for ev in events if ev[0].startswith("tool_execution")] == [
        ("tool_execution_start", "h1", {}),
        ("tool_execution_end", "h1", True, interrupted_h),
        ("tool_execution_start", "e1", {"text": "e"}),
        ("tool_execution_end", "e1", True, interrupted_e),
    ]
    new = events[-1][2]
    assert events[-1][:2] == ("agent_end", "aborted")
    assert new == [
        ("user", "go"),
        call_msg,
        ("toolResult", "h1", True, interrupted_h),
        ("toolResult", "e1", True, interrupted_e),
        final,
    ]
    assert h.call_count == 1  # the synthesized aborted message did not call the provider

    # The context stays valid: a new prompt on these messages works; the model sees every call
    # answered and the synthesized aborted message is dropped.
    async for _ in agent_loop([user("again")], AgentContext(messages=raw[-1].messages, tools=tools), cfg(h)):
        pass
    assert [d(m) for m in h.calls[1].context.messages] == [
        ("user", "go"),
        call_msg,
        ("toolResult", "h1", True, interrupted_h),
        ("toolResult", "e1", True, interrupted_e),
        ("user", "again"),
    ]


async def test_new_prompt_after_abort_replays_a_valid_context() -> None:
    h = faux(
        faux_assistant_message([faux_tool_call("echo", {"text": "1"}, id="k1")]),
        faux_assistant_message("recovered"),
    )
    ctrl = AbortController()

    async def before(ctx: Any, signal: Any) -> None:
        ctrl.abort()  # abort while the batch is being prepared

    messages: list[Any] = []
    async for ev in agent_loop(
        [user("first")], AgentContext(tools=[ECHO]), cfg(h, before_tool_call=before), ctrl.signal
    ):
        if ev.type == "agent_end":
            messages = ev.messages
            assert ev.reason == "aborted"
    async for _ in agent_loop([user("second")], AgentContext(messages=messages, tools=[ECHO]), cfg(h)):
        pass
    sent = [d(m) for m in h.calls[1].context.messages]
    assert sent == [
        ("user", "first"),
        ("assistant", "toolUse", "", [("k1", "echo", {"text": "1"})]),
        ("toolResult", "k1", True, "Tool call 'echo' was interrupted (aborted) and returned no result."),
        ("user", "second"),  # the synthesized aborted assistant message is dropped on replay
    ]


async def test_replay_drops_errored_assistant_messages_and_their_results() -> None:
    h = faux(faux_assistant_message("fresh answer"))
    broken = AssistantMessage(
        content=[faux_tool_call("echo", {"text": "x"}, id="z")], stop_reason="error", error_message="boom"
    )
    orphan = ToolResultMessage(tool_call_id="z", tool_name="echo", content=[TextContent(text="stale")])
    unanswered = AssistantMessage(
        content=[faux_tool_call("echo", {"text": "y"}, id="y1")], stop_reason="toolUse"
    )
    ctx = AgentContext(
        messages=[user("a"), broken, orphan, user("b"), unanswered, CustomMessage(custom_type="im_notice")]
    )
    async for _ in agent_loop_continue(AgentContext(messages=[*ctx.messages, user("c")]), cfg(h)):
        pass
    assert [d(m) for m in h.calls[0].context.messages] == [
        ("user", "a"),
        ("user", "b"),
        ("assistant", "toolUse", "", [("y1", "echo", {"text": "y"})]),
        ("toolResult", "y1", True, "Tool call 'echo' was interrupted (interrupted) and returned no result."),
        ("user", "c"),
    ]


async def test_continue_requires_a_non_assistant_last_message() -> None:
    h = faux()
    with pytest.raises(ValueError, match="no messages"):
        agent_loop_continue(AgentContext(), cfg(h))
    with pytest.raises(ValueError, match="assistant"):
        agent_loop_continue(AgentContext(messages=[user("x"), faux_assistant_message("y")]), cfg(h))


async def test_hooks_transform_convert_api_key_and_stream_options() -> None:
    h = faux(faux_assistant_message("one"), faux_assistant_message("two"))
    keys = iter(["k1", "k2"])
    transformed: list[int] = []

    async def transform(messages: list[Any], signal: Any) -> list[Any]:
        transformed.append(len(messages))
        return [m for m in messages if not (isinstance(m, UserMessage) and text_of(m) == "drop me")]

    def convert(messages: list[Any]) -> list[Any]:
        return [m for m in messages if not isinstance(m, CustomMessage)]

    config = cfg(
        h,
        transform_context=transform,
        convert_to_llm=convert,
        get_api_key=lambda provider: next(keys) + provider,
        stream_options=StreamOptions(max_tokens=33, api_key="template"),
    )
    ctx = AgentContext(messages=[user("drop me"), CustomMessage(custom_type="note")])
    msgs: list[Any] = []
    async for ev in agent_loop([user("q1")], ctx, config):
        if ev.type == "agent_end":
            msgs = ev.messages
    async for _ in agent_loop([user("q2")], AgentContext(messages=[*ctx.messages, *msgs]), config):
        pass
    assert transformed == [3, 5]
    assert [[d(m) for m in c.context.messages] for c in h.calls] == [
        [("user", "q1")],
        [("user", "q1"), ("assistant", "stop", "one", []), ("user", "q2")],
    ]
    assert [(c.options.api_key, c.options.max_tokens) for c in h.calls if c.options] == [
        ("k1faux", 33),
        ("k2faux", 33),
    ]
    assert config.stream_options is not None and config.stream_options.api_key == "template"


async def test_stream_failures_become_error_messages() -> None:
    model = Model(id="m", api="no-such-api")
    events = await run(agent_loop([user("x")], AgentContext(), AgentLoopConfig(model=model)))
    err = events[-1][2][-1]
    assert events[-1][:2] == ("agent_end", "error")
    assert err[:3] == ("assistant", "error", "")
    h = faux(faux_assistant_message([faux_thinking("hmm")], "error", error_message="overloaded"))
    events = await run(agent_loop([user("x")], AgentContext(), cfg(h)))
    assert events[-1] == ("agent_end", "error", [("user", "x"), ("assistant", "error", "", [])])


async def test_tool_exception_and_progress_updates() -> None:
    async def flaky_exec(call_id: str, params: NoArgs, signal: Any, on_update: Any) -> str:
        on_update(AgentToolResult.text("halfway"))
        raise RuntimeError("disk full")

    h = faux(faux_assistant_message([faux_tool_call("flaky", {}, id="f")]), faux_assistant_message("oh no"))
    events = await run(
        agent_loop([user("x")], AgentContext(tools=[AgentTool("flaky", "", NoArgs, flaky_exec)]), cfg(h))
    )
    assert [ev for ev in events if ev[0].startswith("tool_execution")] == [
        ("tool_execution_start", "f", {}),
        ("tool_execution_update", "f", "halfway"),
        ("tool_execution_end", "f", True, "Tool 'flaky' failed: RuntimeError: disk full"),
    ]


async def test_closing_the_iterator_early_cancels_running_tools() -> None:
    cancelled = asyncio.Event()

    async def hang_exec(call_id: str, params: NoArgs, signal: Any, on_update: Any) -> str:
        on_update(AgentToolResult.text("working"))
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    h = faux(faux_assistant_message([faux_tool_call("hang", {}, id="h")]))
    it = agent_loop([user("x")], AgentContext(tools=[AgentTool("hang", "", NoArgs, hang_exec)]), cfg(h))
    async for ev in it:
        if ev.type == "tool_execution_update":
            break
    await it.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(cancelled.wait(), 5)
    assert cancelled.is_set()

"""The stateful Agent: prompt/continue_, steer/follow_up queues and modes, abort, listeners, state."""

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
    Context,
    ImageContent,
    StreamOptions,
    TextContent,
    ToolResultMessage,
    UserMessage,
)
from runtime.agent.agent import AgentBusyError


def d(m: Any) -> tuple[Any, ...]:
    if isinstance(m, UserMessage):
        text = m.content if isinstance(m.content, str) else [b.type for b in m.content]
        return ("user", text)
    if isinstance(m, AssistantMessage):
        return ("assistant", m.stop_reason, m.text(), [c.id for c in m.tool_calls()])
    if isinstance(m, ToolResultMessage):
        return (
            "toolResult",
            m.tool_call_id,
            m.is_error,
            "".join(b.text for b in m.content if b.type == "text"),
        )
    return ("custom",)


class GateArgs(BaseModel):
    name: str


def gated_tool(gates: dict[str, asyncio.Event], started: dict[str, asyncio.Event]) -> AgentTool[GateArgs]:
    """A tool that signals when it starts and returns only when its gate opens."""

    async def run(call_id: str, params: GateArgs, signal: Any, on_update: Any) -> str:
        started[params.name].set()
        await gates[params.name].wait()
        return f"{params.name} done"

    return AgentTool("gate", "Wait for a gate.", GateArgs, run)


def two_gate_setup() -> tuple[dict[str, asyncio.Event], dict[str, asyncio.Event], AgentTool[GateArgs]]:
    gates = {"a": asyncio.Event(), "b": asyncio.Event()}
    started = {"a": asyncio.Event(), "b": asyncio.Event()}
    return gates, started, gated_tool(gates, started)


def two_calls() -> AssistantMessage:
    return faux_assistant_message(
        [faux_tool_call("gate", {"name": "a"}, id="ta"), faux_tool_call("gate", {"name": "b"}, id="tb")]
    )


async def test_prompt_builds_messages_and_events_reach_listeners_in_order() -> None:
    h = register_faux_provider([faux_assistant_message("hi")], chunk_size=100)
    agent = Agent(model=h.get_model(), system_prompt="sys")
    order: list[str] = []

    async def first(event: Any, signal: Any) -> None:
        await asyncio.sleep(0)
        order.append("1:" + event.type)

    def second(event: Any, signal: Any) -> None:
        order.append("2:" + event.type)

    agent.subscribe(first)
    unsubscribe = agent.subscribe(second)
    png = ImageContent(data="iVBORw0KGgo=", mime_type="image/png")
    await agent.prompt("look", images=[png])
    types = [
        "agent_start",
        "turn_start",
        "message_start",
        "message_end",
        "message_start",
        "message_update",
        "message_update",
        "message_update",
        "message_end",
        "turn_end",
        "agent_end",
    ]
    assert order == [f"{n}:{t}" for t in types for n in (1, 2)]
    assert [d(m) for m in agent.state.messages] == [
        ("user", ["text", "image"]),
        ("assistant", "stop", "hi", []),
    ]
    assert h.calls[0].context.system_prompt == "sys"
    unsubscribe()
    h.append_responses([faux_assistant_message("again")])
    order.clear()
    await agent.prompt(UserMessage(content="more"))
    assert all(o.startswith("1:") for o in order)
    assert (agent.state.is_streaming, agent.state.error, agent.state.streaming_message) == (False, None, None)


async def test_prompt_while_running_says_to_use_steer_or_follow_up() -> None:
    gates, started, tool = two_gate_setup()
    h = register_faux_provider([two_calls(), faux_assistant_message("ok")])
    agent = Agent(model=h.get_model(), tools=[tool])
    run = asyncio.create_task(agent.prompt("go"))
    await started["a"].wait()
    assert agent.state.is_streaming and agent.state.pending_tool_calls == {"ta", "tb"}
    with pytest.raises(AgentBusyError, match=r"Use steer\(\) or follow_up\(\)"):
        await agent.prompt("again")
    with pytest.raises(AgentBusyError):
        await agent.continue_()
    gates["a"].set()
    gates["b"].set()
    await run
    await agent.wait_for_idle()
    assert agent.state.pending_tool_calls == set() and not agent.state.is_streaming


async def test_steer_during_a_two_tool_batch() -> None:
    """Both tools of the batch run; the steering message reaches the next LLM call."""
    gates, started, tool = two_gate_setup()
    h = register_faux_provider([two_calls(), faux_assistant_message("changed course")])
    agent = Agent(model=h.get_model(), tools=[tool])
    run = asyncio.create_task(agent.prompt("go"))
    await started["a"].wait()
    await started["b"].wait()
    agent.steer(UserMessage(content="stop and do X"))
    gates["b"].set()
    gates["a"].set()
    await run
    expected = [
        ("user", "go"),
        ("assistant", "toolUse", "", ["ta", "tb"]),
        ("toolResult", "ta", False, "a done"),
        ("toolResult", "tb", False, "b done"),
        ("user", "stop and do X"),
        ("assistant", "stop", "changed course", []),
    ]
    assert [d(m) for m in agent.state.messages] == expected
    assert [d(m) for m in h.calls[1].context.messages] == expected[:5]


async def test_follow_up_is_drained_at_the_end() -> None:
    gates, started, tool = two_gate_setup()
    gates["b"].set()
    h = register_faux_provider(
        [
            faux_assistant_message([faux_tool_call("gate", {"name": "a"}, id="ta")]),
            faux_assistant_message("first"),
            faux_assistant_message("second"),
        ]
    )
    agent = Agent(model=h.get_model(), tools=[tool])
    run = asyncio.create_task(agent.prompt("go"))
    await started["a"].wait()
    agent.follow_up(UserMessage(content="also this"))
    gates["a"].set()
    await run
    assert [d(m) for m in agent.state.messages] == [
        ("user", "go"),
        ("assistant", "toolUse", "", ["ta"]),
        ("toolResult", "ta", False, "a done"),
        ("assistant", "stop", "first", []),  # follow-up waited until the loop would stop
        ("user", "also this"),
        ("assistant", "stop", "second", []),
    ]
    assert not agent.has_queued_messages()


@pytest.mark.parametrize("mode", ["one-at-a-time", "all"])
async def test_queue_modes(mode: str) -> None:
    h = register_faux_provider([faux_assistant_message(f"r{i}") for i in range(4)])
    agent = Agent(model=h.get_model(), steering_mode=mode, follow_up_mode=mode)  # type: ignore[arg-type]
    agent.follow_up(UserMessage(content="f1"))
    agent.follow_up(UserMessage(content="f2"))
    agent.steer(UserMessage(content="s1"))
    agent.steer(UserMessage(content="s2"))
    await agent.prompt("p")
    seq = [d(m)[1] if d(m)[0] == "user" else d(m)[2] for m in agent.state.messages]
    if mode == "one-at-a-time":
        assert seq == ["p", "s1", "r0", "s2", "r1", "f1", "r2", "f2", "r3"]
    else:
        assert seq == ["p", "s1", "s2", "r0", "f1", "f2", "r1"]


async def test_clear_queues() -> None:
    h = register_faux_provider([faux_assistant_message("only")])
    agent = Agent(model=h.get_model())
    agent.steer(UserMessage(content="s"))
    agent.follow_up(UserMessage(content="f"))
    agent.clear_steering_queue()
    agent.clear_follow_up_queue()
    assert not agent.has_queued_messages()
    await agent.prompt("p")
    assert [d(m) for m in agent.state.messages] == [("user", "p"), ("assistant", "stop", "only", [])]


async def test_abort_during_streaming_then_new_prompt_works() -> None:
    h = register_faux_provider([faux_assistant_message("x" * 200)], chunk_size=1, chunk_delay_s=10.0)
    agent = Agent(model=h.get_model())
    seen_delta = asyncio.Event()
    agent.subscribe(lambda ev, sig: seen_delta.set() if ev.type == "message_update" else None)
    run = asyncio.create_task(agent.prompt("talk"))
    await seen_delta.wait()
    agent.abort()
    await asyncio.wait_for(run, 5)
    assert [d(m) for m in agent.state.messages] == [("user", "talk"), ("assistant", "aborted", "x", [])]
    assert agent.state.error == "aborted"
    h.chunk_delay_s = 0
    h.append_responses([faux_assistant_message("back")])
    await agent.prompt("hello?")
    assert [d(m) for m in h.calls[1].context.messages] == [("user", "talk"), ("user", "hello?")]
    assert d(agent.state.messages[-1]) == ("assistant", "stop", "back", [])
    assert agent.state.error is None


async def test_abort_during_first_in_flight_tool_then_new_prompt_works() -> None:
    _gates, started, tool = two_gate_setup()
    h = register_faux_provider([two_calls(), faux_assistant_message("fresh start")])
    agent = Agent(model=h.get_model(), tools=[tool], tool_execution="sequential")
    run = asyncio.create_task(agent.prompt("go"))
    await started["a"].wait()
    agent.abort("stopped by user")
    await asyncio.wait_for(run, 5)
    interrupted = "Tool call 'gate' was interrupted (stopped by user) and returned no result."
    assert [d(m) for m in agent.state.messages] == [
        ("user", "go"),
        ("assistant", "toolUse", "", ["ta", "tb"]),
        ("toolResult", "ta", True, interrupted),
        ("toolResult", "tb", True, interrupted),
        ("assistant", "aborted", "", []),
    ]
    assert not started["b"].is_set()  # sequential: the second tool never started
    await agent.prompt("next")
    assert [d(m) for m in h.calls[1].context.messages] == [
        ("user", "go"),
        ("assistant", "toolUse", "", ["ta", "tb"]),
        ("toolResult", "ta", True, interrupted),
        ("toolResult", "tb", True, interrupted),
        ("user", "next"),
    ]
    assert d(agent.state.messages[-1]) == ("assistant", "stop", "fresh start", [])


async def test_continue_after_error_and_from_queued_messages() -> None:
    h = register_faux_provider(
        [
            faux_assistant_message("", "error", error_message="503 overloaded"),
            faux_assistant_message("retried"),
            faux_assistant_message("queued answer"),
        ]
    )
    agent = Agent(model=h.get_model(), stream_options=StreamOptions(max_tokens=9))
    await agent.prompt("q")
    assert agent.state.error == "503 overloaded"
    with pytest.raises(ValueError, match="assistant"):
        await agent.continue_()
    agent.state.messages.pop()  # drop the failed response, then resume from the user message
    await agent.continue_()
    assert d(agent.state.messages[-1]) == ("assistant", "stop", "retried", [])
    agent.follow_up(UserMessage(content="more"))
    await agent.continue_()
    assert [d(m) for m in agent.state.messages] == [
        ("user", "q"),
        ("assistant", "stop", "retried", []),
        ("user", "more"),
        ("assistant", "stop", "queued answer", []),
    ]
    assert [c.options.max_tokens for c in h.calls if c.options] == [9, 9, 9]


async def test_no_model_and_listener_bug_are_clear() -> None:
    with pytest.raises(ValueError, match="no model"):
        await Agent().prompt("x")
    h = register_faux_provider([faux_assistant_message("ok")])
    agent = Agent(model=h.get_model())

    def broken(event: Any, signal: Any) -> None:
        if event.type == "turn_end":
            raise RuntimeError("listener bug")

    agent.subscribe(broken)
    await agent.prompt("x")
    assert [d(m) for m in agent.state.messages][-1] == ("assistant", "error", "", [])
    assert agent.state.error == "RuntimeError: listener bug"
    assert not agent.state.is_streaming


async def test_context_json_round_trip_every_block_type() -> None:
    """A context holding every message and block type survives JSON losslessly."""
    from runtime import CustomMessage, ThinkingContent, Tool, ToolCall, Usage
    from runtime.llm.types import Cost

    ctx = Context(
        system_prompt="sys",
        messages=[
            UserMessage(
                content="plain", sender={"id": "42", "name": "Ann", "roles": ["master"]}, timestamp=1
            ),
            UserMessage(
                content=[TextContent(text="see"), ImageContent(data="AAEC", mime_type="image/png")],
                timestamp=2,
            ),
            AssistantMessage(
                content=[
                    ThinkingContent(thinking="hmm", signature="sig"),
                    ThinkingContent(thinking="", signature="enc", redacted=True),
                    TextContent(text="answer", text_signature="ts"),
                    ToolCall(
                        id="c1",
                        name="echo",
                        arguments={"text": "x", "n": [1, 2.5, None]},
                        thought_signature="g",
                    ),
                ],
                api="faux",
                provider="faux",
                model="m",
                stop_reason="toolUse",
                response_id="r1",
                timestamp=3,
                usage=Usage(
                    input=10,
                    output=5,
                    cache_read=2,
                    cache_write=1,
                    total_tokens=18,
                    cost=Cost(input=0.1, output=0.2, total=0.3),
                ),
            ),
            ToolResultMessage(
                tool_call_id="c1",
                tool_name="echo",
                is_error=False,
                details={"k": [1]},
                content=[TextContent(text="x"), ImageContent(data="AAEC", mime_type="image/jpeg")],
                timestamp=4,
            ),
            AssistantMessage(stop_reason="error", error_message="boom", timestamp=5),
            CustomMessage(custom_type="im_notice", data={"text": "joined"}, timestamp=6),
        ],
        tools=[Tool(name="echo", description="Echo.", parameters={"type": "object", "properties": {}})],
    )
    dumped = ctx.model_dump_json()
    assert Context.model_validate_json(dumped) == ctx
    assert Context.model_validate_json(dumped).model_dump_json() == dumped

"""What an owner of an :class:`Agent` (a live IM turn, a sub-agent) relies on beyond the queues:
follow-ups kept out of the loop, ``take_queued``, an outside abort signal, ``configure_loop`` and
``failure`` (`docs/decisions.md#agent-one-engine`)."""

from __future__ import annotations

import asyncio

from providers.faux import faux_assistant_message, faux_tool_call, register_faux_provider
from runtime import Agent, AgentLoopConfig, UserMessage
from runtime.llm.abort import AbortController
from tests.agent.test_core_agent import d, two_gate_setup


async def test_follow_ups_stay_queued_when_the_owner_runs_them_itself() -> None:
    gates, started, tool = two_gate_setup()
    gates["b"].set()
    h = register_faux_provider(
        [
            faux_assistant_message([faux_tool_call("gate", {"name": "a"}, id="ta")]),
            faux_assistant_message("one"),
        ]
    )
    agent = Agent(model=h.get_model(), tools=[tool], drain_follow_ups=False)
    run = asyncio.create_task(agent.prompt("go"))
    await started["a"].wait()
    agent.follow_up(UserMessage(content="later"))
    agent.steer(UserMessage(content="now"))
    gates["a"].set()
    await run
    # the steer reached the second call; the follow-up did not run in this loop
    assert [d(m) for m in agent.state.messages] == [
        ("user", "go"),
        ("assistant", "toolUse", "", ["ta"]),
        ("toolResult", "ta", False, "a done"),
        ("user", "now"),
        ("assistant", "stop", "one", []),
    ]
    assert len(h.calls) == 2
    steering, follow_ups = agent.take_queued()
    assert (steering, [m.content for m in follow_ups]) == ([], ["later"])  # type: ignore[union-attr]
    assert not agent.has_queued_messages()


async def test_take_queued_returns_steering_that_came_too_late() -> None:
    h = register_faux_provider([faux_assistant_message("done")])
    agent = Agent(model=h.get_model(), drain_follow_ups=False)
    await agent.prompt("p")
    agent.steer("s1")
    agent.follow_up("f1")
    agent.follow_up("f2")
    steering, follow_ups = agent.take_queued()
    assert [m.content for m in steering] == ["s1"]  # type: ignore[union-attr]
    assert [m.content for m in follow_ups] == ["f1", "f2"]  # type: ignore[union-attr]
    assert agent.take_queued() == ([], [])


async def test_an_outside_signal_aborts_the_run_and_is_unlinked_after_it() -> None:
    _gates, started, tool = two_gate_setup()
    h = register_faux_provider([faux_assistant_message([faux_tool_call("gate", {"name": "a"}, id="ta")])])
    agent = Agent(model=h.get_model(), tools=[tool])
    outside = AbortController()
    run = asyncio.create_task(agent.prompt("go", signal=outside.signal))
    await started["a"].wait()
    outside.abort("master said stop")
    await run
    last = agent.state.messages[-1]
    assert (last.role, last.stop_reason) == ("assistant", "aborted")  # type: ignore[union-attr]
    assert outside.signal._callbacks == []  # the run removed its link


async def test_an_already_fired_outside_signal_aborts_before_any_call() -> None:
    h = register_faux_provider([faux_assistant_message("never")])
    agent = Agent(model=h.get_model())
    outside = AbortController()
    outside.abort("too late")
    await agent.prompt("go", signal=outside.signal)
    assert agent.state.messages[-1].stop_reason == "aborted"  # type: ignore[union-attr]


async def test_configure_loop_has_the_last_say_and_failure_is_kept() -> None:
    h = register_faux_provider([faux_assistant_message("hi")])
    seen: list[AgentLoopConfig] = []

    def configure(config: AgentLoopConfig) -> AgentLoopConfig:
        seen.append(config)
        return config

    agent = Agent(model=h.get_model(), configure_loop=configure, max_iterations=3)
    await agent.prompt("p")
    assert [(c.model.id, c.max_iterations) for c in seen] == [(h.get_model().id, 3)]
    assert agent.failure is None

    def broken(event: object, signal: object) -> None:
        if getattr(event, "type", "") == "message_end":
            raise OSError("disk full")

    agent.subscribe(broken)
    await agent.prompt("again")
    assert isinstance(agent.failure, OSError) and str(agent.failure) == "disk full"
    assert agent.state.messages[-1].error_message == "OSError: disk full"  # type: ignore[union-attr]

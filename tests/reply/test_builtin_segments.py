"""The offline built-in model answers the IM reply contract with a valid Reply (so `make run`
works with output_schema=segments), at the native and the tool tier, after a tool step too."""

from __future__ import annotations

import pytest

from actors.models.builtin import builtin_model, builtin_tools
from runtime import AssistantMessage, UserMessage
from runtime.agent.config import AgentContext, AgentLoopConfig
from runtime.agent.events import AgentEndEvent, MessageEndEvent
from runtime.agent.loop import agent_loop
from runtime.reply.capability import CapabilityCache
from runtime.reply.im_reply import ImReplyContract, MentionIdentity
from runtime.reply.segments import Reply


@pytest.mark.parametrize("tier", ["native", "tool", "prompt"])
async def test_builtin_model_answers_segments(tier: str, deltas) -> None:
    model = builtin_model()
    cache = CapabilityCache()
    cache.record(model, tier)  # type: ignore[arg-type]
    c = ImReplyContract(model, cache=cache)
    config = c.configure(AgentLoopConfig(model=model))
    finals: list[AssistantMessage] = []
    end = None
    prompt = UserMessage(content="what time is it?", sender={"id": "20002"})
    async for e in agent_loop([prompt], AgentContext(system_prompt="bot", tools=builtin_tools()), config):
        if isinstance(e, MessageEndEvent) and isinstance(e.message, AssistantMessage):
            finals.append(e.message)
        if isinstance(e, AgentEndEvent):
            end = e
    assert end is not None and end.reason == "stop"
    assert [m.tool_calls()[0].name for m in finals[:1]] == ["clock"]
    out = await c.finalize(finals[-1], MentionIdentity.from_messages("20002", end.messages))
    assert (out.outcome, out.tier, len(out.reply.segments)) == ("first_try", tier, 1)
    assert out.reply.preview_text().startswith("Tool clock returned: ")
    assert deltas.structured() == {(tier, "first_try"): 1}


async def test_builtin_plain_mode_is_unchanged() -> None:
    model = builtin_model()
    c = ImReplyContract(model, False, cache=CapabilityCache())
    config = c.configure(AgentLoopConfig(model=model))
    finals = [
        e.message
        async for e in agent_loop([UserMessage(content="hi @Bob")], AgentContext(), config)
        if isinstance(e, MessageEndEvent) and isinstance(e.message, AssistantMessage)
    ]
    out = await c.finalize(finals[-1])
    assert (out.reply, out.outcome) == (Reply.of_text("You said: hi @Bob"), "plain")

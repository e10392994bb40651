"""What the configuration of ``tests/actors/serve/test_serve_agent_knobs.py`` names: the scripted model
(``ai.providers.knobs.script``), a business tool (``ai.python_tools``) and a pre-tool
(``ai.agent.pre_tools``). Imported by the ``sessionray serve`` process and its session hosts.

The model (:func:`answer`) fakes only judgement; each reply is a pure function of the context sent.
On the turn's user text ``T``:

* ``loop``         → call ``ping`` with ``n`` = pings so far + 1, for ever (only the LLM-call budget
  ends it); the budget-spent summary call → ``budget spent after: <ping results, ", "-joined>``;
* ``fail``         → the step raises (the call ends in ``error``);
* ``pre``          → ``pre-tools said: <the pre-tool lines the model was sent this turn>``;
* ``deferred X``   → call ``run_deferred_task`` with task ``square`` and ``{"x": X}``;
* ``delegate X``   → call ``delegate`` with task ``X``;
* after tool results (not ``loop``) → ``<tool>: <result>`` per result, ``; ``-joined;
* the ``delegate`` sub-agent (its own system prompt, no IM preset) → plain ``helper did: <task>``.

Answers of the main agent are reply-contract JSON (the model is pinned to the ``native`` tier).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from runtime.agent.tools import AgentTool, AgentToolResult
from runtime.llm.types import (
    AssistantMessage,
    Context,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from runtime.session.turn_tools import SUBAGENT_SYSTEM_PROMPT

BUDGET_NOTE = "The tool budget for this turn is spent."
"""How the summary call's last user message starts (``runtime.reply.im_reply``)."""
PRE_TOOLS_HEADER = "Context gathered before this turn:\n"
"""How the pre-tools' user message starts (``runtime.session.turn_agent.convert_for_session``)."""


def _text(message: Any) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(b.text for b in content if isinstance(b, TextContent))


def _reply(text: str) -> AssistantMessage:
    body = json.dumps({"segments": [{"type": "text", "data": {"text": text}}]}, ensure_ascii=False)
    return AssistantMessage(content=[TextContent(text=body)])


def _call(name: str, arguments: dict[str, Any], n: int) -> AssistantMessage:
    return AssistantMessage(content=[ToolCall(id=f"knobs-{name}-{n}", name=name, arguments=arguments)])


def answer(context: Context, options: Any = None) -> AssistantMessage:
    """The scripted model (module docstring)."""
    msgs = context.messages
    users = [i for i, m in enumerate(msgs) if isinstance(m, UserMessage)]
    if context.system_prompt == SUBAGENT_SYSTEM_PROMPT:
        return AssistantMessage(content=[TextContent(text=f"helper did: {_text(msgs[users[-1]])}")])
    budget_spent = _text(msgs[users[-1]]).startswith(BUDGET_NOTE)
    turn_at = next(i for i in reversed(users[:-1] if budget_spent else users)
                   if not _text(msgs[i]).startswith(PRE_TOOLS_HEADER))  # fmt: skip
    text = _text(msgs[turn_at])
    results = [m for m in msgs[turn_at:] if isinstance(m, ToolResultMessage)]
    if text == "loop":
        if budget_spent:
            return _reply("budget spent after: " + ", ".join(_text(r) for r in results))
        return _call("ping", {"n": len(results) + 1}, len(results) + 1)
    if results:
        return _reply("; ".join(f"{r.tool_name}: {_text(r)}" for r in results))
    if text == "fail":
        raise RuntimeError("the scripted model fails on purpose")
    if text == "pre":
        pre = next(_text(m) for m in reversed(msgs[:turn_at]) if _text(m).startswith(PRE_TOOLS_HEADER))
        return _reply("pre-tools said: " + pre.removeprefix(PRE_TOOLS_HEADER))
    if text.startswith("deferred "):
        return _call("run_deferred_task", {"task": "square", "args": {"x": int(text.split()[1])}}, 1)
    if text.startswith("delegate "):
        return _call("delegate", {"task": text.removeprefix("delegate ")}, 1)
    return _reply(f"You said: {text}")


class PingArgs(BaseModel):
    """Arguments of ``ping``."""

    n: int


async def _ping(call_id: str, params: PingArgs, signal: Any, on_update: Any) -> AgentToolResult:
    return AgentToolResult.text(f"pong {params.n}")


PING = AgentTool("ping", "Answer pong with the number given.", PingArgs, _ping)
"""The business tool ``ai.python_tools`` names."""


def who_asked(turn: Any) -> str:
    """The pre-tool ``ai.agent.pre_tools`` names: who asked what (a plain function: run in a thread)."""
    return f"{turn.sender.get('id')} asked {turn.text!r}"

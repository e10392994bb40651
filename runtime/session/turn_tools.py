"""Tools a session offers beyond the business tools (docs/decisions.md#session-extra-tools):
``run_deferred_task`` and a sub-agent (``delegate``). Ray-free; the session host supplies how
deferred work runs.

* ``run_deferred_task(task, args)``: the model hands long work to a named function from
  ``SessionSetup.deferred_tasks``. The tool answers at once ("started"); the session runs the
  function elsewhere (in ``actors``: a Ray task; without Ray: a thread) and delivers its result as
  a **separate outbound message**, recorded in the context as a ``deferred_result`` custom message
  so later turns know about it.
* ``delegate(task)``: a sub-agent turn — a fresh agent loop on the session's model with the given
  tools, **without the IM preset** (no reply contract, no IM system prompt, no sender prefix:
  sub-agents do not inherit it, docs/decisions.md#reply-preset-scope); its plain final text is the
  tool result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import BaseModel, Field

from runtime.agent.agent import Agent
from runtime.agent.tools import AgentTool, AgentToolResult, ToolUpdateFn
from runtime.delivery.job import DeliveryJob
from runtime.keys import parse_session_key
from runtime.llm.abort import AbortSignal
from runtime.llm.attribution import attributed
from runtime.llm.types import AssistantMessage, CustomMessage, Model, UserMessage
from runtime.reply.segments import Reply
from runtime.session.turn import DEFERRED_MARKER

__all__ = [
    "DELEGATE",
    "RUN_DEFERRED_TASK",
    "SUBAGENT_SYSTEM_PROMPT",
    "DeferredTaskArgs",
    "DelegateArgs",
    "SpawnFn",
    "deferred_result",
    "make_deferred_task_tool",
    "make_subagent_tool",
    "run_subagent",
    "spawn_in_thread",
]

RUN_DEFERRED_TASK = "run_deferred_task"
DELEGATE = "delegate"
SUBAGENT_SYSTEM_PROMPT = "You are a helper agent. Do the task you are given and answer with plain text."

DeferredFn = Callable[[dict[str, Any]], str]
SpawnFn = Callable[[DeferredFn, dict[str, Any]], Awaitable[str]]
"""Runs ``fn(args)`` somewhere and returns its text (actors: a Ray task)."""


async def spawn_in_thread(fn: DeferredFn, args: dict[str, Any]) -> str:
    """The Ray-free :data:`SpawnFn`: run ``fn(args)`` on a worker thread."""
    return str(await asyncio.to_thread(fn, args))


class DeferredTaskArgs(BaseModel):
    """Arguments of ``run_deferred_task``."""

    task: str = Field(description="Name of the deferred task to run.")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments of the task.")


def make_deferred_task_tool(
    tasks: dict[str, DeferredFn], start: Callable[[str, str, dict[str, Any]], None]
) -> AgentTool[DeferredTaskArgs]:
    """The ``run_deferred_task`` tool over ``tasks``; ``start(call_id, task, args)`` launches one.

    An unknown task name is an error result listing the known names (the model can correct it).
    """

    async def execute(
        call_id: str, params: DeferredTaskArgs, signal: AbortSignal | None, on_update: ToolUpdateFn
    ) -> AgentToolResult:
        if params.task not in tasks:
            raise ValueError(f"unknown deferred task {params.task!r}; known: {sorted(tasks)}")
        start(call_id, params.task, params.args)
        return AgentToolResult.text(
            f"started deferred task {params.task}; its result will be sent to the chat as a separate message",
            details={"task": params.task, "call_id": call_id},
        )

    return AgentTool(
        RUN_DEFERRED_TASK,
        f"Run long work in the background; its result comes later as its own message. Tasks: {sorted(tasks)}",
        DeferredTaskArgs,
        execute,
    )


class DelegateArgs(BaseModel):
    """Arguments of ``delegate``."""

    task: str = Field(description="What the helper agent should do, self-contained.")


async def run_subagent(
    model: Model,
    tools: Sequence[AgentTool[Any]],
    task: str,
    *,
    system_prompt: str = SUBAGENT_SYSTEM_PROMPT,
    signal: AbortSignal | None = None,
    max_iterations: int = 8,
) -> str:
    """Run one sub-agent turn (no IM preset) and return its final text (``""`` if none).

    Raises:
        RuntimeError: the sub-agent's last answer ended in ``error``/``aborted`` (message included).
    """
    agent = Agent(model=model, system_prompt=system_prompt, tools=tools, max_iterations=max_iterations)
    await agent.prompt(UserMessage(content=task), signal=signal)
    final = next((m for m in reversed(agent.state.messages) if isinstance(m, AssistantMessage)), None)
    if final is not None and final.stop_reason in ("error", "aborted"):
        raise RuntimeError(f"sub-agent {final.stop_reason}: {final.error_message}")
    return final.text() if final is not None else ""


def make_subagent_tool(
    model: Model, tools: Sequence[AgentTool[Any]], *, system_prompt: str = SUBAGENT_SYSTEM_PROMPT
) -> AgentTool[DelegateArgs]:
    """The ``delegate`` tool: runs :func:`run_subagent` with ``tools`` (pass business tools only;
    never the IM reply contract)."""

    async def execute(
        call_id: str, params: DelegateArgs, signal: AbortSignal | None, on_update: ToolUpdateFn
    ) -> AgentToolResult:
        with attributed(reason="sub-agent"):  # docs/decisions.md#spend-ledger
            text = await run_subagent(model, tools, params.task, system_prompt=system_prompt, signal=signal)
        return AgentToolResult.text(text)

    return AgentTool(DELEGATE, "Hand a self-contained sub-task to a helper agent.", DelegateArgs, execute)


def deferred_result(
    session_key: str, session_id: str, call_id: str, task: str, result: str
) -> tuple[DeliveryJob, CustomMessage]:
    """The delivery job (its own message, reply id ``{session_id}/deferred/{call_id}``) and the
    ``deferred_result`` marker of a finished deferred task's ``result`` text."""
    key = parse_session_key(session_key)
    job = DeliveryJob(
        reply_id=f"{session_id}/deferred/{call_id}",
        session_key=session_key,
        platform=key.platform,
        bot_id=key.bot_id,
        scene_type=key.scope,
        scene_id=key.scene_id,
        reply_to=None,
        reply=Reply.of_text(result),
    )
    marker = CustomMessage(
        custom_type=DEFERRED_MARKER, data={"task": task, "call_id": call_id, "result": result}
    )
    return job, marker

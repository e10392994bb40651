"""Turning an agent's messages into a context a provider accepts
(docs/decisions.md#agent-abort-valid-context).

* :func:`default_convert_to_llm` — the default ``convert_to_llm`` hook: keeps user, assistant and
  tool-result messages and drops host :class:`~runtime.llm.types.CustomMessage` s
  (docs/decisions.md#llm-context-shape).
* :func:`prepare_replay` — applied by the agent loop to every LLM call (after ``convert_to_llm``):
  drops assistant messages that ended in ``error``/``aborted`` together with their tool results,
  drops any other orphan or duplicate tool result, and gives every remaining tool call a result
  (a synthetic "interrupted" error result where one is missing). Providers reject a tool call
  without a result and a result without its call, so a context that went through an abort or an
  error can always be replayed.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Message,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

__all__ = ["default_convert_to_llm", "interrupted_result", "prepare_replay"]


def default_convert_to_llm(messages: Sequence[AgentMessage]) -> list[Message]:
    """Keep the LLM messages (user, assistant, toolResult); drop custom host messages."""
    return [m for m in messages if isinstance(m, UserMessage | AssistantMessage | ToolResultMessage)]


def interrupted_result(call: ToolCall, reason: str = "interrupted") -> ToolResultMessage:
    """Return the synthetic error result for a tool call that produced no result.

    Args:
        call: The tool call.
        reason: Why (``aborted`` from the signal, ``interrupted`` on replay).
    """
    return ToolResultMessage(
        tool_call_id=call.id,
        tool_name=call.name,
        content=[
            TextContent(text=f"Tool call {call.name!r} was interrupted ({reason}) and returned no result.")
        ],
        is_error=True,
    )


def prepare_replay(messages: Sequence[Message]) -> list[Message]:
    """Return ``messages`` made valid for a provider (see the module docstring).

    Pure: the input is not changed; kept message objects are reused as they are.
    """
    out: list[Message] = []
    pending: list[ToolCall] = []
    answered: set[str] = set()

    def close_pending() -> None:
        for call in pending:
            if call.id not in answered:
                out.append(interrupted_result(call))
        pending.clear()
        answered.clear()

    for m in messages:
        if isinstance(m, AssistantMessage):
            close_pending()
            if m.stop_reason in ("error", "aborted"):
                continue
            out.append(m)
            pending.extend(m.tool_calls())
        elif isinstance(m, ToolResultMessage):
            if m.tool_call_id in answered or all(c.id != m.tool_call_id for c in pending):
                continue  # orphan (its call was dropped) or duplicate
            answered.add(m.tool_call_id)
            out.append(m)
        else:
            close_pending()
            out.append(m)
    close_pending()
    return out

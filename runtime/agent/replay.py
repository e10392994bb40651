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
* :class:`IncrementalConvert` — a ``convert_to_llm`` hook that keeps both steps' work across the
  calls of one growing context and returns :class:`Prepared` (the loop skips its own step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from runtime.llm.growth import ContextGrowth
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Message,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

__all__ = ["IncrementalConvert", "Prepared", "default_convert_to_llm", "interrupted_result", "prepare_replay"]


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


class _Replay:
    """:func:`prepare_replay` part way through a list: what is kept so far (``out``) and the tool
    calls of the last kept assistant message still waiting for results (``pending``, of which
    ``answered`` have one). The last closing — results for calls still unanswered — is left to
    :meth:`result`, so more messages can be fed later."""

    __slots__ = ("answered", "out", "pending")

    def __init__(self) -> None:
        self.out: list[Message] = []
        self.pending: list[ToolCall] = []
        self.answered: set[str] = set()

    def _close_pending(self) -> None:
        self.out.extend(interrupted_result(c) for c in self.pending if c.id not in self.answered)
        self.pending.clear()
        self.answered.clear()

    def feed(self, messages: Sequence[Message]) -> None:
        for m in messages:
            if isinstance(m, AssistantMessage):
                self._close_pending()
                if m.stop_reason in ("error", "aborted"):
                    continue
                self.out.append(m)
                self.pending.extend(m.tool_calls())
            elif isinstance(m, ToolResultMessage):
                if m.tool_call_id in self.answered or all(c.id != m.tool_call_id for c in self.pending):
                    continue  # orphan (its call was dropped) or duplicate
                self.answered.add(m.tool_call_id)
                self.out.append(m)
            else:
                self._close_pending()
                self.out.append(m)

    def result(self) -> list[Message]:
        """What was fed, valid for a provider (a new list; the state is not changed)."""
        return self.out + [interrupted_result(c) for c in self.pending if c.id not in self.answered]


def prepare_replay(messages: Sequence[Message]) -> list[Message]:
    """Return ``messages`` made valid for a provider (see the module docstring).

    Pure: the input is not changed; kept message objects are reused as they are.
    """
    replay = _Replay()
    replay.feed(messages)
    return replay.result()


class Prepared(list[Message]):
    """A ``convert_to_llm`` result that is already a valid replay: every item a
    :data:`~runtime.llm.types.Message` instance and :func:`prepare_replay` applied. The agent loop
    sends it as it is (neither replayed nor validated again)."""


class IncrementalConvert:
    """A ``convert_to_llm`` hook for one growing context: a call that extends the previous call's
    messages converts and replays only the new ones, so an LLM call costs O(new messages) instead
    of O(context) (docs/decisions.md#agent-incremental-convert).

    ``convert`` must map a list item by item (its result for a list is the concatenation of its
    results for each item, as :func:`default_convert_to_llm` and the IM session's converter do),
    and the messages it was given must not change afterwards (the context's messages are never
    edited in place once added). A call whose messages do not start with the previous call's
    (the same objects, in order: after a compaction, or a turn that sees another list) starts
    again from nothing; the result is then the same as ``prepare_replay(convert(messages))``.

    Returns :class:`Prepared` (a new list each call).
    """

    def __init__(self, convert: Callable[[list[AgentMessage]], list[Message]]) -> None:
        self._convert = convert
        self._growth = ContextGrowth()
        self._replay = _Replay()

    @property
    def converted(self) -> int:
        """Messages converted so far (a new start converts all of its list again)."""
        return self._growth.taken

    def __call__(self, messages: Sequence[AgentMessage]) -> Prepared:
        restart, new = self._growth.new(messages)
        if restart:
            self._replay = _Replay()
        self._replay.feed(self._convert(new))
        return Prepared(self._replay.result())

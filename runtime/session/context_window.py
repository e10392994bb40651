"""What one turn's LLM calls see of the session's context: compaction, then the context budget
(docs/decisions.md#agent-context-budget, docs/decisions.md#memory-compaction).

Order: compaction runs first, on the whole loaded context (so it still triggers at its share of
the model's ``context_window`` and stores its summary in SQL); the budget then cuts the result to
``summary + newest history that fits + the current turn``. The other order would let compaction
see only the budgeted window, so it would never run and the summary of older history would never
be written.
"""

from __future__ import annotations

from typing import Any

from runtime.agent.agent import Agent
from runtime.agent.context_budget import install_context_budget
from runtime.memory.compaction import is_summary, make_compaction_hook
from runtime.session.turn import INBOUND_MARKER, SessionSetup, TurnInput, find_marker

__all__ = ["install_context_hooks"]


def install_context_hooks(
    agent: Agent, setup: SessionSetup, repo: Any, session_id: str, turn: TurnInput
) -> None:
    """Set ``agent.transform_context`` for one turn: compaction (when
    ``setup.compaction_threshold`` is set) then the context budget (when ``setup.context_budget``
    is set). The current turn starts at its ``im_inbound`` record (the inbound message, its
    pre-tool results and everything the loop adds are never cut); the compaction summary is
    pinned."""
    compaction = None
    if setup.compaction_threshold is not None:
        compaction = make_compaction_hook(repo, session_id, setup.model, threshold=setup.compaction_threshold)
    if setup.context_budget is None:
        agent.transform_context = compaction
        return
    install_context_budget(
        agent,
        setup.context_budget,
        before=compaction,
        pinned=is_summary,
        turn_start=lambda messages: find_marker(messages, INBOUND_MARKER, turn.message_id),
    )

"""What one turn's LLM calls see of the session's context: compaction, then the context budget
(docs/decisions.md#agent-context-budget, docs/decisions.md#memory-compaction).

Order: compaction runs first, on the whole loaded context (so it still triggers at its share of
the model's ``context_window`` and stores its summary in SQL); the budget then cuts the result to
``summary + newest history that fits + the current turn``. The other order would let compaction
see only the budgeted window, so it would never run and the summary of older history would never
be written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from runtime.agent.agent import Agent
from runtime.agent.context_budget import BudgetMemo, BudgetPolicy, install_context_budget
from runtime.config.ai import AiConfig
from runtime.llm.tokens import estimate_request_tokens
from runtime.llm.types import Context, Model
from runtime.memory.compaction import CompactionHook, is_summary, make_compaction_hook
from runtime.session.turn import INBOUND_MARKER, SessionSetup, TurnInput, find_marker
from runtime.session.turn_agent import reply_contract

__all__ = ["budget_policy", "compaction_hook", "install_context_hooks", "reply_overhead"]


def budget_policy(ai: AiConfig) -> BudgetPolicy:
    """The per-turn context budgets of ``ai`` (docs/decisions.md#agent-context-budget):
    ``ai.agent.context_budget_tokens``, overridden per ``alias/model_id`` by each model entry that
    sets ``context_budget_tokens`` (even to ``null``: no budget for that model)."""
    per_model = {
        f"{alias}/{m.id}": m.context_budget_tokens
        for alias, provider in ai.providers.items()
        for m in provider.models
        if "context_budget_tokens" in m.model_fields_set
    }
    return BudgetPolicy(ai.agent.context_budget_tokens, per_model)


def reply_overhead(setup: SessionSetup) -> Callable[[Model], int]:
    """``(model) -> tokens`` the turn's reply contract adds to every request of ``model`` (its
    instructions in the system prompt and, by tier, the output schema, the output tool or the
    schema instructions; docs/decisions.md#reply-segments), remembered per model for the turn."""
    known: dict[str, int] = {}

    def overhead(model: Model) -> int:
        ref = model.ref()
        if ref not in known:
            ctx, opts = reply_contract(dataclasses.replace(setup, model=model)).prepare(Context(), None)
            known[ref] = estimate_request_tokens(ctx, opts.output_schema)
        return known[ref]

    return overhead


def compaction_hook(
    setup: SessionSetup,
    repo: Any,
    session_id: str,
    kept: CompactionHook | None = None,
    *,
    settle: Callable[[], Awaitable[None]] | None = None,
) -> CompactionHook | None:
    """The compaction hook of the epoch ``session_id`` (``None`` without
    ``setup.compaction_threshold``): ``kept`` when it is that epoch's, else a new one. A session
    keeps one across its turns: the hook holds the summary it made, and a hook made per turn
    summarized the same history again in every turn once a live session had passed the
    threshold (docs/decisions.md#memory-compaction). ``settle``: the session writer's flush, for
    a new hook (:class:`~runtime.memory.compaction.CompactionHook`)."""
    if setup.compaction_threshold is None:
        return None
    if kept is not None and kept.session_id == session_id:
        return kept
    return make_compaction_hook(
        repo, session_id, setup.model, threshold=setup.compaction_threshold, settle=settle
    )


def install_context_hooks(
    agent: Agent,
    setup: SessionSetup,
    turn: TurnInput,
    compaction: CompactionHook | None,
    memo: BudgetMemo | None = None,
) -> None:
    """Set ``agent.transform_context`` for one turn: ``compaction`` (the session's
    :func:`compaction_hook`) then the context budget (when ``setup.context_budget`` is set). The
    current turn starts at its ``im_inbound`` record (the inbound message, its pre-tool results
    and everything the loop adds are never cut); the compaction summary is pinned; the reply
    contract's additions count as fixed (:func:`reply_overhead`); ``memo``: the session's
    :class:`~runtime.agent.context_budget.BudgetMemo` (pinned: the summary). A policy without any budget
    (``null`` everywhere) still measures each request, but chooses no window: the turn sends the
    whole context, and keeps its conversion across turns when there is no compaction either
    (docs/decisions.md#agent-incremental-convert)."""
    if setup.context_budget is None:
        agent.transform_context = compaction
        return
    install_context_budget(
        agent,
        setup.context_budget,
        before=compaction,
        pinned=is_summary,
        turn_start=lambda messages: find_marker(messages, INBOUND_MARKER, turn.message_id),
        overhead=reply_overhead(setup),
        memo=memo,
    )
    if setup.context_budget.unlimited:
        agent.transform_context = compaction

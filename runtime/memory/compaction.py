"""Context compaction as an agent-loop ``transform_context`` hook
(docs/decisions.md#memory-compaction).

Before each LLM call the hook estimates the context's tokens (:func:`estimate_tokens`, the one
estimate of :mod:`runtime.llm.tokens`: about four characters per token, 1,200 per image). Above
``threshold`` × ``model.context_window`` it

1. picks a cut so that the kept tail holds about ``keep_recent_tokens`` and **never separates a
   tool call from its result** (:func:`find_cut`: the tail never starts with a tool result and no
   call in the summarized part has its result in the tail);
2. summarizes everything before the cut (including an earlier summary) with ``complete_simple``;
3. stores the summary in ``agent_summaries`` with ``anchor_message_id`` = the row id of the last
   summarized ``agent_messages`` row, so the next ``load_context`` gives summary + tail;
4. returns ``[summary, *tail]`` for this call and reuses that summary on later calls of the same
   turn (no second LLM call while the summarized prefix is unchanged).

The anchor is found by matching the summarized messages against the epoch's stored rows (the
context is "summary + rows after the anchor + this turn's not yet appended messages"). Only
stored messages can be anchored: if the cut reaches into messages not yet appended, the summary is
used for this turn but not stored (the next load falls back to the stored rows).

Failures (an ``error``/``aborted`` result, empty text or an exception of the summary call, or an
SQL error while storing the summary) keep the full context, log a warning and count
``sessionray_compactions_total{outcome="failed"}``; success counts ``outcome="ok"``.
No message row is ever deleted or changed.
"""

from __future__ import annotations

import json
import logging
import operator
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime import metrics
from runtime.llm.abort import AbortSignal
from runtime.llm.attribution import attributed
from runtime.llm.growth import ContextGrowth
from runtime.llm.options import SimpleStreamOptions
from runtime.llm.stream import complete_simple
from runtime.llm.tokens import IMAGE_TOKENS, estimate_tokens
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Context,
    CustomMessage,
    Model,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    now_ms,
)
from runtime.memory.repository import SUMMARY_CUSTOM_TYPE, ContextRepository, message_json, summary_message
from runtime.reply.sender import strip_user_message

__all__ = [
    "IMAGE_TOKENS",
    "SUMMARY_SYSTEM_PROMPT",
    "CompactionHook",
    "estimate_tokens",
    "find_cut",
    "is_summary",
    "make_compaction_hook",
    "render_for_summary",
]

log = logging.getLogger(__name__)

SUMMARY_SYSTEM_PROMPT = (
    "You maintain the memory of a chat assistant. Summarize the conversation you are given so the "
    "assistant can continue it without the original messages. Keep: who the participants are "
    "(names and ids), their requests and preferences, decisions, facts learned, results of tool "
    "calls that still matter, and open tasks. Be concise and factual; write plain text; do not "
    "address the user."
)
"""System prompt of the summarization call."""


def is_summary(m: AgentMessage) -> bool:
    """Whether ``m`` is the compaction summary record (pinned by the context budget)."""
    return isinstance(m, CustomMessage) and m.custom_type == SUMMARY_CUSTOM_TYPE


def _valid_cut(messages: Sequence[AgentMessage], k: int) -> bool:
    if k <= 0 or k >= len(messages) or isinstance(messages[k], ToolResultMessage):
        return False
    if not any(not is_summary(m) for m in messages[:k]):
        return False
    open_calls = {c.id for m in messages[:k] if isinstance(m, AssistantMessage) for c in m.tool_calls()}
    return not any(isinstance(m, ToolResultMessage) and m.tool_call_id in open_calls for m in messages[k:])


def find_cut(messages: Sequence[AgentMessage], keep_recent_tokens: int) -> int | None:
    """Index ``k`` such that ``messages[:k]`` is summarized and ``messages[k:]`` kept, or ``None``.

    The target keeps at least ``keep_recent_tokens`` (estimated) in the tail; the cut then moves to
    the nearest valid boundary, earlier first (a bigger tail), else later. Valid: ``1 ≤ k < len``,
    the summarized part holds a message other than a summary, ``messages[k]`` is not a tool result,
    and no tool call before ``k`` has its result at or after ``k``.
    """
    n = len(messages)
    target = n
    acc = 0
    while target > 0 and acc < keep_recent_tokens:
        target -= 1
        acc += estimate_tokens([messages[target]])
    for k in range(target, 0, -1):
        if _valid_cut(messages, k):
            return k
    for k in range(target + 1, n):
        if _valid_cut(messages, k):
            return k
    return None


def render_for_summary(messages: Sequence[AgentMessage]) -> str:
    """The transcript text given to the summarizer, one labelled entry per message."""
    lines: list[str] = []
    for m in messages:
        if is_summary(m):
            lines.append(f"[earlier summary]\n{m.data.get('summary', '')}")  # type: ignore[union-attr]
        elif isinstance(m, UserMessage):
            who = "user"
            if m.sender:
                who = f"user {m.sender.get('name', '')} (id {m.sender.get('id', '')})"
            text = (
                m.content
                if isinstance(m.content, str)
                else " ".join(b.text if isinstance(b, TextContent) else "[image]" for b in m.content)
            )
            lines.append(f"[{who}]\n{text}")
        elif isinstance(m, AssistantMessage):
            parts = []
            for c in m.content:
                if isinstance(c, TextContent):
                    parts.append(c.text)
                elif isinstance(c, ToolCall):
                    parts.append(
                        f"(calls tool {c.name} {json.dumps(c.arguments, ensure_ascii=False, default=repr)})"
                    )
            lines.append("[assistant]\n" + "\n".join(parts))
        elif isinstance(m, ToolResultMessage):
            body = " ".join(b.text if isinstance(b, TextContent) else "[image]" for b in m.content)
            flag = " error" if m.is_error else ""
            lines.append(f"[tool result {m.tool_name}{flag}]\n{body}")
    return "\n\n".join(lines)


def _dump(m: AgentMessage) -> str:
    # Exactly what append_messages stores (forged prefixes stripped, unserializable host data as
    # repr), so live messages compare equal to their stored rows.
    if isinstance(m, UserMessage):
        m = strip_user_message(m)
    return message_json(m)


CACHED_SUMMARIES = 4
"""Summaries a hook keeps (the default ``runtime.max_concurrent_turns``: one per overlapping turn)."""


@dataclass
class _Cached:
    covered: list[str]
    """JSON of the summarized messages (the prefix this summary replaces)."""
    summary: CustomMessage
    objects: list[AgentMessage]
    """The summarized messages themselves: a context that starts with these objects needs no
    JSON comparison."""


def _starts_with(messages: list[AgentMessage], c: _Cached) -> bool:
    """Whether ``messages`` starts with the head ``c`` covers: the same objects (the live context,
    never edited), or where they differ, the same stored JSON (a context loaded again); the JSON
    is written only from the first object that differs, and stops at the first mismatch."""
    n = len(c.covered)
    if n > len(messages):
        return False
    if all(map(operator.is_, c.objects, messages)):
        return True
    k = next(i for i, (a, b) in enumerate(zip(c.objects, messages, strict=False)) if a is not b)
    if any(_dump(m) != j for m, j in zip(messages[k:n], c.covered[k:], strict=True)):
        return False
    c.objects = messages[:n]
    return True


class CompactionHook:
    """The ``transform_context`` hook of one session epoch (see module docstring).

    Args:
        repo: Where summaries are stored and rows are matched.
        session_id: The epoch whose context this hook compacts.
        model: The session's model: its ``context_window`` sets the budget; also the summarizer
            unless ``summary_model`` is given.
        threshold: Share of ``context_window`` (0 < x ≤ 1) above which compaction runs.
        keep_recent_tokens: Estimated tokens kept verbatim in the tail (default: a quarter of
            the context window).
        summary_model: Model for the summary call (default ``model``).
        summary_max_tokens: Output budget of the summary call, in tokens.
        settle: Awaited before the summarized head is matched against the stored rows: the
            session's writer writes the records it holds back (a turn's staged question,
            docs/decisions.md#session-turn-records), so a summary reaching into them is stored.

    Raises:
        ValueError: ``threshold`` outside (0, 1] or a negative ``keep_recent_tokens``.
    """

    def __init__(
        self,
        repo: ContextRepository,
        session_id: str,
        model: Model,
        *,
        threshold: float = 0.8,
        keep_recent_tokens: int | None = None,
        summary_model: Model | None = None,
        summary_max_tokens: int = 1024,
        settle: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        if not 0 < threshold <= 1:
            raise ValueError(f"compaction threshold must be in (0, 1], got {threshold}")
        if keep_recent_tokens is not None and keep_recent_tokens < 0:
            raise ValueError(f"keep_recent_tokens must be >= 0, got {keep_recent_tokens}")
        self.repo = repo
        self.session_id = session_id
        self.model = model
        self.threshold = threshold
        self.keep_recent_tokens = (
            keep_recent_tokens if keep_recent_tokens is not None else model.context_window // 4
        )
        self.summary_model = summary_model or model
        self.summary_max_tokens = summary_max_tokens
        self.settle = settle
        self._cache: list[_Cached] = []
        """Summaries made, newest first (at most :data:`CACHED_SUMMARIES`): overlapping turns see
        different lists (each without the others' records in flight), so each keeps the one
        made of its own list instead of summarizing again at every call."""
        self._growth = ContextGrowth()
        self._sums = array("q", [0])
        """``estimate_tokens`` of the first i messages of the context last seen (kept as it grows:
        docs/decisions.md#agent-incremental-convert)."""

    @property
    def budget_tokens(self) -> int:
        """Estimated tokens above which compaction runs (``threshold × context_window``)."""
        return int(self.threshold * self.model.context_window)

    def _apply_cache(self, messages: list[AgentMessage]) -> tuple[list[AgentMessage], _Cached | None]:
        """``(view, summary used)``: of the summaries whose covered head ``messages`` starts with,
        the one covering the most replaces that head (and moves to the front: the least recently
        used goes first); none: ``(messages, None)``."""
        for c in sorted(self._cache, key=lambda c: -len(c.covered)):
            if _starts_with(messages, c):
                self._cache.remove(c)
                self._cache.insert(0, c)
                return [c.summary, *messages[len(c.covered) :]], c
        return messages, None

    def _tokens(self, messages: list[AgentMessage], view: list[AgentMessage]) -> int:
        """``estimate_tokens(view)`` for a view of ``messages`` (itself, or the cached summary and
        the messages after the ones it covers), reading only the messages added since the last
        call (the estimate is a sum over messages)."""
        restart, new = self._growth.new(messages)
        if restart:
            self._sums = array("q", [0])
        for m in new:
            self._sums.append(self._sums[-1] + estimate_tokens([m]))
        if view is messages:
            return self._sums[-1]
        skipped = len(messages) - (len(view) - 1)
        return estimate_tokens(view[:1]) + self._sums[-1] - self._sums[skipped]

    async def __call__(
        self, messages: list[AgentMessage], signal: AbortSignal | None = None
    ) -> list[AgentMessage]:
        """Return the context for the next LLM call: unchanged when within budget, else summary + tail.

        Never raises for a summarizer failure (the full context is returned instead).
        """
        view, used = self._apply_cache(messages)
        if self._tokens(messages, view) <= self.budget_tokens:
            return view
        cut = find_cut(view, self.keep_recent_tokens)
        if cut is None:
            return view
        head, tail = view[:cut], view[cut:]
        summary_text = await self._summarize(head, signal)
        if summary_text is None:
            return view
        covered = self._covered(messages, used, cut)  # `used`: taken before the await
        if self.settle is not None:
            try:
                await self.settle()
            except Exception:  # then the head may not match the stored rows: kept in memory only
                log.warning(
                    "compaction of %s: writing the staged records failed", self.session_id, exc_info=True
                )
        try:
            anchor = await self._anchor(head)
            if anchor is not None:
                await self.repo.add_summary(self.session_id, summary_text, anchor)
        except Exception:
            log.exception(
                "compaction of %s: storing the summary failed, keeping the full context", self.session_id
            )
            metrics.COMPACTIONS.inc(outcome="failed")
            return view
        summary = summary_message(summary_text, anchor, now_ms())
        if anchor is None:
            log.warning(
                "compaction of %s: summarized messages are not stored yet; summary kept in memory",
                self.session_id,
            )
        entry = _Cached(covered=covered, summary=summary, objects=messages[: len(covered)])
        # it replaces the summary it was made over (the same list's older head), then the least used
        self._cache = [entry, *(c for c in self._cache if c is not used)][:CACHED_SUMMARIES]
        metrics.COMPACTIONS.inc(outcome="ok")
        return [summary, *tail]

    def _covered(self, messages: list[AgentMessage], used: _Cached | None, cut: int) -> list[str]:
        # The view was `messages` (no summary used) or [used.summary, *messages[len(used):]].
        n = cut if used is None else len(used.covered) + cut - 1
        return [_dump(m) for m in messages[:n]]

    async def _summarize(self, head: list[AgentMessage], signal: AbortSignal | None) -> str | None:
        ctx = Context(
            system_prompt=SUMMARY_SYSTEM_PROMPT,
            messages=[UserMessage(content="Summarize this conversation:\n\n" + render_for_summary(head))],
        )
        opts = SimpleStreamOptions(signal=signal, max_tokens=self.summary_max_tokens)
        reason: str
        try:
            with attributed(reason="compaction"):  # docs/decisions.md#spend-ledger
                result = await complete_simple(self.summary_model, ctx, opts)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            text = result.text().strip()
            if result.stop_reason not in ("error", "aborted") and text:
                return text
            reason = f"stop_reason={result.stop_reason} error={result.error_message!r} text_chars={len(text)}"
        log.warning("compaction of %s failed, keeping the full context: %s", self.session_id, reason)
        metrics.COMPACTIONS.inc(outcome="failed")
        return None

    async def _anchor(self, head: list[AgentMessage]) -> int | None:
        """Row id of the last summarized message, when every summarized message is a stored row
        (in order, right after the previous summary's anchor); else ``None``."""
        previous: int | None = None
        if head and isinstance(head[0], CustomMessage) and is_summary(head[0]):
            previous = head[0].data.get("anchor_message_id")
            if previous is None:
                return None  # the earlier summary itself was never stored
        msgs = [m for m in head if not is_summary(m)]
        stored = await self.repo.load_stored(self.session_id, after_id=previous)
        if len(stored) < len(msgs):
            return None
        if any(_dump(s.message) != _dump(m) for s, m in zip(stored, msgs, strict=False)):
            return None
        return stored[len(msgs) - 1].id


def make_compaction_hook(
    repo: ContextRepository, session_id: str, model: Model, **options: Any
) -> CompactionHook:
    """Build the ``transform_context`` hook for ``AgentLoopConfig`` (keywords as :class:`CompactionHook`)."""
    return CompactionHook(repo, session_id, model, **options)

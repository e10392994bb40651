"""The context budget: each LLM call of a turn sends a bounded window of history
(docs/decisions.md#agent-context-budget).

A ``transform_context`` step (:class:`ContextBudget`) that runs after compaction and before
``convert_to_llm``. The request it shapes holds, in the context's own order:

1. the system prompt and the tools (always);
2. *pinned* messages before the current turn (the compaction summary: the caller's predicate);
3. as much recent history as fits, taken **newest first** in whole *units* — a unit starts at a
   user or assistant message and carries the tool results (and host custom messages) that follow
   it, so an assistant tool call and its results go together or not at all, and the window never
   starts on a tool result; the fill stops at the first unit that does not fit (no gaps); without
   a pinned head the window's history opens with a user message (some providers reject a
   conversation that opens with the assistant);
4. the current turn: every message from the turn's start (its inbound message(s) and everything
   the loop added since), never cut.

Older messages are only left out of this call; nothing is deleted (they stay in SQL).

Tokens are the estimate of :mod:`runtime.llm.tokens` applied to what the model is sent (each
message through the agent's ``convert_to_llm``: a host marker that is never sent costs nothing),
multiplied by the model's calibration factor (:class:`TokenCalibration`: the bounded ratio of the
provider's reported input tokens to the estimate of the request, learned from every response).
What is added after this step (a structured-reply contract's instructions and schema) is given as
``overhead`` and counted as fixed; the request actually sent is estimated again at the innermost
``stream_fn`` (:meth:`ContextBudget.wrap_stream`) for the metric and the calibration.

When the fixed part (system prompt, tools, pinned, current turn) alone exceeds the budget, it is
sent anyway with no history, logged once per model and counted in
``sessionray_llm_context_over_budget_total``. Every request observes
``sessionray_llm_context_tokens`` (calibrated estimate of what was sent) and every call counts
left-out history in ``sessionray_llm_history_left_out_total``.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import math
import threading
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime import metrics
from runtime.agent.agent import Agent
from runtime.agent.config import StreamFnT, resolve
from runtime.agent.events import AgentEvent, MessageEndEvent
from runtime.agent.replay import default_convert_to_llm
from runtime.llm.abort import AbortSignal
from runtime.llm.events import AssistantMessageEventStream
from runtime.llm.growth import ContextGrowth
from runtime.llm.options import StreamOptions
from runtime.llm.tokens import (
    estimate_request_tokens,
    estimate_text_tokens,
    estimate_tokens,
    estimate_tools_tokens,
)
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Context,
    Model,
    ToolResultMessage,
    UserMessage,
)

__all__ = [
    "CALIBRATION",
    "DEFAULT_BUDGET_TOKENS",
    "BudgetMemo",
    "BudgetPolicy",
    "ContextBudget",
    "TokenCalibration",
    "Transform",
    "Window",
    "chain_transforms",
    "install_context_budget",
    "select_window",
]

log = logging.getLogger(__name__)

_UNIT_START = (UserMessage, AssistantMessage)

DEFAULT_BUDGET_TOKENS = 8000
"""``ai.agent.context_budget_tokens`` when unset, in (calibrated, estimated) tokens."""

Transform = Callable[[list[AgentMessage], AbortSignal | None], Any]
"""A ``transform_context`` hook: ``(messages, signal) -> messages`` (sync or async)."""


@dataclass(frozen=True)
class BudgetPolicy:
    """Budgets in tokens: ``default_tokens`` for every model, ``per_model`` overrides keyed by
    ``provider/id`` (:meth:`runtime.llm.types.Model.ref`). ``None`` = no budget (all history).

    Raises:
        ValueError: a budget below 1.
    """

    default_tokens: int | None = DEFAULT_BUDGET_TOKENS
    per_model: Mapping[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, v in [("default", self.default_tokens), *self.per_model.items()]:
            if v is not None and v < 1:
                raise ValueError(f"context budget of {name} must be >= 1 token or None, got {v}")

    @property
    def unlimited(self) -> bool:
        """No model has a budget (the default and every override ``None``): no window to choose."""
        return self.default_tokens is None and all(v is None for v in self.per_model.values())

    def tokens_for(self, model: Model) -> int | None:
        """The budget of ``model``: its override when it has one (even ``None``), else the default."""
        ref = model.ref()
        return self.per_model.get(ref, self.default_tokens)


class TokenCalibration:
    """Per model (``provider/id``): how many tokens the provider reports per estimated token.

    Each observation's ratio ``reported / estimated`` is clamped to ``[low, high]`` and folded in
    as an exponential moving average (weight ``smoothing`` for the newest); a model never observed
    has factor 1.0. Thread-safe; one instance per process (:data:`CALIBRATION`).

    Raises:
        ValueError: bounds not ``0 < low ≤ 1 ≤ high`` or ``smoothing`` outside (0, 1].
    """

    def __init__(self, *, low: float = 0.5, high: float = 6.0, smoothing: float = 0.5) -> None:
        if not 0 < low <= 1 <= high or not 0 < smoothing <= 1:
            raise ValueError(f"bad calibration bounds/smoothing: {low}, {high}, {smoothing}")
        self.low, self.high, self.smoothing = low, high, smoothing
        self._factors: dict[str, float] = {}
        self._lock = threading.Lock()

    def factor(self, model_ref: str) -> float:
        """The current factor of ``model_ref`` (1.0 when never observed)."""
        with self._lock:
            return self._factors.get(model_ref, 1.0)

    def observe(self, model_ref: str, estimated: int, reported: int) -> float | None:
        """Fold one call in: ``estimated`` (raw estimate of the request) vs ``reported`` (the
        provider's input + cache-read + cache-write tokens). Returns the new factor, or ``None``
        when either count is not positive (nothing learned)."""
        if estimated <= 0 or reported <= 0:
            return None
        ratio = min(self.high, max(self.low, reported / estimated))
        with self._lock:
            old = self._factors.get(model_ref)
            new = ratio if old is None else old + self.smoothing * (ratio - old)
            self._factors[model_ref] = new
            return new

    def reset(self) -> None:
        """Forget every factor (tests; a configuration reload)."""
        with self._lock:
            self._factors.clear()


CALIBRATION = TokenCalibration()
"""The process's calibration, shared by every session of the process."""


@dataclass(frozen=True)
class Window:
    """What :func:`select_window` chose.

    Attributes:
        messages: The messages to send (pinned, kept history, current turn; original order).
        estimated_tokens: Raw (uncalibrated) estimate of the whole request: fixed tokens +
            the costs of ``messages``.
        left_out: User, assistant and tool-result messages of the history left out.
        over_budget: The fixed part alone exceeded the budget (no history was sent).
    """

    messages: list[AgentMessage]
    estimated_tokens: int
    left_out: int = 0
    over_budget: bool = False


_SENT_KINDS = (UserMessage, AssistantMessage, ToolResultMessage)


class BudgetMemo:
    """What the budget step keeps of one session's growing context across its calls and turns
    (docs/decisions.md#agent-incremental-convert): each message's cost as sent (estimated once,
    when a window first needs it), where the pinned messages are, and how many history messages
    that are sent come before each position. A call whose list does not extend the last one's
    starts again. The costs assume the session renders a message the same way in every turn (one
    ``convert_to_llm`` per session). A memo made for one call gives :func:`select_window`."""

    def __init__(self, pinned: Callable[[AgentMessage], bool] = lambda m: False) -> None:
        self.pinned = pinned
        self._growth = ContextGrowth()
        self._clear()

    def _clear(self) -> None:
        self.costs = array("q")
        """Tokens of each message as sent; -1: not estimated yet."""
        self.pinned_at: list[int] = []
        self.sent_before = array("q", [0])
        """``sent_before[i]``: user, assistant and tool-result messages before ``i`` not pinned."""

    def update(self, messages: Sequence[AgentMessage]) -> None:
        """Take in the messages ``messages`` added since the last call (all: a new start)."""
        restart, new = self._growth.new(messages)
        if restart:
            self._clear()
        for m in new:
            pinned = self.pinned(m)
            if pinned:
                self.pinned_at.append(len(self.costs))
            self.costs.append(-1)
            self.sent_before.append(self.sent_before[-1] + (not pinned and isinstance(m, _SENT_KINDS)))


def _units_newest_first(
    messages: Sequence[AgentMessage], start: int, pinned: set[int]
) -> Iterator[list[int]]:
    """The history's units (the messages before ``start`` not in ``pinned``), newest first, each
    in context order (see the module docstring): a unit starts at a user or assistant message (or
    at the history's first message) and carries the tool results and host custom messages after
    it. Lazy: a long context is walked only as far as the window reaches."""
    first = 0
    while first in pinned:
        first += 1
    unit: list[int] = []
    for i in range(start - 1, first - 1, -1):
        if i in pinned:
            continue
        unit.append(i)
        if i == first or isinstance(messages[i], _UNIT_START):
            unit.reverse()
            yield unit
            unit = []


def select_window(
    messages: Sequence[AgentMessage],
    costs: Sequence[int] | Callable[[int], int],
    *,
    budget_tokens: int | None,
    fixed_tokens: int,
    current_start: int,
    pinned: Callable[[AgentMessage], bool] = lambda m: False,
    factor: float = 1.0,
    memo: BudgetMemo | None = None,
) -> Window:
    """Choose the messages of one call (pure; see the module docstring).

    Args:
        messages: The context after compaction.
        costs: Estimated tokens of each message as sent (0: never sent): a sequence of the same
            length, or ``(index) -> tokens``, asked only for the messages the choice needs (the
            pinned ones, the current turn, and history back to the first unit that does not fit).
        budget_tokens: The budget in calibrated tokens, or ``None`` (everything is kept).
        fixed_tokens: System prompt + tools, in raw estimated tokens.
        current_start: Index where the current turn starts (clamped to ``[0, len]``).
        pinned: Messages before the turn kept regardless (the compaction summary).
        factor: Calibration factor: ``factor × raw estimate ≤ budget_tokens``.
        memo: A :class:`BudgetMemo` already updated with ``messages`` (its ``pinned`` is used):
            the choice then costs what the window costs, not what the context costs.

    ``left_out`` counts the user, assistant and tool-result messages left out (host custom records
    are not counted).

    Raises:
        ValueError: a ``costs`` sequence whose length differs from ``messages``.
    """
    if not callable(costs):
        if len(costs) != len(messages):
            raise ValueError(f"{len(costs)} costs for {len(messages)} messages")
        cost_of: Callable[[int], int] = costs.__getitem__
    else:
        cost_of = costs
    if memo is None:
        memo = BudgetMemo(pinned)
        memo.update(messages)
    n = len(messages)
    start = max(0, min(current_start, n))
    head = list(itertools.takewhile(lambda i: i < start, memo.pinned_at))
    pinned_head = set(head)
    base = fixed_tokens + sum(cost_of(i) for i in head) + sum(cost_of(i) for i in range(start, n))
    if budget_tokens is None:
        history = (i for i in range(start) if i not in pinned_head)
        return Window(list(messages), base + sum(cost_of(i) for i in history))
    limit = math.floor(budget_tokens / factor)
    taken: list[list[int]] = []
    used = base
    for unit in _units_newest_first(messages, start, pinned_head):
        cost = sum(cost_of(i) for i in unit)
        if used + cost > limit:
            break
        used += cost
        taken.append(unit)
    while taken and not head and not isinstance(messages[taken[-1][0]], UserMessage):
        used -= sum(cost_of(i) for i in taken.pop())  # open the history with a user message
    keep = sorted(pinned_head.union(*taken))
    out = [messages[i] for i in keep] + list(messages[start:])
    kept_sent = sum(1 for unit in taken for i in unit if isinstance(messages[i], _SENT_KINDS))
    return Window(out, used, memo.sent_before[start] - kept_sent, base > limit)


_warned: set[str] = set()
"""Models whose over-budget warning was logged (once per process)."""


class ContextBudget:
    """The ``transform_context`` step of one turn's :class:`~runtime.agent.agent.Agent`.

    Reads the agent's current model, system prompt, tools and ``convert_to_llm`` at every call,
    so a model routed for the turn gets its own budget. Install with
    :func:`install_context_budget` (which also feeds :meth:`on_event` the responses).

    Args:
        agent: The turn's agent.
        policy: The budgets.
        pinned: Messages before the turn that are always sent (the compaction summary); with
            ``memo``, the memo's own predicate decides.
        turn_start: ``(messages) -> index | None`` of the current turn's first message; ``None``
            (or no answer): the last user message present at the first call, followed by
            identity afterwards (it is the same object on every call of the run).
        calibration: Default :data:`CALIBRATION`.
        overhead: ``(model) -> tokens`` added to the request after this step (a structured-reply
            contract's instructions, output tool or output schema), counted as fixed; the request
            actually sent is measured again by :meth:`wrap_stream` (metric, calibration).
        memo: The session's :class:`BudgetMemo`, kept across its turns (default: one for this
            step alone).
    """

    def __init__(
        self,
        agent: Agent,
        policy: BudgetPolicy,
        *,
        pinned: Callable[[AgentMessage], bool] = lambda m: False,
        turn_start: Callable[[Sequence[AgentMessage]], int | None] | None = None,
        calibration: TokenCalibration | None = None,
        overhead: Callable[[Model], int] | None = None,
        memo: BudgetMemo | None = None,
    ) -> None:
        self.agent = agent
        self.overhead = overhead
        self.policy = policy
        self.turn_start = turn_start
        self.calibration = calibration if calibration is not None else CALIBRATION
        self._first: AgentMessage | None = None
        self.memo = memo if memo is not None else BudgetMemo(pinned)
        """Costs and positions kept across calls (a session passes its own, kept across turns)."""
        self.last: Window | None = None
        """The window of the latest call (inspection)."""
        self._awaiting: tuple[str, int] | None = None
        """(model ref, raw estimate) of the request last sent, until its response calibrates."""

    def _current_start(self, messages: Sequence[AgentMessage]) -> int:
        if self.turn_start is not None:
            found = self.turn_start(messages)
            if found is not None:
                return found
        if self._first is not None:
            for i in range(len(messages) - 1, -1, -1):
                if messages[i] is self._first:
                    return i
        users = [i for i, m in enumerate(messages) if isinstance(m, UserMessage)]
        if not users:
            return 0  # no way to tell the turn apart: send everything
        self._first = messages[users[-1]]
        return users[-1]

    async def _cost_function(self, messages: list[AgentMessage]) -> Callable[[int], int]:
        """``(index) -> tokens`` of ``messages[index]`` as ``convert_to_llm`` renders it, kept in
        the memo (:meth:`BudgetMemo.update` ran with ``messages``). A sync converter is asked
        lazily (only the messages the choice needs: a long context costs what the window
        costs); an async one up front."""
        convert = self.agent.convert_to_llm or default_convert_to_llm
        costs = self.memo.costs

        def measured(i: int, sent: Any) -> int:
            costs[i] = estimate_tokens(sent, rendered=True)
            return costs[i]

        if inspect.iscoroutinefunction(convert) or inspect.iscoroutinefunction(type(convert).__call__):
            for i, m in enumerate(messages):
                if costs[i] < 0:
                    measured(i, await resolve(convert([m])))

        def cost(i: int) -> int:
            return costs[i] if costs[i] >= 0 else measured(i, convert([messages[i]]))

        return cost

    async def __call__(
        self, messages: list[AgentMessage], signal: AbortSignal | None = None
    ) -> list[AgentMessage]:
        """Return the window for the next LLM call (see the module docstring).

        Raises:
            ValueError: the agent has no model.
        """
        state = self.agent.state
        if state.model is None:
            raise ValueError("the context budget needs the agent's model")
        ref = state.model.ref()
        fixed = estimate_text_tokens(state.system_prompt) + estimate_tools_tokens(
            [t.to_tool() for t in state.tools]
        )
        fixed += self.overhead(state.model) if self.overhead is not None else 0
        factor = self.calibration.factor(ref)
        self.memo.update(messages)
        window = select_window(
            messages,
            await self._cost_function(messages),
            budget_tokens=self.policy.tokens_for(state.model),
            fixed_tokens=fixed,
            current_start=self._current_start(messages),
            factor=factor,
            memo=self.memo,
        )
        self.last = window
        if window.left_out:
            metrics.LLM_HISTORY_LEFT_OUT.inc(window.left_out, model=ref)
        if window.over_budget:
            metrics.LLM_CONTEXT_OVER_BUDGET.inc(model=ref)
            if ref not in _warned:
                _warned.add(ref)
                log.warning(
                    "context budget of %s (%s tokens) is smaller than the system prompt, tools, "
                    "summary and current turn (~%d tokens): sent without history (logged once)",
                    ref,
                    self.policy.tokens_for(state.model),
                    math.ceil(window.estimated_tokens * factor),
                )
        return window.messages

    def wrap_stream(self, inner: StreamFnT) -> StreamFnT:
        """The innermost ``stream_fn``: estimates each request exactly as the provider gets it
        (after the reply contract and a fallback's model choice), observes
        ``sessionray_llm_context_tokens`` (calibrated) and keeps the raw estimate for
        :meth:`on_event`; then calls ``inner``."""

        def measured(
            model: Model, context: Context, options: StreamOptions | None
        ) -> AssistantMessageEventStream:
            ref = model.ref()
            raw = estimate_request_tokens(context, options.output_schema if options is not None else None)
            self._awaiting = (ref, raw)
            metrics.LLM_CONTEXT_TOKENS.observe(raw * self.calibration.factor(ref), model=ref)
            return inner(model, context, options)

        return measured

    def on_event(self, event: AgentEvent, signal: AbortSignal | None = None) -> None:
        """Agent listener: a response's reported input tokens (input + cache read + cache write)
        calibrate the estimate of the model that was called."""
        if not isinstance(event, MessageEndEvent) or not isinstance(event.message, AssistantMessage):
            return
        sent, self._awaiting = self._awaiting, None
        u = event.message.usage
        reported = u.input + u.cache_read + u.cache_write
        if sent is not None and reported > 0:
            self.calibration.observe(sent[0], sent[1], reported)


def chain_transforms(*hooks: Transform | None) -> Transform | None:
    """One ``transform_context`` running ``hooks`` in order (``None`` s skipped); ``None`` when
    none is left, the hook itself when only one is."""
    present = [h for h in hooks if h is not None]
    if len(present) <= 1:
        return present[0] if present else None

    async def chained(messages: list[AgentMessage], signal: AbortSignal | None = None) -> list[AgentMessage]:
        for hook in present:
            out = hook(messages, signal)
            messages = list(await out if inspect.isawaitable(out) else out)
        return messages

    return chained


def install_context_budget(
    agent: Agent,
    policy: BudgetPolicy,
    *,
    before: Transform | None = None,
    pinned: Callable[[AgentMessage], bool] = lambda m: False,
    turn_start: Callable[[Sequence[AgentMessage]], int | None] | None = None,
    calibration: TokenCalibration | None = None,
    overhead: Callable[[Model], int] | None = None,
    memo: BudgetMemo | None = None,
) -> ContextBudget:
    """Make ``agent``'s ``transform_context`` = ``before`` (e.g. compaction) then the budget, wrap
    ``agent.stream_fn`` (the innermost one) with :meth:`ContextBudget.wrap_stream` and subscribe
    the budget to the agent's responses (calibration). Keywords as :class:`ContextBudget`.
    Returns the budget step."""
    budget = ContextBudget(
        agent,
        policy,
        pinned=pinned,
        turn_start=turn_start,
        calibration=calibration,
        overhead=overhead,
        memo=memo,
    )
    agent.transform_context = chain_transforms(before, budget)
    agent.stream_fn = budget.wrap_stream(agent.stream_fn)
    agent.subscribe(budget.on_event)
    return budget

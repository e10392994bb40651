"""The Ray-free heart of a live session: ordered inbox, overlapping turns, single writer, control.

``actors.placement.hosts.host.SessionHost`` hosts one :class:`SessionCore` per live session (many
per process); the core runs on one event loop and never imports Ray, so it is unit-testable on its
own.

Rules:

* **Ordered inbox, single consumer.** :meth:`SessionCore.submit` puts an entry keyed by its
  router-assigned ``seq`` into the inbox; one consumer task starts turns strictly in ``seq`` order
  (Ray does not order calls to an async actor, so arrival order means nothing;
  docs/decisions.md#session-ordered-inbox).
* **Overlapping turns.** Up to ``max_concurrent_turns`` turns of the session run at once
  (docs/decisions.md#session-concurrent-turns). Each sees the context as it was when it started.
  Every append goes through the session's :class:`~runtime.session.turn.SessionWriter`.
* **Hot chats answer in batches.** Where ``setup.coalesce`` is on for the chat's scope, one turn
  runs at a time; the entries that wait meanwhile (at most ``max_queue``) are answered together by
  the next turn (up to ``max_batch``), and one more gets the rate-limited busy notice instead
  (:mod:`runtime.session.coalesce`; docs/decisions.md#session-hot-chat-coalescing).
* **Replies keep chat order.** Turn *k* hands its reply to delivery only after turn *k-1* handed
  its own (or ended): the user sees answers in the order they asked
  (docs/decisions.md#session-reply-order).
* **Hand-off without waiting.** Handing a reply over is one write transaction: the turn's
  ``im_reply`` record and the reply's ``queued`` row in the delivery ledger, then a notification
  the turn does not wait on (docs/decisions.md#delivery-outbox). The turn ends before the platform
  answers; the delivery actor sends the chat's queued replies in that (ledger) order.
* **Control.** ``steer`` goes to the latest active turn (reaches its next LLM call);
  ``follow_up`` queues on it (drained when it would stop). With no active turn, or when the text
  was still queued as the turn ended, the text runs as a turn of its own — nothing is dropped.
  Master-only checks happen before (router), so the core trusts its caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from runtime import metrics, tracing
from runtime.agent.context_budget import BudgetMemo
from runtime.agent.replay import IncrementalConvert
from runtime.llm.attribution import attributed
from runtime.llm.types import (
    AgentMessage,
    UserMessage,
)
from runtime.memory.compaction import CompactionHook, is_summary
from runtime.reply.provenance import IdentityFold
from runtime.reply.segments import Reply
from runtime.session.coalesce import (
    Answering,
    BusyNotices,
    answer_overflow,
    answering_of_resumed,
    batchable,
    coalescing_for,
    policy_turn,
)
from runtime.session.context_window import compaction_hook, install_context_hooks
from runtime.session.exchanges import Exchanges
from runtime.session.handover import HandOver
from runtime.session.spend import SessionSpend, turn_owner
from runtime.session.turn import (
    INBOUND_MARKER,
    REPLY_MARKER,
    DeliverFn,
    SessionSetup,
    SessionWriter,
    TurnInput,
    TurnResult,
    control_turn,
    find_marker,
)
from runtime.session.turn_agent import (
    TurnControl,
    abort_notice,
    control_message,
    convert_for_session,
    resume_turn,
    run_agent,
    run_pre_tools,
)
from runtime.session.turn_queue import TurnQueue
from runtime.session.turn_tools import SpawnFn, deferred_result, make_deferred_task_tool, spawn_in_thread

__all__ = ["ControlOutcome", "SessionCore"]

log = logging.getLogger("sessionray.session")

ControlOutcome = Literal["steered", "queued", "started"]
"""``steered``/``queued``: joined the latest active turn; ``started``: ran as a new turn."""

AgentRunner = Callable[[SessionSetup, list[AgentMessage], str, TurnControl, Any], Awaitable[Reply]]


class SessionCore:
    """One live session epoch: its writer, inbox and running turns.

    Build with :meth:`open`. All methods must be called on the loop that ran :meth:`open`.

    Args:
        session_key: ``platform:bot_id:scope:scene_id``.
        session_id: The active epoch ``{session_key}#{epoch}``.
        setup: Model, tools, prompt, queue modes.
        repo: A ``ContextRepository``.
        writer: The session's single writer (holds the loaded context).
        deliver: Notifies delivery of a reply just queued in the ledger (returns at once;
            :data:`~runtime.session.turn.DeliverFn`).
        next_seq: The first ``seq`` the inbox expects (1 for a fresh session; the lowest pending
            seq when the session is re-activated after a crash).
        max_concurrent_turns: Turns of this session that may run at once (≥ 1; the session host
            passes ``runtime.max_concurrent_turns``, whose default lives in the config model).
        run_agent_fn: The agent part of a turn (default :func:`runtime.session.turn_agent.run_agent`).
        spawn: Runs a deferred task's function (default: a thread; the actor passes a Ray task).
        delivery_partitions: ``runtime.delivery_actors``: a queued reply's ledger ``partition`` is
            ``crc32(session_key) % delivery_partitions``.
    """

    def __init__(
        self,
        session_key: str,
        session_id: str,
        setup: SessionSetup,
        repo: Any,
        writer: SessionWriter,
        deliver: DeliverFn,
        *,
        max_concurrent_turns: int,
        next_seq: int = 1,
        run_agent_fn: AgentRunner = run_agent,
        spawn: SpawnFn = spawn_in_thread,
        delivery_partitions: int = 1,
    ) -> None:
        if max_concurrent_turns < 1:
            raise ValueError("max_concurrent_turns must be ≥ 1")
        self.session_key = session_key
        self.session_id = session_id
        self.setup = setup
        self.repo = repo
        self.writer = writer
        self.deliver = deliver
        self.closing = False
        """Set by :meth:`close`: an abort then is not the user's."""
        self._hand_over = HandOver(
            session_key, lambda: self.writer, lambda: self.deliver, delivery_partitions
        )
        self.scope = session_key.split(":")[2] if session_key.count(":") >= 3 else "private"
        self._llm_view: IncrementalConvert | None = None
        """Made by the first turn without a context window: such turns convert only what is new
        (agent-incremental-convert)."""
        self._identity_fold = IdentityFold()
        """The reply's mention ids, kept across turns (agent-incremental-convert)."""
        self._compaction: CompactionHook | None = None
        """The epoch's compaction hook, kept across turns (its summaries: memory-compaction)."""
        self._budget_memo = BudgetMemo(is_summary) if setup.context_budget is not None else None
        """The budget step's costs and positions, kept across turns (agent-incremental-convert)."""
        self._run_agent = run_agent_fn
        self._spawn_deferred = spawn
        if setup.deferred_tasks:
            tool = make_deferred_task_tool(setup.deferred_tasks, self._start_deferred)
            self.setup = dataclasses.replace(setup, tools=[*setup.tools, tool])
        self._queue = TurnQueue(next_seq)
        self._coalesce = coalescing_for(setup.coalesce, self.scope)
        # a coalescing chat runs one turn at a time (docs/decisions.md#session-hot-chat-coalescing)
        self._slots = asyncio.Semaphore(1 if self._coalesce is not None else max_concurrent_turns)
        self._busy = BusyNotices(self._coalesce) if self._coalesce is not None else None
        self._exchanges = Exchanges(lambda: self.writer)
        self._consumer: asyncio.Task[None] | None = None
        self._active: list[TurnControl] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._last_handoff: asyncio.Future[None] | None = None
        self.turns_done = 0
        self.loaded_messages = len(writer)
        self.last_activity = time.monotonic()
        self.spend = SessionSpend.of(repo, setup.features)  # ledger + quotas (docs/decisions.md#spend-quotas)

    @classmethod
    async def open(
        cls,
        session_key: str,
        repo: Any,
        setup: SessionSetup,
        deliver: DeliverFn,
        *,
        max_concurrent_turns: int,
        next_seq: int = 1,
        run_agent_fn: AgentRunner = run_agent,
        spawn: SpawnFn = spawn_in_thread,
        delivery_partitions: int = 1,
    ) -> SessionCore:
        """Load (or create) the active epoch of ``session_key`` from SQL and return its core.

        Raises:
            SessionKeyError: malformed key. Database errors propagate.
        """
        session_id, context = await repo.open_active(session_key, model=setup.model.ref())
        writer = SessionWriter(repo, session_id, list(context.messages))
        return cls(
            session_key,
            session_id,
            setup,
            repo,
            writer,
            deliver,
            next_seq=next_seq,
            max_concurrent_turns=max_concurrent_turns,
            run_agent_fn=run_agent_fn,
            spawn=spawn,
            delivery_partitions=delivery_partitions,
        )

    # ------------------------------------------------------------------ inbox

    async def submit(self, turn: TurnInput) -> TurnResult:
        """Queue an inbound entry and wait until its turn ended (reply handed to delivery). In a
        coalescing chat an entry over the queue is answered at once (outcome ``busy``:
        :func:`runtime.session.coalesce.answer_overflow`), and an entry that joined a batch gets
        the batch turn's result (its own ``seq`` and ``message_id``, the batch's ``reply_id``). An
        entry whose message id is already queued gets that entry's result (one answer, one ask).

        Raises:
            ValueError: ``turn.seq`` was already started or is already queued (the router never
                sends one twice to the same activation).
        """
        self._queue.check(turn, self.session_key)
        self.last_activity = time.monotonic()
        twin = self._queue.twin(turn)
        if twin is not None:  # the same message while it waits: answered once, by its first copy
            self._queue.skip(turn.seq)
            self._kick()
            first = await asyncio.shield(twin)
            return first.model_copy(update={"seq": turn.seq})
        if (
            self._busy is not None
            and len(self._queue) >= self._busy.config.max_queue
            and self._batchable(turn)
        ):
            self._queue.skip(turn.seq)  # over the queue: recorded, the busy notice (rate-limited)
            self._kick()
            append = self._exchanges.append_between
            return await answer_overflow(turn, self.session_id, self._busy, self._hand_over, append)
        fut: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        self._queue.put((turn, fut))
        self._kick()
        return await fut

    def _kick(self) -> None:
        if self._consumer is None or self._consumer.done():
            self._consumer = asyncio.create_task(self._consume())

    async def _consume(self) -> None:
        # The single consumer: starts turns in seq order, at most max_concurrent_turns at once —
        # one at a time where the chat coalesces, each taking what waited as one batch.
        while self._queue.ready():
            await self._slots.acquire()
            batch = self._queue.take(self._coalesce.max_batch if self._coalesce else 1, self._batchable)
            turns = [t for t, _ in batch]
            self._spawn(self._execute(turns, [f for _, f in batch], release=True))

    def _batchable(self, turn: TurnInput) -> bool:
        """An inbound message that is neither a chat command (answered before the agent,
        docs/decisions.md#chat-commands) nor the retry of a recorded turn (it resumes alone)."""
        return batchable(turn, self.setup.features, self.writer.snapshot)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ turns

    async def _execute(
        self,
        turns: list[TurnInput],
        futs: Sequence[asyncio.Future[TurnResult] | None],
        *,
        release: bool,
    ) -> None:
        lead = turns[0]
        ctl = TurnControl(policy_turn(turns), self.setup.steering_mode, self.setup.follow_up_mode)
        # compaction, then the history window (docs/decisions.md#agent-context-budget)
        self._compaction = compaction_hook(
            self.setup, self.repo, self.session_id, self._compaction, settle=self._flush
        )
        install_context_hooks(ctl.agent, self.setup, lead, self._compaction, self._budget_memo)
        ctl.identity_fold = self._identity_fold
        if ctl.agent.transform_context is None:  # the whole context goes: keep its conversion
            if self._llm_view is None:  # (docs/decisions.md#agent-incremental-convert)
                self._llm_view = IncrementalConvert(convert_for_session(self.scope))
            ctl.llm_view = self._llm_view
        self._active.append(ctl)
        prev, mine = self._last_handoff, asyncio.get_running_loop().create_future()
        self._last_handoff = mine
        t0 = time.perf_counter()
        try:
            with (
                attributed(turn_owner(lead, self.session_id)),  # docs/decisions.md#spend-ledger
                self.spend.carried(lambda write: self.writer.stage_write(write)),
                tracing.span("turn", parent=lead.traceparent, seq=lead.seq, batch=len(turns)) as step,
            ):
                result = await self._turn(turns, ctl, prev, mine)
                step.set(outcome=result.outcome)
        except Exception as exc:
            result = TurnResult(seq=lead.seq, message_id=lead.message_id, outcome="error", error=repr(exc))
            await self._record_held(ctl)
        finally:
            self._active.remove(ctl)
            await self._exchanges.end(ctl)
            await self._write_staged_usage()
            if not mine.done():
                mine.set_result(None)
            if release:
                self._slots.release()
            self.last_activity = time.monotonic()
            for kind, msg in ctl.leftovers():
                self._start_control_turn(kind, msg)
        result.latency_ms = (time.perf_counter() - t0) * 1000
        self.turns_done += 1
        metrics.TURNS.inc(platform=lead.platform, outcome=result.outcome)
        metrics.TURN_LATENCY.observe(result.latency_ms / 1000, platform=lead.platform)
        if self._coalesce is not None and lead.kind == "inbound":
            metrics.COALESCED_BATCH.observe(len(turns), platform=lead.platform)
        for t, fut in zip(turns, futs, strict=True):
            if fut is not None and not fut.done():
                fut.set_result(result.model_copy(update={"seq": t.seq, "message_id": t.message_id}))

    async def _turn(
        self,
        turns: list[TurnInput],
        ctl: TurnControl,
        prev: asyncio.Future[None] | None,
        mine: asyncio.Future[None] | None = None,
    ) -> TurnResult:
        """Run one turn over ``turns`` (one entry, or a coalesced batch) and hand its reply over.
        A retried entry whose inbound marker is recorded resumes its turn (a batch member: the
        whole batch, under the batch's reply id; docs/decisions.md#session-crash-recovery)."""
        lead = turns[0]
        messages = self.writer.snapshot()
        resumed = lead.attempt > 0 and find_marker(messages, INBOUND_MARKER, lead.message_id) is not None
        if not resumed:
            answering = Answering.of(turns, self.session_id)
            reply, messages = await self._begin(turns, answering, ctl)
        else:
            answering = answering_of_resumed(messages, lead, self.session_id)
            if find_marker(messages, REPLY_MARKER, lead.message_id) is not None:
                return answering.result(lead, "already_done")
            if answering.is_batch:  # the askers' roles are not recorded: no one's rights
                ctl.turn = ctl.turn.model_copy(update={"sender": {**ctl.turn.sender, "roles": []}})
            reply, messages = await resume_turn(self.setup, ctl, messages, self.writer.append)
        if reply is None:
            visible = self._exchanges.visible(messages, ctl)
            setup = answering.setup_for(self.setup)  # a batch: the model is told so
            reply = await self._run_agent(setup, visible, self.scope, ctl, self._exchanges.recorder(ctl))
        return await self._finish(lead, answering, reply, ctl, prev, mine)

    async def _begin(
        self, turns: list[TurnInput], answering: Answering, ctl: TurnControl
    ) -> tuple[Reply | None, list[AgentMessage]]:
        """A new turn: answer a chat command before (and never shown to) the agent
        (docs/decisions.md#chat-commands), or stage each message's ``im_inbound`` marker and user
        message: the turn's next write carries them (docs/decisions.md#session-turn-records).
        Returns ``(reply or None, context)``."""
        lead, features = turns[0], self.setup.features
        command = features.command(lead) if features is not None and len(turns) == 1 else None
        if command is not None:
            return await features.run_command(command, lead, self, ctl), self.writer.snapshot()
        if (refused := await self.spend.refusal(turn_owner(lead, self.session_id))) is not None:
            return refused, self.writer.snapshot()  # over a quota: the agent never runs
        pre = await run_pre_tools(self.setup.pre_tools, ctl.turn)
        first: list[AgentMessage] = [pre] if pre is not None else []
        records = list(first) if answering.is_batch else []  # a batch's user messages stay last
        for i, t in enumerate(turns):
            marker = answering.inbound_marker(t, i, self.session_id)
            records += [marker, *first] if i == 0 and not answering.is_batch else [marker]
            records.append(
                await features.user_message(t, self.setup.model) if features is not None else t.user_message()
            )
        return None, await self.writer.stage(records)

    async def _finish(
        self,
        lead: TurnInput,
        answering: Answering,
        reply: Reply,
        ctl: TurnControl,
        prev: asyncio.Future[None] | None,
        mine: asyncio.Future[None] | None,
    ) -> TurnResult:
        """Wait for the previous turn's hand-over (chat order), then hand this turn's reply over
        with the final answer and one ``im_reply`` marker per answered message; an abort sends the
        fixed notice (a master's) or nothing (the session's close: the inbox replays the entry)."""
        aborted = ctl.abort_controller.signal.aborted
        if prev is not None and not prev.done():
            await self._write_staged_usage(waiting=True)  # its calls' rows must not wait for prev
        if prev is not None:
            await asyncio.shield(prev)  # chat order: the previous turn hands its reply first
        if aborted:
            await self._record_held(ctl)
        if aborted and self.closing:  # not the user's abort: the inbox replays the message
            return TurnResult(  # (docs/decisions.md#inbox-durable)
                seq=lead.seq, message_id=lead.message_id, outcome="error", error="session closed mid-turn"
            )
        if aborted:  # a master's abort: the fixed notice, never a part of the cut-off answer
            notice = abort_notice(self.setup)
            if notice is None:
                return answering.result(lead, "aborted")
            reply = notice
        preview = reply.preview_text()
        records = [*ctl.unrecorded, *answering.reply_markers(preview)]  # the answer goes with them
        if reply.is_empty():
            await self.writer.append(records)
        else:
            await self._hand_over(answering.job(lead, self.session_key, reply), records)
        ctl.unrecorded = []  # written (a failed write leaves it for the error path to record)
        if mine is not None and not mine.done():
            mine.set_result(None)  # the next turn may hand its reply over now (chat order kept)
        outcome: Literal["ok", "empty", "aborted"] = "empty" if reply.is_empty() else "ok"
        return answering.result(lead, "aborted" if aborted else outcome, preview=preview)

    async def _write_staged_usage(self, *, waiting: bool = False) -> None:
        """Write the staged usage rows now: when a turn ended and no other runs (a call that
        ended after its turn's last write; while another turn runs, its writes or its end carry
        them), or — ``waiting`` — when a turn is about to wait for the previous turn's hand-over
        (chat order), which may take as long as that turn's tools run. Never raises (a failed
        write is logged; the rows stay staged for the session's next write)."""
        if self.writer.staged_writes and (waiting or not self._active):
            try:
                await self.writer.flush()
            except Exception:
                log.exception("writing the usage rows of a turn of %s failed", self.session_key)

    async def _flush(self) -> None:
        """Write the staged records of the session's writer (the compaction's anchor matches
        stored rows only)."""
        await self.writer.flush()

    async def _record_held(self, ctl: TurnControl) -> None:
        """Record the turn's held final answer (``ctl.unrecorded``) and the staged records on
        their own: the turn ends without a reply record (aborted, closed, failed), as if recorded
        when it ended. Never raises (a failed write is logged; the retried turn then calls the
        model again)."""
        try:
            await ctl.record_unrecorded(self.writer.append)
            await self.writer.flush()
        except Exception:
            log.exception("recording the final answer of %s failed", self.session_key)

    # ------------------------------------------------------------------ deferred tasks

    def _start_deferred(self, call_id: str, task: str, args: dict[str, Any]) -> None:
        self._spawn(self._run_deferred(call_id, task, args))

    async def _run_deferred(self, call_id: str, task: str, args: dict[str, Any]) -> None:
        """Run a deferred task, deliver its result as its own message, record it (never raises)."""
        try:
            result = await self._spawn_deferred(self.setup.deferred_tasks[task], args)
        except Exception as exc:
            result = f"deferred task {task} failed: {exc}"
        prev = self._last_handoff
        if prev is not None:
            await asyncio.shield(prev)  # after the reply of the turn that started it (chat order)
        job, marker = deferred_result(self.session_key, self.session_id, call_id, task, result)
        try:
            await self._hand_over(job, [marker])
        except Exception:
            log.exception("deferred task %s of %s: delivery failed", task, self.session_key)

    def _start_control_turn(self, kind: Literal["steer", "follow_up"], msg: UserMessage) -> None:
        sender = (msg.sender or {}).get("id", "")
        text = msg.content if isinstance(msg.content, str) else ""
        self._spawn(
            self._execute([control_turn(self.session_key, kind, text, str(sender))], [None], release=False)
        )

    # ------------------------------------------------------------------ control
    # (docs/decisions.md#steer-latest-turn)

    def steer(self, text: str, sender_id: str) -> ControlOutcome:
        """Inject ``text`` into the latest active turn (it enters the context before that turn's
        next LLM call; tools of the running batch are not skipped). No active turn: run as a turn."""
        return self._control("steer", text, sender_id)

    def follow_up(self, text: str, sender_id: str) -> ControlOutcome:
        """Queue ``text`` on the latest active turn (used when it would stop); no active turn: run
        as a turn."""
        return self._control("follow_up", text, sender_id)

    def _control(self, kind: Literal["steer", "follow_up"], text: str, sender_id: str) -> ControlOutcome:
        msg = control_message(text, sender_id)
        for ctl in reversed(self._active):
            if not ctl.closed:
                (ctl.steer if kind == "steer" else ctl.follow_up)(msg)
                return "steered" if kind == "steer" else "queued"
        self._start_control_turn(kind, msg)
        return "started"

    def abort(self, why: str = "a master") -> int:
        """Abort every running turn (stop_reason ``aborted``; the abort's reason reads ``aborted by
        {why}``). A master's abort answers each turn with the host's fixed abort notice
        (``SessionSetup.abort_text``; docs/decisions.md#agent-abort-valid-context); a turn cut off
        by a close sends nothing (it is replayed). Queued inbox entries still run. Returns how many
        turns were aborted."""
        n = 0
        for ctl in list(self._active):
            if not ctl.abort_controller.signal.aborted:
                ctl.abort_controller.abort(f"aborted by {why}")
                n += 1
        return n

    async def archive(self) -> str:
        """``/new``: archive the active epoch and continue in a fresh, empty one; returns the new
        ``session_id``. A running turn's question stays in the old epoch: the old writer's staged
        records are written to it before archiving, and once more after the new writer took over
        (a turn may stage into the old one while the archive is written). What a running turn
        writes after that (its answer, its ``im_reply``) goes through the new writer.

        Raises:
            Whatever the first write of them raises (then nothing was archived)."""
        old = self.writer
        await old.flush()
        self.session_id = await self.repo.archive_session(self.session_key)
        self.writer = SessionWriter(self.repo, self.session_id, [])
        try:
            await old.flush()
        except Exception:
            log.exception("writing the staged records of %s's archived epoch failed", self.session_key)
        return self.session_id

    @property
    def idle(self) -> bool:
        """No queued entry and no running turn (safe to passivate)."""
        return not self._queue and not self._active and not self._tasks

    @property
    def next_seq(self) -> int:
        """The next ``seq`` the inbox will start."""
        return self._queue.next_seq

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot: ``session_key``, ``session_id``, ``active_turns``, ``queued``,
        ``next_seq``, ``turns_done``, ``messages`` (context length), ``idle_s``."""
        return {
            "session_key": self.session_key,
            "session_id": self.session_id,
            "active_turns": len(self._active),
            "queued": len(self._queue),
            "next_seq": self._queue.next_seq,
            "turns_done": self.turns_done,
            "messages": len(self.writer),
            "idle_s": round(time.monotonic() - self.last_activity, 3),
        }

    async def close(self, timeout_s: float = 5.0, why: str = "the session's close") -> None:
        """Abort what still runs (reason ``aborted by {why}``, e.g. ``the shutdown``) and wait
        (bounded) for the tasks to end (passivation, shutdown); a turn cut off so ends as
        ``error`` (not handled: replayed from the inbox)."""
        self.closing = True
        self.abort(why)
        if self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(set(self._tasks), timeout=timeout_s)
        try:  # a turn cut off before its next write
            await self.writer.flush()
        except Exception:
            log.exception("writing the staged records of %s at its close failed", self.session_key)
        if self.setup.features is not None:  # MCP connections
            with contextlib.suppress(Exception):
                await self.setup.features.close()

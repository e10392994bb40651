"""The Ray-free heart of a live session: ordered inbox, overlapping turns, single writer, control.

``actors.placement.hosts.host.SessionHost`` hosts one :class:`SessionCore` per live session (many per
process); the core runs on one event loop and never imports Ray, so it is unit-testable on its own.

Rules:

* **Ordered inbox, single consumer.** :meth:`SessionCore.submit` puts an entry keyed by its
  router-assigned ``seq`` into the inbox; one consumer task starts turns strictly in ``seq`` order
  (Ray does not order calls to an async actor, so arrival order means nothing;
  docs/decisions.md#session-ordered-inbox).
* **Overlapping turns.** Up to ``max_concurrent_turns`` turns of the session run at once
  (docs/decisions.md#session-concurrent-turns). Each sees the context as it was when it started.
  Every append goes through the session's :class:`~runtime.session.turn.SessionWriter`.
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

from runtime import metrics
from runtime.delivery.job import DeliveryJob, partition_of
from runtime.delivery.outbox import queue_writer
from runtime.llm.attribution import attributed
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    ToolResultMessage,
    UserMessage,
    now_ms,
)
from runtime.reply.segments import Reply
from runtime.session.context_window import install_context_hooks
from runtime.session.spend import SessionSpend, turn_owner
from runtime.session.turn import (
    INBOUND_MARKER,
    REPLY_MARKER,
    DeliverFn,
    SessionSetup,
    SessionWriter,
    TurnInput,
    TurnResult,
    close_orphan_tool_calls,
    control_turn,
    find_marker,
    inbound_marker,
    reply_marker,
)
from runtime.session.turn_agent import (
    TurnControl,
    abort_notice,
    control_message,
    finalize_reply,
    run_agent,
    run_pre_tools,
)
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
        self._partition = partition_of(session_key, delivery_partitions)
        self.scope = session_key.split(":")[2] if session_key.count(":") >= 3 else "private"
        self._run_agent = run_agent_fn
        self._spawn_deferred = spawn
        if setup.deferred_tasks:
            tool = make_deferred_task_tool(setup.deferred_tasks, self._start_deferred)
            self.setup = dataclasses.replace(setup, tools=[*setup.tools, tool])
        self._next_seq = next_seq
        self._inbox: dict[int, tuple[TurnInput, asyncio.Future[TurnResult]]] = {}
        self._slots = asyncio.Semaphore(max_concurrent_turns)
        self._consumer: asyncio.Task[None] | None = None
        self._active: list[TurnControl] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._last_handoff: asyncio.Future[None] | None = None
        self._inflight: dict[int, TurnControl] = {}
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
        """Queue an inbound entry and wait until its turn ended (reply handed to delivery).

        Raises:
            ValueError: ``turn.seq`` was already started or is already queued (the router never
                sends one twice to the same activation).
        """
        if turn.seq < self._next_seq or turn.seq in self._inbox:
            raise ValueError(
                f"seq {turn.seq} of {self.session_key} was already submitted (next {self._next_seq})"
            )
        fut: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        self._inbox[turn.seq] = (turn, fut)
        self.last_activity = time.monotonic()
        if self._consumer is None or self._consumer.done():
            self._consumer = asyncio.create_task(self._consume())
        return await fut

    async def _consume(self) -> None:
        # The single consumer: starts turns in seq order, at most max_concurrent_turns at once.
        while self._next_seq in self._inbox:
            await self._slots.acquire()
            turn, fut = self._inbox.pop(self._next_seq)
            self._next_seq += 1
            self._spawn(self._execute(turn, fut, release=True))

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ turns

    async def _execute(
        self, turn: TurnInput, fut: asyncio.Future[TurnResult] | None, *, release: bool
    ) -> None:
        ctl = TurnControl(turn, self.setup.steering_mode, self.setup.follow_up_mode)
        # compaction, then the history window (docs/decisions.md#agent-context-budget)
        install_context_hooks(ctl.agent, self.setup, self.repo, self.session_id, turn)
        self._active.append(ctl)
        prev, mine = self._last_handoff, asyncio.get_running_loop().create_future()
        self._last_handoff = mine
        t0 = time.perf_counter()
        try:
            with attributed(turn_owner(turn, self.session_id)):  # docs/decisions.md#spend-ledger
                result = await self._turn(turn, ctl, prev, mine)
        except Exception as exc:
            result = TurnResult(seq=turn.seq, message_id=turn.message_id, outcome="error", error=repr(exc))
            await self._record_held(ctl)
        finally:
            self._active.remove(ctl)
            self._inflight = {k: v for k, v in self._inflight.items() if v is not ctl}
            if not mine.done():
                mine.set_result(None)
            if release:
                self._slots.release()
            self.last_activity = time.monotonic()
            for kind, msg in ctl.leftovers():
                self._start_control_turn(kind, msg)
        result.latency_ms = (time.perf_counter() - t0) * 1000
        self.turns_done += 1
        metrics.TURNS.inc(platform=turn.platform, outcome=result.outcome)
        metrics.TURN_LATENCY.observe(result.latency_ms / 1000, platform=turn.platform)
        if fut is not None and not fut.done():
            fut.set_result(result)

    async def _turn(
        self,
        turn: TurnInput,
        ctl: TurnControl,
        prev: asyncio.Future[None] | None,
        mine: asyncio.Future[None] | None = None,
    ) -> TurnResult:
        reply_id = turn.reply_id(self.session_id)
        done = TurnResult(seq=turn.seq, message_id=turn.message_id, outcome="already_done", reply_id=reply_id)
        messages = self.writer.snapshot()
        start = find_marker(messages, INBOUND_MARKER, turn.message_id) if turn.attempt > 0 else None
        reply: Reply | None = None
        features = self.setup.features  # runtime.session.features
        command = features.command(turn) if features is not None and start is None else None
        if start is not None:
            # Crash retry (docs/decisions.md#session-crash-recovery): the entry was recorded before
            # the crash.
            if find_marker(messages, REPLY_MARKER, turn.message_id) is not None:
                return done
            messages = await self.writer.append(close_orphan_tool_calls(messages))
            final = messages[-1]
            if isinstance(final, AssistantMessage):  # the answer was produced; only the handoff is missing
                sender = turn.sender.get("id")
                reply = await finalize_reply(
                    self.setup,
                    final,
                    messages,
                    str(sender) if sender else None,
                    ctl,
                    record=self.writer.append,
                )
        elif command is not None:
            # a chat command is answered before (and never shown to) the agent
            # (docs/decisions.md#chat-commands)
            reply = await features.run_command(command, turn, self, ctl)
        elif (refused := await self.spend.refusal(turn_owner(turn, self.session_id))) is not None:
            reply = refused  # over a quota: answered like a command, the agent never runs
        else:
            pre = await run_pre_tools(self.setup.pre_tools, turn)
            records: list[AgentMessage] = [inbound_marker(turn, self.session_id)]
            records += [pre] if pre is not None else []
            records.append(
                await features.user_message(turn, self.setup.model)
                if features is not None
                else turn.user_message()
            )
            messages = await self.writer.append(records)
        if reply is None:
            visible = [m for m in messages if self._inflight.get(id(m), ctl) is ctl]
            reply = await self._run_agent(self.setup, visible, self.scope, ctl, self._recorder(ctl))
        aborted = ctl.abort_controller.signal.aborted
        if prev is not None:
            await asyncio.shield(prev)  # chat order: the previous turn hands its reply first
        if aborted:
            await self._record_held(ctl)
        if aborted and self.closing:  # not the user's abort: the inbox replays the message
            return TurnResult(  # (docs/decisions.md#inbox-durable)
                seq=turn.seq, message_id=turn.message_id, outcome="error", error="session closed mid-turn"
            )
        if aborted:  # a master's abort: the fixed notice, never a part of the cut-off answer
            reply = abort_notice(self.setup)
            if reply is None:
                return TurnResult(
                    seq=turn.seq, message_id=turn.message_id, outcome="aborted", reply_id=reply_id
                )
        preview = reply.preview_text()
        marker = reply_marker(turn, reply_id, preview)
        records = [*ctl.unrecorded, marker]  # the final answer goes with the reply's records
        if reply.is_empty():
            await self.writer.append(records)
        else:
            job = DeliveryJob(
                reply_id=reply_id,
                session_key=self.session_key,
                platform=turn.platform,
                bot_id=turn.bot_id,
                scene_type=turn.scene_type,
                scene_id=turn.scene_id,
                reply_to=turn.message_id if turn.kind == "inbound" else None,
                reply=reply,
            )
            await self._hand_over(job, records)
        ctl.unrecorded = []  # written (a failed write leaves it for the error path to record)
        if mine is not None and not mine.done():
            mine.set_result(None)  # the next turn may hand its reply over now (chat order kept)
        outcome: Literal["ok", "empty", "aborted"] = "empty" if reply.is_empty() else "ok"
        outcome = "aborted" if aborted else outcome
        return TurnResult(
            seq=turn.seq, message_id=turn.message_id, outcome=outcome, reply_id=reply_id, preview=preview
        )

    async def _hand_over(self, job: DeliveryJob, records: list[AgentMessage]) -> None:
        """Append ``records`` (the turn's final answer and its ``im_reply`` marker) and ``job``'s
        ``queued`` ledger row in one transaction, then notify delivery without waiting for the
        platform (docs/decisions.md#delivery-outbox). The ledger places the row after the chat's
        unfinished ones (``runtime.delivery.outbox.next_created_at``): the chat's order.

        Raises:
            Whatever the append raises (then neither the records nor the row were written).
        """
        await self.writer.append(records, also=queue_writer(job, self._partition, now_ms()))
        try:
            await self.deliver(job)
        except Exception:  # the row is durable: the delivery actor's sweep sends it
            log.exception("notifying delivery of %s failed; its sweep will send it", job.reply_id)

    async def _record_held(self, ctl: TurnControl) -> None:
        """Record the turn's held final answer (``ctl.unrecorded``) on its own: the turn ends
        without a reply record (aborted, closed, failed), as if recorded when it ended. Never
        raises (a failed write is logged; the retried turn then calls the model again)."""
        try:
            await ctl.record_unrecorded(self.writer.append)
        except Exception:
            log.exception("recording the final answer of %s failed", self.session_key)

    def _recorder(self, ctl: TurnControl) -> Callable[[Sequence[AgentMessage]], Awaitable[Any]]:
        """The record function of one turn: appends through the writer and marks the turn's
        assistant messages and tool results as in flight, so a turn that starts meanwhile does not
        see another turn's half-done tool exchange (it sees it once that turn ended)."""

        async def record(messages: Sequence[AgentMessage]) -> Any:
            for m in messages:
                if isinstance(m, AssistantMessage | ToolResultMessage):
                    self._inflight[id(m)] = ctl
            return await self.writer.append(messages)

        return record

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
            self._execute(control_turn(self.session_key, kind, text, str(sender)), None, release=False)
        )

    # ------------------------------------------------------------------ control
    # (docs/decisions.md#steer-latest-turn)

    def steer(self, text: str, sender_id: str) -> ControlOutcome:
        """Inject ``text`` into the latest active turn (it enters the context before that turn's
        next LLM call; tools of the running batch are not skipped). No active turn: run as a turn."""
        msg = control_message(text, sender_id)
        for ctl in reversed(self._active):
            if not ctl.closed:
                ctl.steer(msg)
                return "steered"
        self._start_control_turn("steer", msg)
        return "started"

    def follow_up(self, text: str, sender_id: str) -> ControlOutcome:
        """Queue ``text`` on the latest active turn (used when it would stop); no active turn: run
        as a turn."""
        msg = control_message(text, sender_id)
        for ctl in reversed(self._active):
            if not ctl.closed:
                ctl.follow_up(msg)
                return "queued"
        self._start_control_turn("follow_up", msg)
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
        """``/new``: archive the active epoch and continue in a fresh, empty one (running turns
        finish in the old epoch). Returns the new ``session_id``."""
        self.session_id = await self.repo.archive_session(self.session_key)
        self.writer = SessionWriter(self.repo, self.session_id, [])
        return self.session_id

    @property
    def idle(self) -> bool:
        """No queued entry and no running turn (safe to passivate)."""
        return not self._inbox and not self._active and not self._tasks

    @property
    def next_seq(self) -> int:
        """The next ``seq`` the inbox will start."""
        return self._next_seq

    def status(self) -> dict[str, Any]:
        """A JSON-able snapshot: ``session_key``, ``session_id``, ``active_turns``, ``queued``,
        ``next_seq``, ``turns_done``, ``messages`` (context length), ``idle_s``."""
        return {
            "session_key": self.session_key,
            "session_id": self.session_id,
            "active_turns": len(self._active),
            "queued": len(self._inbox),
            "next_seq": self._next_seq,
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
        if self.setup.features is not None:  # MCP connections
            with contextlib.suppress(Exception):
                await self.setup.features.close()

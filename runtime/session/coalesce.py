"""Hot-chat coalescing: the rules of a batch, without Ray
(docs/decisions.md#session-hot-chat-coalescing).

Where ``ai.agent.coalesce`` is on for a chat's scope, :class:`~runtime.session.core.SessionCore`
runs one turn at a time; the triggered messages that arrive meanwhile wait, and the next turn
answers up to ``max_batch`` of them at once (:class:`Answering`). What this module decides:

* who a turn answers and under which reply id — the batch's first message gives the reply id
  (``{session_id}/{first message_id}``), so a crash retry of any member hands over the same id
  and the delivery ledger drops a second send (docs/decisions.md#delivery-outbox);
* the records that make a batch recoverable: each member's ``im_inbound`` marker carries the
  batch's ``reply_id`` and its ``batch_lead``; the lead's marker lists the whole ``batch``
  (message id, sender id, sender name), so a retry of any member resumes the batch and writes the
  ``im_reply`` marker of every member (:func:`answering_of_resumed`);
* the note that tells the model it answers several people (:func:`batch_note`);
* the turn input the agent's policies see for a batch (:func:`policy_turn`: the rights every
  asker has, the media of every message);
* which entries may join a batch (:func:`batchable`: not a chat command, not a resumed retry);
* what a message over the bounded queue gets (:func:`answer_overflow`: recorded as history, the
  busy notice at most once per ``busy_notice_interval_s``: :class:`BusyNotices`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime import metrics
from runtime.config.ai import CoalesceConfig
from runtime.delivery.job import DeliveryJob
from runtime.llm.types import AgentMessage, CustomMessage
from runtime.reply.segments import Reply
from runtime.session.turn import (
    INBOUND_MARKER,
    SessionSetup,
    TurnInput,
    TurnOutcome,
    TurnResult,
    find_marker,
    inbound_marker,
    reply_marker,
)

__all__ = [
    "Answering",
    "BusyNotices",
    "answer_overflow",
    "answering_of_resumed",
    "batch_inbound_marker",
    "batch_note",
    "batchable",
    "coalescing_for",
    "overflow_history",
    "policy_turn",
]

log = logging.getLogger("sessionray.session")


def coalescing_for(config: CoalesceConfig | None, scope: str) -> CoalesceConfig | None:
    """``config`` when it is on for session-key scope ``scope``, else ``None`` (off)."""
    return config if config is not None and config.enabled_for(scope) else None


@dataclass
class Answering:
    """Who one turn answers.

    Attributes:
        message_ids: Every message whose ``im_reply`` marker the turn's hand-over writes, in
            chat order (one for a plain turn; the whole batch for a batch, also when a retry of
            one member resumes it).
        reply_id: The delivery idempotency key of the turn's reply (the first message's).
        askers: For a batch: ``{"message_id", "id", "name"}`` of each message, in order; empty
            for a turn that answers one message.
        reply_to: The platform message the reply quotes (``None`` for a batch: its mentions
            address the askers).
    """

    message_ids: list[str]
    reply_id: str
    askers: list[dict[str, str]] = field(default_factory=list)
    reply_to: str | None = None

    @classmethod
    def of(cls, turns: Sequence[TurnInput], session_id: str) -> Answering:
        """A new turn over ``turns`` (≥ 1, in seq order)."""
        lead = turns[0]
        if len(turns) == 1:
            return cls([lead.message_id], lead.reply_id(session_id), [], _quoted(lead))
        askers = [_asker(t) for t in turns]
        return cls([t.message_id for t in turns], lead.reply_id(session_id), askers, None)

    @property
    def is_batch(self) -> bool:
        """Whether this turn answers more than one message."""
        return bool(self.askers)

    def inbound_marker(self, turn: TurnInput, index: int, session_id: str) -> CustomMessage:
        """The ``im_inbound`` record of ``turn``, the ``index``-th message this turn answers."""
        return batch_inbound_marker(turn, self, index) if self.is_batch else inbound_marker(turn, session_id)

    def reply_markers(self, preview: str) -> list[AgentMessage]:
        """One ``im_reply`` record per answered message, all under :attr:`reply_id`."""
        return [reply_marker(m, self.reply_id, preview) for m in self.message_ids]

    def setup_for(self, setup: SessionSetup) -> SessionSetup:
        """``setup`` with the batch note appended to the system prompt (a batch), else as is."""
        if not self.is_batch:
            return setup
        return dataclasses.replace(setup, system_prompt=setup.system_prompt + batch_note(self.askers))

    def job(self, lead: TurnInput, session_key: str, reply: Reply) -> DeliveryJob:
        """The delivery job of this turn's ``reply`` (scene of ``lead``)."""
        return DeliveryJob(
            reply_id=self.reply_id,
            session_key=session_key,
            platform=lead.platform,
            bot_id=lead.bot_id,
            scene_type=lead.scene_type,
            scene_id=lead.scene_id,
            reply_to=self.reply_to,
            reply=reply,
        )

    def result(self, lead: TurnInput, outcome: TurnOutcome, **extra: Any) -> TurnResult:
        """The turn's :class:`TurnResult` (``lead``'s seq and id; :attr:`reply_id`)."""
        return TurnResult(
            seq=lead.seq, message_id=lead.message_id, outcome=outcome, reply_id=self.reply_id, **extra
        )


def _quoted(turn: TurnInput) -> str | None:
    return turn.message_id if turn.kind == "inbound" else None


def _asker(turn: TurnInput) -> dict[str, str]:
    return {
        "message_id": turn.message_id,
        "id": str(turn.sender.get("id") or ""),
        "name": str(turn.sender.get("name") or ""),
    }


def batch_inbound_marker(turn: TurnInput, answering: Answering, seq_in_batch: int) -> CustomMessage:
    """The ``im_inbound`` record of one batch member: the batch's ``reply_id``, the lead's id
    (``batch_lead``) and, on the lead (``seq_in_batch == 0``), the whole ``batch``."""
    data: dict[str, Any] = {
        "message_id": turn.message_id,
        "seq": turn.seq,
        "reply_id": answering.reply_id,
        "batch_lead": answering.message_ids[0],
    }
    if seq_in_batch == 0:
        data["batch"] = answering.askers
    return CustomMessage(custom_type=INBOUND_MARKER, data=data)


def answering_of_resumed(messages: Sequence[AgentMessage], turn: TurnInput, session_id: str) -> Answering:
    """Who a crash retry of ``turn`` answers, read from its recorded ``im_inbound`` marker: the
    whole batch under the batch's reply id when the message was a batch member, else ``turn``
    alone (``{session_id}/{message_id}``, as before batches existed)."""
    data = _marker_data(messages, turn.message_id)
    lead = data.get("batch_lead")
    if not lead:
        return Answering.of([turn], session_id)
    lead_data = _marker_data(messages, str(lead))
    askers = [dict(a) for a in lead_data.get("batch", [])] or [_asker(turn)]
    ids = [str(a["message_id"]) for a in askers]
    return Answering(ids, str(data.get("reply_id") or turn.reply_id(session_id)), askers, None)


def _marker_data(messages: Sequence[AgentMessage], message_id: str) -> dict[str, Any]:
    i = find_marker(messages, INBOUND_MARKER, message_id)
    m = messages[i] if i is not None else None
    return m.data if isinstance(m, CustomMessage) else {}


def batch_note(askers: Sequence[dict[str, str]]) -> str:
    """The system-prompt paragraph of a batch turn: the last ``len(askers)`` user messages are
    one batch from these people; answer all of them in one reply."""
    who = ", ".join(f"{a['name'] or a['id']} (id {a['id']})" for a in askers)
    return (
        f"\n\nSeveral people wrote while you were busy: the last {len(askers)} user messages are "
        f"one batch, from {who}. Answer all of them in this one reply: address each asker with a "
        "mention segment of their id, one part per person or one shared answer, in their order."
    )


def batchable(turn: TurnInput, features: Any, context: Callable[[], Sequence[AgentMessage]]) -> bool:
    """Whether ``turn`` may join a batch: an inbound message that is neither a chat command
    (answered before the agent, docs/decisions.md#chat-commands; ``features`` parses them) nor the
    retry of a turn recorded in ``context()`` (it resumes alone)."""
    if turn.kind != "inbound" or (features is not None and features.command(turn) is not None):
        return False
    return turn.attempt == 0 or find_marker(context(), INBOUND_MARKER, turn.message_id) is None


async def answer_overflow(
    turn: TurnInput,
    session_id: str,
    busy: BusyNotices,
    hand_over: Callable[[DeliveryJob, list[AgentMessage]], Awaitable[None]],
    append_history: Callable[[list[AgentMessage]], Awaitable[None]],
) -> TurnResult:
    """Answer a message over the chat's queue: the busy notice (``hand_over``; it goes out at once,
    ahead of the queued turns' replies: it is about this message only) unless the chat had one
    within the interval; the message is recorded as history the next turn sees
    (``append_history``, :func:`overflow_history`).

    Returns:
        Outcome ``busy`` (``reply_id`` of the notice, ``""`` when none was sent); ``error`` when a
        write failed (the row stays open and the inbox replays the message).
    """
    notice = busy.for_message(turn, session_id)
    reply_id, preview = (notice[0].reply_id, notice[1].preview_text()) if notice else ("", "")
    try:
        if notice is not None:
            await hand_over(
                notice[0].job(turn, turn.session_key, notice[1]), notice[0].reply_markers(preview)
            )
        await append_history(overflow_history(turn, session_id, notice is not None))
    except Exception as exc:
        log.exception("recording the overflowed message %s failed", turn.message_id)
        return TurnResult(seq=turn.seq, message_id=turn.message_id, outcome="error", error=repr(exc))
    return TurnResult(
        seq=turn.seq, message_id=turn.message_id, outcome="busy", reply_id=reply_id, preview=preview
    )


def policy_turn(turns: Sequence[TurnInput]) -> TurnInput:
    """The turn input a batch's agent run is configured with (tool permissions, vision routing):
    the lead's fields, the roles *every* sender has (a master's rights never answer another
    user's question) and the segments of every message (an image anywhere routes to vision)."""
    lead = turns[0]
    if len(turns) == 1:
        return lead
    roles = [set(t.sender.get("roles") or []) for t in turns]
    common = sorted(set.intersection(*roles))
    segments = [s for t in turns for s in t.segments]
    return lead.model_copy(update={"sender": {**lead.sender, "roles": common}, "segments": segments})


def overflow_history(turn: TurnInput, session_id: str, notified: bool) -> list[AgentMessage]:
    """The history of a message over the queue: its ``im_inbound`` record and user message, and
    — when no notice was sent (whose hand-over wrote it) — an ``im_reply`` record with no reply id,
    so a retry finds it answered."""
    history: list[AgentMessage] = [inbound_marker(turn, session_id), turn.user_message()]
    return history if notified else [*history, reply_marker(turn.message_id, "", "")]


class BusyNotices:
    """A coalescing chat's busy notice, rate-limited to one per ``busy_notice_interval_s``
    (monotonic seconds; docs/decisions.md#session-hot-chat-coalescing).

    Args:
        config: The chat's coalescing config (``busy_notice``, ``busy_notice_interval_s``).
        clock: ``() -> float`` seconds (default :func:`time.monotonic`).
    """

    def __init__(self, config: CoalesceConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._last: float | None = None

    def take(self) -> bool:
        """True (and the interval starts now) when a notice may be sent now."""
        now = self._clock()
        if self._last is not None and now - self._last < self.config.busy_notice_interval_s:
            return False
        self._last = now
        return True

    def for_message(self, turn: TurnInput, session_id: str) -> tuple[Answering, Reply] | None:
        """The notice answering ``turn`` (over the queue) — its reply id
        ``{session_id}/busy/{message_id}`` is stable across a retry — or ``None`` when one was sent
        within the interval. Counted in ``sessionray_busy_notices_total``."""
        sent = self.take()
        metrics.BUSY_NOTICES.inc(platform=turn.platform, outcome="sent" if sent else "suppressed")
        if not sent:
            return None
        answering = Answering([turn.message_id], f"{session_id}/busy/{turn.message_id}", [], turn.message_id)
        return answering, Reply.of_text(self.config.busy_notice)

"""``ContextRepository``: the SQL source of truth for every session's context
(docs/decisions.md#memory-sql-truth).

A live session calls :meth:`~ContextRepository.load_context` before a turn and
:meth:`~ContextRepository.append_messages` as its messages end. Because everything lives in SQL,
a session can be passivated, or its host killed, at any time and a new activation loads it back.

Rules:

* **Epoch-only history** (docs/decisions.md#memory-epoch-only): ``load_context(session_id)`` reads
  only that epoch's rows — its latest summary plus the messages after the summary's anchor — and
  never cold-starts from ``im_transcripts``.
* **Appends are atomic and serialized per session**: one ``append_messages`` call is one
  transaction; calls for the same ``session_id`` in this process queue on an ``asyncio.Lock``,
  and the transaction first bumps the session row (``UPDATE agent_sessions … WHERE session_id``,
  which locks the row on PostgreSQL; SQLite writers queue on the node-wide writer lock and
  ``BEGIN IMMEDIATE``), so writers in other processes queue too. Each call's messages
  stay contiguous and the load order is the append order (ordered by row id).
* **Epoch changes are serialized per key** (``get_or_create_active``/``archive_session``): in
  this process on an ``asyncio.Lock``; across processes by ``BEGIN IMMEDIATE`` on SQLite and a
  transaction-scoped advisory lock on PostgreSQL, with a retry when another writer still wins
  (unique violation, deadlock victim, serialization failure).
* **Nothing is deleted**: archiving flips ``status``, starts the next epoch; compaction adds a summary.
* **Forged sender prefixes are neutralised before storage**
  (docs/decisions.md#security-sender-prefix): every sender block a user typed into a message — at
  its start, after leading mentions, or anywhere else, in any bracket form — is removed or quoted
  by :func:`runtime.reply.sender.strip_forged_prefix`.
* SQL runs on the :class:`~runtime.memory.db.Database` thread pool, except a turn's appended
  rows on SQLite while the writer lock is free (inline: docs/decisions.md#memory-sql-off-loop).
  Every write goes through :meth:`~runtime.memory.db.Database.run_write`, so a transient error
  (SQLite busy, PostgreSQL deadlock/serialization failure/lost connection before commit) is
  retried instead of losing the turn.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from pydantic_core import PydanticSerializationError
from sqlalchemy import Connection, Table, bindparam, func, insert, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from runtime.keys import parse_session_id, parse_session_key
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Context,
    CustomMessage,
    ToolResultMessage,
    UserMessage,
    now_ms,
)
from runtime.memory.db import Database
from runtime.memory.epochs import (
    CorruptMessageError,
    StoredMessage,
    get_or_create,
    lock_key,
    read_active,
    read_context,
    select_messages,
    start_epoch,
    summary_message,
)
from runtime.memory.epochs import active_id as active_epoch
from runtime.memory.tables import AgentMessageRow, AgentSessionRow, AgentSummaryRow
from runtime.reply.sender import SUMMARY_CUSTOM_TYPE, strip_user_message

__all__ = [
    "SUMMARY_CUSTOM_TYPE",
    "ContextRepository",
    "CorruptMessageError",
    "SessionInfo",
    "StoredMessage",
    "UnknownSessionError",
    "message_json",
    "summary_message",
]


_KEY_RETRIES = 8
_T = TypeVar("_T")

_SESSIONS: Table = AgentSessionRow.__table__  # type: ignore[attr-defined]
_MESSAGES: Table = AgentMessageRow.__table__  # type: ignore[attr-defined]
_TOUCH = (
    update(_SESSIONS).where(_SESSIONS.c.session_id == bindparam("sid")).values(updated_at=bindparam("now"))
)
"""Bump ``updated_at`` (and lock the row on PostgreSQL); rowcount 0 = unknown session."""
_TOUCH_MODEL = _TOUCH.values(model=bindparam("new_model"))
""":data:`_TOUCH` that also records the model ref."""
_INSERT_MESSAGE = insert(_MESSAGES).returning(_MESSAGES.c.id)
_INSERT_MESSAGES = insert(_MESSAGES).returning(_MESSAGES.c.id, sort_by_parameter_order=True)
"""Several rows in one statement; the ids come back in parameter (list) order."""


class UnknownSessionError(LookupError):
    """The ``session_id`` has no ``agent_sessions`` row (call ``get_or_create_active`` first)."""


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A copy of one ``agent_sessions`` row (times in Unix ms)."""

    session_id: str
    session_key: str
    platform: str
    bot_id: str
    scene_id: str
    scene_type: str
    model: str
    status: str
    created_at: int
    updated_at: int


def _context(summary: CustomMessage | None, stored: list[StoredMessage]) -> Context:
    """The context of a summary (first, if any) and the stored rows after it."""
    return Context(messages=[*([summary] if summary is not None else []), *(sm.message for sm in stored)])


def _info(row: AgentSessionRow) -> SessionInfo:
    return SessionInfo(**{f.name: getattr(row, f.name) for f in fields(SessionInfo)})


class ContextRepository:
    """Load and append the messages of session epochs.

    Args:
        db: The :class:`Database` (its tables must exist: ``db.create_tables()``).

    Thread/loop model: the coroutine methods may be called from any number of coroutines on one
    event loop; the per-session locks belong to the loop that first used them.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[name] = lock
        return lock

    # ------------------------------------------------------------------ sessions

    async def get_or_create_active(self, session_key: str, *, model: str = "") -> str:
        """Return the active ``session_id`` of ``session_key``, creating epoch 1 (or the next
        epoch after the highest archived one) when none is active.

        Args:
            session_key: ``platform:bot_id:scope:scene_id``.
            model: Model ref recorded on a newly created row (``provider/id``).

        Raises:
            SessionKeyError: malformed ``session_key``.
            RuntimeError: other processes changed the key's epochs 8 times in a row.
        """
        parse_session_key(session_key)
        async with self._lock(f"key:{session_key}"):
            # A stored active epoch is read without a write transaction (docs/decisions.md#session-hosts):
            # epochs of a key change only in the process holding it live, under this same lock.
            active = await self.db.run(lambda: self._active_id_sync(session_key))
            create = lambda: self._get_or_create_sync(session_key, model)  # noqa: E731
            return active or (await self._retrying(session_key, create))[0]

    async def open_active(self, session_key: str, *, model: str = "") -> tuple[str, Context]:
        """:meth:`get_or_create_active` and :meth:`load_context` of it together, as an activation
        needs them: one read transaction for a stored active epoch and its context, or one write
        transaction creating the epoch of a new chat (its context is empty).

        Raises:
            SessionKeyError: malformed ``session_key``.
            CorruptMessageError: a stored row does not parse.
            RuntimeError: as for :meth:`get_or_create_active`.
        """
        parse_session_key(session_key)
        async with self._lock(f"key:{session_key}"):

            def read() -> tuple[str, CustomMessage | None, list[StoredMessage]] | None:
                with self.db.connection() as conn:
                    return read_active(conn, session_key)

            found = await self.db.run(read)
            if found is None:
                create = lambda: self._get_or_create_sync(session_key, model)  # noqa: E731
                sid, created = await self._retrying(session_key, create)
                # created here: empty; made by another process since the read: load it
                return sid, Context(messages=[]) if created else await self.load_context(sid)
        sid, summary, stored = found
        return sid, _context(summary, stored)

    def _active_id_sync(self, session_key: str) -> str | None:
        with self.db.connection() as conn:
            return active_epoch(conn, session_key)

    async def _retrying(self, session_key: str, fn: Callable[[], _T]) -> _T:
        # Another process may create the active epoch between our read and insert: the key or the
        # one-active index refuses ours and a retry sees theirs (run_write retries transient errors).
        last: IntegrityError | None = None
        for _attempt in range(_KEY_RETRIES):
            try:
                return await self.db.run_write(fn)
            except IntegrityError as exc:
                last = exc
        raise RuntimeError(
            f"session {session_key!r}: epoch changed concurrently {_KEY_RETRIES} times"
        ) from last

    def _get_or_create_sync(self, session_key: str, model: str) -> tuple[str, bool]:
        with self.db.connection(write=True) as conn:
            return get_or_create(conn, session_key, model)

    async def archive_session(self, session_key: str) -> str:
        """Archive the active epoch of ``session_key`` and start the next; return the new
        ``session_id`` (``/new`` and ``/clear``). Old rows stay. Without an active epoch this
        just starts the next one.

        Raises:
            SessionKeyError: malformed ``session_key``.
            RuntimeError: other processes changed the key's epochs 8 times in a row.
        """
        parse_session_key(session_key)

        def work() -> str:
            with self.db.session(write=True) as s:
                lock_key(s.connection(), session_key)
                active = s.exec(
                    select(AgentSessionRow)
                    .where(AgentSessionRow.session_key == session_key, AgentSessionRow.status == "active")
                    .with_for_update()
                ).first()
                model = ""
                if active is not None:
                    active.status = "archived"
                    active.updated_at = now_ms()
                    model = active.model
                    s.add(active)
                    s.flush()
                return start_epoch(s.connection(), session_key, model)

        async with self._lock(f"key:{session_key}"):
            return await self._retrying(session_key, work)

    async def get_session(self, session_id: str) -> SessionInfo | None:
        """Return the ``agent_sessions`` row of ``session_id`` as :class:`SessionInfo`, or ``None``.

        Raises:
            SessionKeyError: malformed ``session_id``.
        """
        parse_session_id(session_id)

        def work() -> SessionInfo | None:
            with self.db.session() as s:
                row = s.get(AgentSessionRow, session_id)
                return _info(row) if row is not None else None

        return await self.db.run(work)

    async def list_sessions(self, session_key: str) -> list[SessionInfo]:
        """All epochs of ``session_key``, oldest first.

        Raises:
            SessionKeyError: malformed ``session_key``.
        """
        parse_session_key(session_key)

        def work() -> list[SessionInfo]:
            with self.db.session() as s:
                rows = s.exec(select(AgentSessionRow).where(AgentSessionRow.session_key == session_key)).all()
                return sorted((_info(r) for r in rows), key=lambda i: parse_session_id(i.session_id).epoch)

        return await self.db.run(work)

    # ------------------------------------------------------------------ messages

    async def append_messages(
        self,
        session_id: str,
        messages: Sequence[AgentMessage],
        *,
        also: Callable[[Connection], None] | None = None,
    ) -> list[int]:
        """Append ``messages`` to the epoch ``session_id`` in one transaction; return their row ids.
        ``also(conn)`` runs last in it (a reply's ledger row: docs/decisions.md#delivery-outbox);
        without messages, alone in a transaction of its own (a turn's staged usage rows).

        Concurrent calls for one session are serialized (module docstring); none is lost. User
        messages are stored with forged ``[sender:…]`` prefixes stripped. The session's
        ``updated_at`` is bumped and ``model`` set from the last assistant message (if any).
        Appending to an archived epoch is allowed (a turn that was running when ``/new`` came
        finishes in its own epoch).

        Raises:
            SessionKeyError: malformed ``session_id``.
            UnknownSessionError: no such session row.
            TypeError: an item is not an agent message.
            ValueError: an item cannot be serialized to JSON (a lone UTF-16 surrogate in its
                text); the message names its index. Nothing of the call is stored in any of
                these cases. (Unserializable values in free-form host data — a tool result's
                ``details``, ``sender``, a custom message's ``data`` — are stored as their
                ``repr`` instead of failing.)
        """
        parse_session_id(session_id)
        rows, model = _rows(messages)
        if not rows:
            if also is not None:  # a turn's staged writes alone (its usage rows)
                await self.db.run_write(lambda: self._also_alone(also), inline=True)
            return []

        params = [{"session_id": session_id, "role": r, "payload": p, "timestamp": t} for r, p, t in rows]
        touch = _TOUCH_MODEL if model else _TOUCH
        touch_params: dict[str, Any] = {"sid": session_id}
        if model:
            touch_params["new_model"] = model

        def work() -> list[int]:
            # SQLAlchemy Core, statements built once: the transaction (and the writer lock) lasts
            # two or three statements (≤ 0.5 ms in process: docs/decisions.md#memory-write-path).
            with self.db.connection(write=True) as conn:
                if conn.execute(touch, {**touch_params, "now": now_ms()}).rowcount == 0:
                    raise UnknownSessionError(
                        f"no agent session {session_id!r}: call get_or_create_active(session_key) first"
                    )
                if len(params) == 1:
                    ids = [int(conn.execute(_INSERT_MESSAGE, params[0]).scalar_one())]
                else:
                    ids = [int(i) for i in conn.execute(_INSERT_MESSAGES, params).scalars()]
                if also is not None:
                    also(conn)
                return ids

        async with self._lock(f"sid:{session_id}"):  # a turn's rows: inline (memory-sql-off-loop)
            return await self.db.run_write(work, inline=True)

    def _also_alone(self, also: Callable[[Connection], None]) -> None:
        with self.db.connection(write=True) as conn:
            also(conn)

    def check_storable(self, messages: Sequence[AgentMessage]) -> None:
        """Raise what :meth:`append_messages` would raise for ``messages`` themselves (the same
        errors, the same texts), without writing: a record staged for a later write
        (docs/decisions.md#session-turn-records) is refused when it is made, not in the write of
        another turn.

        Raises:
            TypeError: an item is not an agent message.
            ValueError: an item cannot be serialized to JSON (the message names its index).
        """
        _rows(messages)

    async def load_context(self, session_id: str) -> Context:
        """Load the epoch's context: its latest summary (as a :class:`CustomMessage` made by
        :func:`summary_message`) followed by every message after the summary's anchor, in append
        order. ``system_prompt`` and ``tools`` are left empty for the caller to fill. An unknown
        session (or one without rows) loads as an empty context.

        Each summary folds in the one before it (compaction summarizes the previous summary too),
        so only the latest is needed.

        Raises:
            SessionKeyError: malformed ``session_id``.
            CorruptMessageError: a stored row does not parse (its id is named; nothing is changed).
        """
        parse_session_id(session_id)
        return _context(*await self.db.run(lambda: self._load_sync(session_id)))

    async def load_stored(self, session_id: str, *, after_id: int | None = None) -> list[StoredMessage]:
        """Every message row of the epoch with ``id > after_id`` (all when ``None``), in append order.

        Raises:
            SessionKeyError: malformed ``session_id``.
            CorruptMessageError: a stored row does not parse.
        """
        parse_session_id(session_id)
        return await self.db.run(lambda: self._messages_sync(session_id, after_id))

    def _messages_sync(self, session_id: str, after_id: int | None) -> list[StoredMessage]:
        with self.db.connection() as conn:
            return select_messages(conn, session_id, after_id)

    def _load_sync(self, session_id: str) -> tuple[CustomMessage | None, list[StoredMessage]]:
        with self.db.connection() as conn:  # one snapshot for the summary and the rows after it
            return read_context(conn, session_id)

    # ------------------------------------------------------------------ summaries

    async def add_summary(self, session_id: str, summary: str, anchor_message_id: int | None) -> int:
        """Store a compaction summary covering the rows up to ``anchor_message_id``; return its id.

        Raises:
            SessionKeyError: malformed ``session_id``.
            UnknownSessionError: no such session row.
        """
        parse_session_id(session_id)

        def work() -> int:
            with self.db.session(write=True) as s:
                if s.get(AgentSessionRow, session_id) is None:
                    raise UnknownSessionError(f"no agent session {session_id!r}")
                row = AgentSummaryRow(
                    session_id=session_id,
                    summary=summary,
                    anchor_message_id=anchor_message_id,
                    created_at=now_ms(),
                )
                s.add(row)
                s.flush()
                return int(row.id or 0)

        async with self._lock(f"sid:{session_id}"):
            return await self.db.run_write(work)

    async def count_messages(self, session_id: str) -> int:
        """Number of message rows of the epoch (all of them, summarized or not)."""
        parse_session_id(session_id)

        def work() -> int:
            with self.db.session() as s:
                n = s.exec(
                    select(func.count())
                    .select_from(AgentMessageRow)
                    .where(AgentMessageRow.session_id == session_id)
                ).one()
                return int(n)

        return await self.db.run(work)


def message_json(message: AgentMessage) -> str:
    """The message as stored in ``agent_messages.payload`` (JSON).

    A value JSON cannot hold inside free-form host data (``details`` of a tool result,
    ``sender``, ``data`` of a custom message: a set, a custom object…) is stored as its ``repr``
    rather than losing the whole turn.

    Raises:
        PydanticSerializationError: the text cannot be encoded (a lone UTF-16 surrogate).
    """
    try:
        return message.model_dump_json()
    except PydanticSerializationError:
        return message.model_dump_json(fallback=repr)


def _rows(messages: Sequence[AgentMessage]) -> tuple[list[tuple[str, str, int]], str]:
    """``([(role, payload JSON, timestamp)], model of the last assistant message)`` as
    :meth:`ContextRepository.append_messages` stores ``messages`` (forged ``[sender:…]`` prefixes
    of user messages stripped).

    Raises:
        TypeError: an item is not an agent message.
        ValueError: an item cannot be serialized to JSON (a lone UTF-16 surrogate in its text).
    """
    rows: list[tuple[str, str, int]] = []
    model = ""
    for i, m in enumerate(messages):
        if not isinstance(m, UserMessage | AssistantMessage | ToolResultMessage | CustomMessage):
            raise TypeError(f"append_messages takes agent messages, got {type(m).__name__} at #{i}")
        if isinstance(m, UserMessage):
            m = strip_user_message(m)
        if isinstance(m, AssistantMessage) and m.model:
            model = f"{m.provider}/{m.model}" if m.provider else m.model
        try:
            payload = message_json(m)
        except PydanticSerializationError as exc:  # e.g. a lone UTF-16 surrogate in the text
            raise ValueError(
                f"append_messages: message #{i} ({m.role}) cannot be stored as JSON, nothing was "
                f"appended: {exc}"
            ) from None
        rows.append((m.role, payload, m.timestamp))
    return rows, model.replace("\x00", "\ufffd")  # PostgreSQL text cannot hold NUL

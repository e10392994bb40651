"""IM transcripts: what was said in each scene, for audit and ``chat_history``.

Write rules (docs/decisions.md#memory-transcripts):

* an **inbound** row is written when the router accepts an event; an **outbound** row after the
  platform confirmed a send (so a failed send leaves no row);
* ``body`` is the plain text only — ``text`` segments' ``data.text`` and ``markdown`` segments'
  ``data.content``, concatenated — or the caller's ``text`` when given; media never goes into it;
* ``media_json`` is the JSON of the whole segment list (``[{"type": …, "data": {…}}, …]``, the
  same shape as :mod:`runtime.reply.segments`) when the message has at least one segment that is not
  plain text (see :data:`TEXT_SEGMENT_TYPES`), else NULL;
* an **inbound** message with neither text (after stripping whitespace) nor a media segment is
  skipped (``"skipped"``);
* ``UNIQUE (platform, bot_id, message_id, direction)``: a redelivered webhook (or a retried
  confirmation) is stored once (``"duplicate"``), via ``INSERT … ON CONFLICT DO NOTHING``;
* NUL characters in the text columns are stored as U+FFFD on both backends (:func:`no_nul`;
  PostgreSQL ``text`` cannot hold NUL); ``media_json`` escapes them as JSON does.
* a write is one SQLAlchemy Core statement (built once per store) run through
  :meth:`~runtime.memory.db.Database.run_write`: the row is built before the writer lock is
  taken, and a transient error (SQLite busy, PostgreSQL deadlock/lost connection before commit)
  is retried rather than losing the row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel
from sqlalchemy import Connection, Table
from sqlmodel import col, select

from runtime.keys import SCOPES
from runtime.llm.types import now_ms
from runtime.memory.db import Database
from runtime.memory.tables import ImTranscriptRow

__all__ = [
    "TEXT_SEGMENT_TYPES",
    "Direction",
    "PreparedInsert",
    "TranscriptEntry",
    "TranscriptOutcome",
    "TranscriptStore",
    "no_nul",
    "plain_text",
    "segments_to_dicts",
]

Direction: TypeAlias = Literal["inbound", "outbound"]
TranscriptOutcome: TypeAlias = Literal["stored", "duplicate", "skipped"]

TEXT_SEGMENT_TYPES: frozenset[str] = frozenset({"text", "markdown", "mention", "at", "reply"})
"""Segment types that are not media: text, markdown, mentions and quote references. Any other
type (image, audio, video, file, face, share, forward, dice, rps, …) counts as media."""


def segments_to_dicts(segments: Sequence[Mapping[str, Any] | BaseModel]) -> list[dict[str, Any]]:
    """Segments (pydantic segment models or plain dicts) as JSON-ready dicts.

    Raises:
        TypeError: an item is neither a mapping nor a pydantic model (its index and type named).
    """
    out: list[dict[str, Any]] = []
    for i, seg in enumerate(segments):
        if isinstance(seg, BaseModel):
            out.append(seg.model_dump(mode="json"))
        elif isinstance(seg, Mapping):
            out.append(dict(seg))
        else:
            raise TypeError(f"segment #{i} must be a mapping or a segment model, got {type(seg).__name__}")
    return out


def plain_text(segments: Sequence[Mapping[str, Any]]) -> str:
    """Concatenate ``text`` segments' ``data.text`` and ``markdown`` segments' ``data.content``.

    >>> plain_text([{"type": "text", "data": {"text": "hi "}}, {"type": "image", "data": {}},
    ...             {"type": "markdown", "data": {"content": "**there**"}}])
    'hi **there**'
    """
    parts: list[str] = []
    for seg in segments:
        data = seg.get("data") or {}
        if seg.get("type") == "text":
            parts.append(str(data.get("text", "")))
        elif seg.get("type") == "markdown":
            parts.append(str(data.get("content", "")))
    return "".join(parts)


def no_nul(text: str) -> str:
    r"""``text`` with every NUL character (U+0000) replaced by U+FFFD.

    PostgreSQL ``text`` cannot hold NUL, so a chat message carrying one would otherwise be
    refused there; both backends store the same replacement so they behave alike.

    >>> no_nul("a\x00b") == "a\ufffdb"
    True
    """
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


@dataclass(frozen=True, slots=True)
class TranscriptEntry:
    """One decoded ``im_transcripts`` row (``time`` in Unix ms; ``media`` decoded from ``media_json``)."""

    message_id: str
    platform: str
    bot_id: str
    scene_id: str
    scene_type: str
    sender_id: str
    sender_name: str
    sender_role: str
    direction: str
    body: str
    media: list[dict[str, Any]] | None
    time: int


@dataclass(frozen=True, slots=True)
class PreparedInsert:
    """One row and its ``INSERT … ON CONFLICT DO NOTHING RETURNING`` statement (built once per
    store), to be run inside a write transaction the caller holds."""

    statement: Any
    values: dict[str, Any]

    def execute(self, conn: Connection) -> bool:
        """Insert the row on ``conn`` (blocking); True when stored, False when it was already there."""
        result = conn.execute(self.statement, self.values)
        # pysqlite reports no result columns when RETURNING yields no row (a conflict).
        return bool(result.returns_rows and result.first() is not None)


class TranscriptStore:
    """Writes and searches ``im_transcripts``.

    Args:
        db: The :class:`Database` (tables created).
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        table: Table = ImTranscriptRow.__table__  # type: ignore[attr-defined]
        self._insert = (
            db.insert(table)
            .on_conflict_do_nothing(index_elements=["platform", "bot_id", "message_id", "direction"])
            .returning(table.c.id)
        )

    async def record(self, *, direction: Direction, **fields: Any) -> TranscriptOutcome:
        """Store one message (rules in the module docstring).

        Args:
            direction: ``inbound`` (event accepted) | ``outbound`` (send confirmed).
            fields: The message, as for :meth:`prepare`.

        Returns:
            ``"stored"``, ``"duplicate"`` (same platform, bot, message id and direction already
            stored) or ``"skipped"`` (inbound without text or media).

        Raises:
            ValueError / TypeError: as for :meth:`prepare`.
        """
        row = self.prepare(direction=direction, **fields)
        if row is None:
            return "skipped"

        def work() -> TranscriptOutcome:
            with self.db.connection(write=True) as conn:
                return "stored" if row.execute(conn) else "duplicate"

        return await self.db.run_write(work, inline=True)  # docs/decisions.md#memory-sql-off-loop

    def prepare(
        self,
        *,
        direction: Direction,
        message_id: str,
        platform: str,
        bot_id: str,
        scene_id: str,
        scene_type: str,
        sender_id: str,
        sender_name: str = "",
        sender_role: str = "",
        segments: Sequence[Mapping[str, Any] | BaseModel] = (),
        text: str | None = None,
        time_ms: int | None = None,
    ) -> PreparedInsert | None:
        """The row of one message, ready to be written in a caller's own write transaction
        (:meth:`record` writes it in one of its own; ``runtime.memory.inbox`` together with the
        message's inbox row). ``None``: an inbound message without text or media (not stored).

        Args:
            direction: ``inbound`` | ``outbound``.
            message_id: The platform's message id (for outbound: the id the platform returned).
            platform / bot_id / scene_id: Where; ``scene_id`` is the peer's id in private chats.
            scene_type: ``private`` | ``group`` | ``channel``.
            sender_id / sender_name / sender_role: Who (for outbound: the bot).
            segments: The message's segments (pydantic segment models or dicts).
            text: The plain text when the caller already has it; else derived from ``segments``.
            time_ms: Unix ms (default: now).

        Raises:
            ValueError: bad ``direction`` or ``scene_type``, or an empty ``message_id``.
            TypeError: a segment that is not a mapping/segment model, or ``text`` not a string.
        """
        if text is not None and not isinstance(text, str):
            raise TypeError(f"transcript text must be a string or None, got {type(text).__name__}")
        if direction not in ("inbound", "outbound"):
            raise ValueError(f"transcript direction must be inbound|outbound, got {direction!r}")
        if scene_type not in SCOPES:
            raise ValueError(f"transcript scene_type must be one of {'|'.join(SCOPES)}, got {scene_type!r}")
        if message_id is None or str(message_id) == "":  # a numeric id 0 is a valid id
            raise ValueError("transcript message_id must not be empty")
        segs = segments_to_dicts(segments)
        body = plain_text(segs) if text is None else text
        has_media = any(s.get("type") not in TEXT_SEGMENT_TYPES for s in segs)
        if direction == "inbound" and not body.strip() and not has_media:
            return None
        values = {
            "message_id": no_nul(str(message_id)),
            "platform": no_nul(platform),
            "bot_id": no_nul(bot_id),
            "scene_id": no_nul(scene_id),
            "scene_type": scene_type,
            "sender_id": no_nul(sender_id),
            "sender_name": no_nul(sender_name),
            "sender_role": no_nul(sender_role),
            "direction": direction,
            "body": no_nul(body),
            "media_json": json.dumps(segs, ensure_ascii=False) if has_media else None,
            "time": now_ms() if time_ms is None else int(time_ms),
        }
        return PreparedInsert(self._insert, values)

    async def record_inbound(self, **fields: Any) -> TranscriptOutcome:
        """:meth:`record` with ``direction="inbound"`` (call when the event is accepted)."""
        return await self.record(direction="inbound", **fields)

    async def record_outbound(self, **fields: Any) -> TranscriptOutcome:
        """:meth:`record` with ``direction="outbound"`` (call after the platform confirmed the send)."""
        return await self.record(direction="outbound", **fields)

    async def scene(
        self, platform: str, bot_id: str, scene_id: str, *, limit: int = 100, scene_type: str | None = None
    ) -> list[TranscriptEntry]:
        """The last ``limit`` rows of a scene, oldest first (audit/replay). ``scene_type``
        (``private``/``group``/``channel``) keeps only that kind of scene: a private chat and a
        group may share an id (the console's user ``lobby`` and group ``lobby``)."""

        def work() -> list[TranscriptEntry]:
            where = [
                ImTranscriptRow.platform == platform,
                ImTranscriptRow.bot_id == bot_id,
                ImTranscriptRow.scene_id == scene_id,
            ]
            if scene_type is not None:
                where.append(ImTranscriptRow.scene_type == scene_type)
            with self.db.session() as s:
                rows = s.exec(
                    select(ImTranscriptRow)
                    .where(*where)
                    .order_by(col(ImTranscriptRow.time).desc(), col(ImTranscriptRow.id).desc())
                    .limit(limit)
                ).all()
            return [entry_from_row(r) for r in reversed(rows)]

        return await self.db.run(work)


def entry_from_row(row: ImTranscriptRow) -> TranscriptEntry:
    """Decode one row (``media_json`` parsed)."""
    return TranscriptEntry(
        message_id=row.message_id,
        platform=row.platform,
        bot_id=row.bot_id,
        scene_id=row.scene_id,
        scene_type=row.scene_type,
        sender_id=row.sender_id,
        sender_name=row.sender_name,
        sender_role=row.sender_role,
        direction=row.direction,
        body=row.body,
        media=json.loads(row.media_json) if row.media_json else None,
        time=row.time,
    )

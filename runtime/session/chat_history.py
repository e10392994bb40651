"""The ``chat_history`` tool: keyword search over the current scene's transcripts
(docs/decisions.md#memory-transcripts).

The model calls ``chat_history(query, limit?, since_ms?, until_ms?)``; the tool searches
``im_transcripts.body`` of the scene it was made for (platform, bot, scene — both directions),
case-insensitively, treating ``%``, ``_`` and ``\\`` in the query literally (LIKE escaping), and
returns the newest ``limit`` matches in time order, one per line::

    [2026-11-30 11:40:05 UTC] Alice (20002): the matching text

Times are shown in UTC. ``media_json`` is not exposed to the model.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field
from sqlmodel import col, select

from runtime.agent.tools import AgentTool, AgentToolResult, ToolUpdateFn
from runtime.llm.abort import AbortSignal
from runtime.memory.db import Database
from runtime.memory.tables import ImTranscriptRow
from runtime.memory.transcripts import TranscriptEntry, entry_from_row, no_nul
from runtime.reply.sender import strip_forged_prefix

__all__ = [
    "CHAT_HISTORY_TOOL_NAME",
    "ChatHistoryParams",
    "escape_like",
    "format_history_line",
    "make_chat_history_tool",
    "search_transcripts",
]

CHAT_HISTORY_TOOL_NAME = "chat_history"
MAX_BODY_CHARS = 500
"""Longest body shown per line; longer bodies end in ``…``."""


class ChatHistoryParams(BaseModel):
    """Arguments of ``chat_history``."""

    query: str = Field(min_length=1, max_length=200, description="Keyword or phrase to find (literal text).")
    limit: int = Field(default=20, ge=1, le=100, description="Most matches to return (newest ones).")
    since_ms: int | None = Field(default=None, description="Only messages at or after this Unix time in ms.")
    until_ms: int | None = Field(default=None, description="Only messages at or before this Unix time in ms.")


def escape_like(text: str, escape: str = "\\") -> str:
    r"""Escape LIKE wildcards so ``text`` matches literally (used with ``ESCAPE '\'``).

    >>> escape_like("100%_off\\")
    '100\\%\\_off\\\\'
    """
    return text.replace(escape, escape * 2).replace("%", escape + "%").replace("_", escape + "_")


def format_history_line(entry: TranscriptEntry) -> str:
    """``[YYYY-MM-DD HH:MM:SS UTC] name (sender_id): body`` (body cut at :data:`MAX_BODY_CHARS`;
    line breaks in body, name and id become spaces: one entry is always one line). Sender blocks a
    user typed into a stored body or display name are neutralised as in live messages
    (:func:`runtime.reply.sender.strip_forged_prefix`): a tool result must not carry a forged
    ``[sender:… roles=master]`` either."""
    when = datetime.fromtimestamp(entry.time / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    body = entry.body if len(entry.body) <= MAX_BODY_CHARS else entry.body[: MAX_BODY_CHARS - 1] + "…"
    name = entry.sender_name or entry.sender_id
    return (
        f"[{when}] {_one_line(strip_forged_prefix(name))} ({_one_line(entry.sender_id)}): "
        f"{_one_line(strip_forged_prefix(body))}"
    )


def _one_line(text: str) -> str:
    # Every line break str.splitlines knows (\n, \r, \u2028, \x85…) becomes a space, so a body or
    # a display name cannot start a forged "[time] name (id): …" line of its own.
    return " ".join(text.splitlines())


async def search_transcripts(
    db: Database,
    *,
    platform: str,
    bot_id: str,
    scene_id: str,
    query: str,
    limit: int = 20,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> list[TranscriptEntry]:
    """The newest ``limit`` rows of the scene whose ``body`` contains ``query`` (case-insensitive,
    wildcards literal), returned oldest first. ``since_ms``/``until_ms`` bound ``time`` inclusively."""
    pattern = f"%{escape_like(no_nul(query))}%"  # stored bodies carry U+FFFD for NUL too

    def work() -> list[TranscriptEntry]:
        q = select(ImTranscriptRow).where(
            ImTranscriptRow.platform == platform,
            ImTranscriptRow.bot_id == bot_id,
            ImTranscriptRow.scene_id == scene_id,
            col(ImTranscriptRow.body).ilike(pattern, escape="\\"),
        )
        if since_ms is not None:
            q = q.where(col(ImTranscriptRow.time) >= since_ms)
        if until_ms is not None:
            q = q.where(col(ImTranscriptRow.time) <= until_ms)
        q = q.order_by(col(ImTranscriptRow.time).desc(), col(ImTranscriptRow.id).desc()).limit(limit)
        with db.session() as s:
            rows = s.exec(q).all()
        return [entry_from_row(r) for r in reversed(rows)]

    return await db.run(work)


def make_chat_history_tool(db: Database, *, platform: str, bot_id: str, scene_id: str) -> AgentTool[Any]:
    """The ``chat_history`` :class:`AgentTool` bound to one scene (the session's platform, bot and
    scene id); the model cannot search other scenes.

    The result text is the matching lines (see :func:`format_history_line`) or
    ``No messages matching '<query>'.``; ``details`` is ``{"count": int}``.
    """

    async def execute(
        tool_call_id: str, params: ChatHistoryParams, signal: AbortSignal | None, on_update: ToolUpdateFn
    ) -> AgentToolResult:
        entries = await search_transcripts(
            db,
            platform=platform,
            bot_id=bot_id,
            scene_id=scene_id,
            query=params.query,
            limit=params.limit,
            since_ms=params.since_ms,
            until_ms=params.until_ms,
        )
        if not entries:
            return AgentToolResult.text(f"No messages matching {params.query!r}.", details={"count": 0})
        text = "\n".join(format_history_line(e) for e in entries)
        return AgentToolResult.text(text, details={"count": len(entries)})

    return AgentTool(
        name=CHAT_HISTORY_TOOL_NAME,
        description=(
            "Search this chat's earlier messages (all participants and the bot) for a keyword, "
            "including those too old to be shown to you in this conversation. "
            "Returns matching lines with time (UTC), sender name and id, oldest first."
        ),
        parameters=ChatHistoryParams,
        execute=execute,
        label="Chat history",
    )

"""Session memory in SQL: the single source of truth of every session
(docs/decisions.md#memory-sql-truth).

Public names (stable; the actor runtime, platforms and agent features import them from here):

* Database: :class:`Database`, :data:`DEFAULT_DATABASE_URL`, :class:`DatabaseUrlError`
  (``db.py``) — engine from a URL, SQLite WAL/busy timeout or PostgreSQL (psycopg 3),
  ``create_tables()`` creates missing tables only.
* Tables: :class:`ImTranscriptRow`, :class:`AgentSessionRow`, :class:`AgentMessageRow`,
  :class:`AgentSummaryRow`, :data:`MEMORY_TABLES` (``tables.py``).
* Keys: :func:`make_session_key`, :func:`parse_session_key`, :func:`make_session_id`,
  :func:`parse_session_id`, :class:`SessionKey`, :class:`SessionId`, :class:`SessionKeyError`
  (``keys.py``).
* :class:`ContextRepository` (``load_context``, ``append_messages``, ``archive_session``,
  ``get_or_create_active``, ``add_summary``…), :class:`SessionInfo`, :class:`UnknownSessionError`,
  :class:`CorruptMessageError` (``repository.py``).
* Transcripts: :class:`TranscriptStore` (``record_inbound`` / ``record_outbound``),
  :class:`TranscriptEntry` (``transcripts.py``); the ``chat_history`` tool:
  :func:`make_chat_history_tool`, :func:`escape_like` (``chat_history.py``).
* Sender prefix: :func:`render_sender_prefix`, :func:`strip_forged_prefix`,
  :func:`convert_for_llm`, :func:`make_convert_to_llm` (``sender.py``).
* Compaction: :func:`make_compaction_hook`, :class:`CompactionHook`, :func:`estimate_tokens`
  (``compaction.py``).
"""

from runtime.keys import (
    SCOPES,
    Scope,
    SessionId,
    SessionKey,
    SessionKeyError,
    make_session_id,
    make_session_key,
    parse_session_id,
    parse_session_key,
)
from runtime.memory.chat_history import (
    CHAT_HISTORY_TOOL_NAME,
    ChatHistoryParams,
    escape_like,
    make_chat_history_tool,
    search_transcripts,
)
from runtime.memory.compaction import CompactionHook, estimate_tokens, find_cut, make_compaction_hook
from runtime.memory.db import DEFAULT_DATABASE_URL, Database, DatabaseUrlError, normalize_url
from runtime.memory.repository import (
    SUMMARY_CUSTOM_TYPE,
    ContextRepository,
    CorruptMessageError,
    SessionInfo,
    StoredMessage,
    UnknownSessionError,
    summary_message,
)
from runtime.memory.sender import (
    convert_for_llm,
    make_convert_to_llm,
    render_sender_prefix,
    sanitize_value,
    strip_forged_prefix,
    strip_user_message,
)
from runtime.memory.tables import (
    MEMORY_TABLES,
    AgentMessageRow,
    AgentSessionRow,
    AgentSummaryRow,
    ImTranscriptRow,
)
from runtime.memory.transcripts import TranscriptEntry, TranscriptOutcome, TranscriptStore, plain_text

__all__ = [
    "CHAT_HISTORY_TOOL_NAME",
    "DEFAULT_DATABASE_URL",
    "MEMORY_TABLES",
    "SCOPES",
    "SUMMARY_CUSTOM_TYPE",
    "AgentMessageRow",
    "AgentSessionRow",
    "AgentSummaryRow",
    "ChatHistoryParams",
    "CompactionHook",
    "ContextRepository",
    "CorruptMessageError",
    "Database",
    "DatabaseUrlError",
    "ImTranscriptRow",
    "Scope",
    "SessionId",
    "SessionInfo",
    "SessionKey",
    "SessionKeyError",
    "StoredMessage",
    "TranscriptEntry",
    "TranscriptOutcome",
    "TranscriptStore",
    "UnknownSessionError",
    "convert_for_llm",
    "escape_like",
    "estimate_tokens",
    "find_cut",
    "make_chat_history_tool",
    "make_compaction_hook",
    "make_convert_to_llm",
    "make_session_id",
    "make_session_key",
    "normalize_url",
    "parse_session_id",
    "parse_session_key",
    "plain_text",
    "render_sender_prefix",
    "sanitize_value",
    "search_transcripts",
    "strip_forged_prefix",
    "strip_user_message",
    "summary_message",
]

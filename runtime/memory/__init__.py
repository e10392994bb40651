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
  :class:`TranscriptEntry` (``transcripts.py``).
* Compaction: :func:`make_compaction_hook`, :class:`CompactionHook`, :func:`estimate_tokens`
  (``compaction.py``).

The ``chat_history`` tool is the session's (:mod:`runtime.session.chat_history`), the sender prefix
and the forged-prefix check the reply wing's (:mod:`runtime.reply.sender`); memory stores user
messages only after that check (docs/decisions.md#security-sender-prefix).
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_exports

if TYPE_CHECKING:
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
    from runtime.memory.tables import (
        MEMORY_TABLES,
        AgentMessageRow,
        AgentSessionRow,
        AgentSummaryRow,
        ImTranscriptRow,
    )
    from runtime.memory.transcripts import TranscriptEntry, TranscriptOutcome, TranscriptStore, plain_text
else:  # each name is imported on first use (docs/decisions.md#ops-lazy-exports)
    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "DEFAULT_DATABASE_URL",
    "MEMORY_TABLES",
    "SCOPES",
    "SUMMARY_CUSTOM_TYPE",
    "AgentMessageRow",
    "AgentSessionRow",
    "AgentSummaryRow",
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
    "estimate_tokens",
    "find_cut",
    "make_compaction_hook",
    "make_session_id",
    "make_session_key",
    "normalize_url",
    "parse_session_id",
    "parse_session_key",
    "plain_text",
    "summary_message",
]

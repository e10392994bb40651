"""Database URLs and the SQLite defaults (WAL, busy timeout, directory created)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect, text

import runtime.spend  # noqa: F401  (registers llm_usage, created with the memory tables: docs/decisions.md#spend-ledger)
from runtime.memory import DEFAULT_DATABASE_URL, Database, DatabaseUrlError, normalize_url


def test_default_url_creates_directory_with_wal_and_busy_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert DEFAULT_DATABASE_URL == "sqlite:///./data/sessionray.db"
    db = Database()
    try:
        assert (tmp_path / "data").is_dir()
        db.create_tables()
        assert (tmp_path / "data" / "sessionray.db").is_file()
        with db.engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 5000
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert sorted(inspect(db.engine).get_table_names()) == [
            "agent_messages",
            "agent_sessions",
            "agent_summaries",
            "capability_probes",  # one probe per model per TTL (decisions#structured-capability-cache)
            "delivery_ledger",  # with the memory tables since issue #16 (docs/decisions.md#delivery-outbox)
            "delivery_uncertain",
            "im_transcripts",
            "llm_usage",  # the usage ledger of the spend wing (docs/decisions.md#spend-ledger)
            "model_capabilities",
        ]
    finally:
        db.dispose()


def test_postgres_urls_use_psycopg3() -> None:
    for url in (
        "postgres://u:p@h:5432/d",
        "postgresql://u:p@h:5432/d",
        "postgresql+psycopg2://u:p@h:5432/d",
        "postgresql+psycopg://u:p@h:5432/d",
    ):
        assert normalize_url(url).render_as_string(hide_password=False) == "postgresql+psycopg://u:p@h:5432/d"
    assert repr(Database("postgresql://u:secret@h/d")) == "Database('postgresql+psycopg://u:***@h/d')"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u@h/d", "unsupported database backend 'mysql'"),
        ("sqlite://", "in-memory SQLite ('sqlite://') is not supported"),
        ("sqlite:///:memory:", "in-memory SQLite ('sqlite:///:memory:') is not supported"),
        ("not a url", "cannot parse database URL 'not a url'"),
    ],
)
def test_bad_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(DatabaseUrlError) as err:
        normalize_url(url)
    assert message in str(err.value)


def test_table_shapes(db: Database) -> None:
    insp = inspect(db.engine)
    cols = {t: [c["name"] for c in insp.get_columns(t)] for t in insp.get_table_names()}
    assert cols == {
        "im_transcripts": [
            "id",
            "message_id",
            "platform",
            "bot_id",
            "scene_id",
            "scene_type",
            "sender_id",
            "sender_name",
            "sender_role",
            "direction",
            "body",
            "media_json",
            "time",
        ],
        "agent_sessions": [
            "session_id",
            "session_key",
            "platform",
            "bot_id",
            "scene_id",
            "scene_type",
            "model",
            "status",
            "created_at",
            "updated_at",
        ],
        "agent_messages": ["id", "session_id", "role", "payload", "timestamp"],
        "agent_summaries": ["id", "session_id", "summary", "anchor_message_id", "created_at"],
        "capability_probes": ["provider", "model", "holder", "until_ms"],
        "model_capabilities": [
            "provider",
            "model",
            "tier",
            "source",
            "checked_at",
            "reason",
            "evidence",
            "failures",
            "updated_at",
        ],
        # the delivery tables are created with the memory tables since issue #16
        "delivery_ledger": [
            "reply_id", "session_key", "platform", "bot_id", "partition", "job_json", "status", "owner",
            "lease_until", "steps_total", "steps_done", "in_flight", "message_ids", "error", "created_at",
            "updated_at",
        ],
        "delivery_uncertain": ["reply_id", "step", "state", "owner", "created_at", "updated_at"],
        "llm_usage": [
            "id", "ts", "bot_id", "session_key", "user_id", "model", "api", "session_id", "turn_id",
            "reason", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens",
            "cost_usd", "master",
        ],
    }  # fmt: skip
    assert ("status", "session_key", "created_at") in {
        tuple(i["column_names"]) for i in insp.get_indexes("delivery_ledger")
    }
    indexes = {tuple(i["column_names"]) for i in insp.get_indexes("agent_messages")}
    assert ("session_id", "timestamp") in indexes
    uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("im_transcripts")}
    assert uniques == {("platform", "bot_id", "message_id", "direction")}

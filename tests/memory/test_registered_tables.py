"""The delivery tables are declared by the delivery wing and still created by the one
``Database.create_tables`` of every process that uses them (docs/decisions.md#layout-forbidden-pairs,
docs/decisions.md#memory-create-only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEMORY = [
    "agent_messages",
    "agent_sessions",
    "agent_summaries",
    "capability_probes",
    "im_transcripts",
    "model_capabilities",
]
DELIVERY = ["delivery_ledger", "delivery_uncertain"]
SPEND = ["llm_usage"]


def tables_created_after(imports: str, db_file: Path) -> list[str]:
    """Table names in a fresh SQLite file after a new interpreter runs ``imports`` and then
    ``Database.create_tables()`` (a new process: nothing imported before, as a host at start)."""
    code = (
        f"{imports}\n"
        "import json, sqlalchemy\n"
        "from runtime.memory.db import Database\n"
        f"db = Database('sqlite:///{db_file}')\n"
        "db.create_tables()\n"
        "print(json.dumps(sorted(sqlalchemy.inspect(db.engine).get_table_names())))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    names: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return names


def test_a_process_that_imports_delivery_creates_its_tables_with_the_memory_tables(tmp_path: Path) -> None:
    # Importing the delivery ledger (or the outbox) imports runtime.delivery.tables, which
    # registers the tables; the same create_all then makes all eight. The package alone registers
    # nothing: its exports are lazy (docs/decisions.md#ops-lazy-exports).
    with_delivery = sorted(MEMORY + DELIVERY)
    assert tables_created_after("import runtime.delivery.ledger", tmp_path / "a.db") == with_delivery
    assert tables_created_after("import runtime.delivery.outbox", tmp_path / "b.db") == with_delivery
    assert tables_created_after("import runtime.delivery", tmp_path / "c.db") == MEMORY


def test_a_session_host_creates_the_delivery_tables_it_writes(tmp_path: Path) -> None:
    # The session core writes a reply's queued ledger row with its im_reply record, and every LLM
    # call of its turns a usage row (runtime.session imports runtime.spend, which registers it).
    names = tables_created_after("import runtime.session.core", tmp_path / "b.db")
    assert names == sorted(MEMORY + DELIVERY + SPEND)


def test_memory_alone_creates_only_its_own_tables(tmp_path: Path) -> None:
    assert tables_created_after("import runtime.memory", tmp_path / "c.db") == MEMORY


def test_the_delivery_columns_are_unchanged(tmp_path: Path) -> None:
    # The schema did not move with the module: the same columns, keys and index as before.
    from sqlalchemy import inspect

    import runtime.delivery.ledger  # noqa: F401  (registers the delivery tables)
    from runtime.memory.db import Database

    db = Database(f"sqlite:///{tmp_path / 'd.db'}")
    db.create_tables()
    insp = inspect(db.engine)
    assert [c["name"] for c in insp.get_columns("delivery_uncertain")] == [
        "reply_id",
        "step",
        "state",
        "owner",
        "created_at",
        "updated_at",
    ]
    assert insp.get_pk_constraint("delivery_uncertain")["constrained_columns"] == ["reply_id", "step"]
    assert sorted(i["name"] for i in insp.get_indexes("delivery_ledger")) == [
        "ix_delivery_ledger_active",
        "ix_delivery_ledger_session_key",
        "ix_delivery_ledger_status",
    ]

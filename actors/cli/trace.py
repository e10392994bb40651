"""``sessionray trace <message-id|reply-id>``: where one message's time went.

With spans on disk (``tracing.enabled`` and no ``otlp_endpoint``: the JSON-lines files under
``tracing.spans_dir``) it prints the message's trace — and the traces of its replays, which link
to it — as a timeline: step (indented under its parent), process, start offset ms, duration ms.
Without spans (tracing off, sampled out, or sent to a collector) it prints the SQL-side record:
the inbox row (received, last change, state, attempts) and the delivery ledger rows of its
replies (queued, last change, status), in ms after the message was received
(docs/decisions.md#ops-traces).

Exit codes: 0 something was found; 1 nothing for that id; 2 a bad configuration file.
"""

from __future__ import annotations

import argparse
import sys

from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import col, or_, select

from runtime.config import ConfigError, load_config
from runtime.delivery.tables import DeliveryLedgerRow
from runtime.memory.db import Database
from runtime.memory.inbox import InboxRow
from runtime.tracing.records import format_timeline, read_spans, timeline, trace_of

__all__ = ["main", "sql_record"]


def main(argv: list[str] | None = None) -> int:
    """Run ``sessionray trace`` (see the module docstring); returns the exit code."""
    parser = argparse.ArgumentParser(prog="sessionray trace", description=__doc__.splitlines()[0])
    parser.add_argument("id", help="an inbound message id (as stored: Telegram '<chat>:<id>') or a reply id")
    parser.add_argument("--config", default=None, help="sessionray.yaml (default: ./sessionray.yaml)")
    parser.add_argument("--spans-dir", default=None, help="read spans here instead of tracing.spans_dir")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    spans = trace_of(read_spans(args.spans_dir or config.tracing.spans_dir), args.id)
    if spans:
        print(format_timeline(timeline(spans)))
        return 0
    rows = sql_record(Database(config.database.url), args.id)
    if not rows:
        print(f"nothing recorded for {args.id!r} (no span, no inbox or ledger row)", file=sys.stderr)
        return 1
    print("no spans (tracing off or not sampled); the SQL-side record:")
    print(f"{'step':<32} {'state':<12} {'at ms':>10}")
    for step, state, at_ms in rows:
        print(f"{step:<32} {state:<12} {at_ms:>10}")
    return 0


def sql_record(db: Database, ident: str) -> list[tuple[str, str, int]]:
    """``(step, state, ms after the first row's time)`` of the inbox rows of message ``ident``
    and the ledger rows of reply ``ident`` or of the replies to message ``ident``, in time order."""
    events: list[tuple[str, str, int]] = []
    try:
        with db.session() as s:
            for row in s.exec(select(InboxRow).where(col(InboxRow.message_id) == ident)).all():
                events.append(("inbox.received", "stored", row.received_at))
                events.append(("inbox.changed", row.state, row.updated_at))
            answer = col(DeliveryLedgerRow.job_json).contains(f'"reply_to":"{ident}"')
            query = select(DeliveryLedgerRow).where(or_(col(DeliveryLedgerRow.reply_id) == ident, answer))
            for led in s.exec(query).all():
                events.append((f"ledger.queued {led.reply_id}", "queued", led.created_at))
                events.append((f"ledger.changed {led.reply_id}", led.status, led.updated_at))
    except SQLAlchemyError:  # no such table yet (a database never served): nothing recorded
        return []
    if not events:
        return []
    t0 = min(at for _, _, at in events)
    return sorted(((step, state, at - t0) for step, state, at in events), key=lambda e: e[2])

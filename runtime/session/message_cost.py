"""What one message costs in SQL write transactions once the ingress has stored it: the numbers
docs/architecture.md ("The path of one message") quotes, in one place, so the test that counts
the writes of a real turn and the docs test read the same figures.

The message is the simple case: a triggered message of a live session whose turn makes one LLM
call and whose reply is one platform call over HTTP. Its writes, in order:

1. the hand-over: the turn's staged ``im_inbound`` record and user message, the LLM call's
   staged ``llm_usage`` row, the final answer, ``im_reply`` and the reply's ``queued`` row in the
   delivery ledger (docs/decisions.md#session-turn-records, docs/decisions.md#spend-ledger,
   docs/decisions.md#delivery-outbox);
2. step 0 marked on the wire as its request is written, which claims the row in the same
   ``UPDATE`` (the delivery actor read the chat's queue without a write:
   docs/decisions.md#delivery-outbox, docs/decisions.md#delivery-uncertain);
3. step 0 done, the reply ``sent``, with the outbound ``im_transcripts`` row in a savepoint.

Not counted here: the ingress's one write before it answers the webhook (the ``inbox`` row with the
inbound transcript row: docs/decisions.md#inbox-durable) and the inbox marks ``routed`` /
``handled``, written in batches with other messages' marks.
"""

from __future__ import annotations

from runtime.delivery.ledger import REPLY_WRITES_OVER_HTTP

__all__ = [
    "SQL_WRITES_PER_MESSAGE",
    "TURN_RECORD_WRITES",
    "USAGE_WRITES_PER_LLM_CALL",
]

TURN_RECORD_WRITES = 1
"""The turn's own write transactions: the hand-over (the staged ``im_inbound`` + user message, the
final answer, ``im_reply``, the ``queued`` ledger row). A tool call adds one: it is written, with
what is staged, before the tool runs."""

USAGE_WRITES_PER_LLM_CALL = 0
"""Write transactions of its own an LLM call of the turn costs: none, its ``llm_usage`` row goes
with the turn's next write (docs/decisions.md#spend-ledger)."""

SQL_WRITES_PER_MESSAGE = TURN_RECORD_WRITES + USAGE_WRITES_PER_LLM_CALL + REPLY_WRITES_OVER_HTTP
"""3 write transactions after the ingress's store, for a turn with one LLM call and a one-step
HTTP reply (module docstring). Each further reply step adds two; a further LLM call none of its
own (a tool call between two calls adds its write)."""

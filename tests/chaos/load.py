"""The chaos suite's open-loop webhook load: OneBot v11 group-message events over loopback HTTP.

Message ``k`` (0-based) is offered at ``t0 + k / (chats × rate)`` to chat ``k mod chats`` (group
``group_base + chat`` of bot ``chat mod bots``), whatever happened to earlier ones. Each carries
a unique ``message_id`` and the text ``chaos <message_id>`` (the built-in model answers
``You said: chaos <id>``; the OneBot codec quotes the message id in a group reply).

Two clients:

* **redelivering** (Telegram's behaviour): a non-200 answer or a connection error / timeout is
  redelivered — same body, same message id — up to :data:`REDELIVERIES` times, after
  ``min(0.5 × 2^n, 10)`` s (n = 0, 1, …: 65.5 s over the ten);
* **once** (OneBot's usual behaviour): one POST, whatever its answer.

Every attempt is kept (:class:`Sent`), so the figures can tell accepted from refused messages
and when the webhook did not answer 200.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["REDELIVERIES", "Sent", "event_body", "next_message_id", "open_loop"]

REDELIVERIES = 10
ATTEMPT_TIMEOUT_S = 10.0
"""One webhook POST's timeout (connect + answer)."""
_IDS = itertools.count(int(time.time()) % 1_000_000 * 1000)
"""Message ids of this process: unique across the scenarios that share one serve."""


def next_message_id() -> int:
    return next(_IDS)


def backoff_s(n: int) -> float:
    """Seconds before redelivery ``n`` (0-based)."""
    return float(min(0.5 * 2**n, 10.0))


@dataclass
class Sent:
    """One offered message and what the webhook answered."""

    mid: int
    chat: int
    due: float
    """Scheduled send time (``time.monotonic()``)."""
    attempts: list[tuple[float, int | str]] = field(default_factory=list)
    """(start time, HTTP status or the exception's class name) per POST."""
    accepted_at: float | None = None
    """When the first 200 came back; None: never accepted."""


def event_body(template: dict[str, Any], bot_id: str, group: int, user: int, mid: int) -> bytes:
    """The recorded group-message event re-addressed: bot ``bot_id``, ``group``, sender ``user``,
    ``message_id`` ``mid`` and the text ``chaos <mid>``."""
    text = f"chaos {mid}"
    event = {
        **template,
        "self_id": int(bot_id),
        "group_id": group,
        "user_id": user,
        "message_id": mid,
        "raw_message": text,
        "message": [{"type": "text", "data": {"text": text}}],
        "sender": {**template["sender"], "user_id": user},
    }
    return json.dumps(event).encode()


def group_template(fixtures_dir: Path) -> dict[str, Any]:
    """The recorded OneBot v11 group-message event (tests/fixtures, read only)."""
    loaded: dict[str, Any] = json.loads(
        (fixtures_dir / "onebot11" / "event_group_message_array.json").read_text()
    )
    return loaded


async def _deliver(client: Any, endpoint: str, body: bytes, sent: Sent, redeliver: bool) -> None:
    import httpx

    tries = 1 + (REDELIVERIES if redeliver else 0)
    for n in range(tries):
        t = time.monotonic()
        outcome: int | str
        try:
            resp = await client.post(endpoint, content=body, headers={"Content-Type": "application/json"})
            outcome = resp.status_code
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        sent.attempts.append((t, outcome))
        if outcome == 200:
            sent.accepted_at = time.monotonic()
            return
        if n + 1 < tries:
            await asyncio.sleep(backoff_s(n))


async def open_loop(
    targets: list[tuple[str, str]],
    fixtures_dir: Path,
    *,
    chats: int,
    rate_per_chat: float,
    duration_s: float,
    redeliver: bool,
    group_base: int,
    t0: float | None = None,
) -> list[Sent]:
    """Offer ``chats × rate_per_chat × duration_s`` messages (module docstring) to the bots of
    ``targets`` (webhook URL, bot id) from ``t0`` (default: now) and return once every message
    was accepted or gave up (its redeliveries spent). ``redeliver``: the redelivering client,
    else the once client."""
    import httpx

    template = group_template(fixtures_dir)
    rate = chats * rate_per_chat
    count = round(rate * duration_s)
    timeout = httpx.Timeout(ATTEMPT_TIMEOUT_S)
    # no cap on connections: a cap makes the client queue posts behind slow ones, and a wait
    # for a free connection (PoolTimeout) is not an answer of the webhook
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
    out: list[Sent] = []
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
        start = time.monotonic() if t0 is None else t0
        tasks = []
        for k in range(count):
            due = start + k / rate
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            chat = k % chats
            sent = Sent(mid=next_message_id(), chat=chat, due=due)
            out.append(sent)
            endpoint, bot_id = targets[chat % len(targets)]
            body = event_body(template, bot_id, group_base + chat, 200_000_000 + chat, sent.mid)
            tasks.append(asyncio.ensure_future(_deliver(client, endpoint, body, sent, redeliver)))
        await asyncio.gather(*tasks)
    return out

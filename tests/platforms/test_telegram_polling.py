"""Telegram long polling end to end (docs/decisions.md#platform-telegram-polling): a real local Ray
runtime, the ``TelegramPoller`` actor of a ``mode: polling`` bot, and a Bot API stand-in on
loopback HTTP serving ``getUpdates`` (recorded updates, long-poll and offset semantics) and
``sendMessage``. Covered: the reply to a polled update; a poller killed with SIGKILL between
storing an update and committing its offset, with an update queued in the durable inbox behind a
full mailbox (nothing skipped, nothing answered twice, in order); 429 with
``retry_after`` honoured; 409 Conflict surfaced on ``/healthz``."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.exc import OperationalError

from runtime.memory.inbox import get_row
from tests.actors.session_support import eventually
from tests.platforms.e2e_support import TG_BOT
from tests.platforms.polling_support import GATE, POLL_TIMEOUT_S, PollStack, running_poll_stack, update

pytestmark = pytest.mark.ray

SLOW_REPLY = "tool: gate open; then: []"
"""The scripted model's answer to ``slow 1`` once the gated ``sleep`` tool returned."""


@pytest.fixture(scope="module")
def stack(
    ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path
) -> Iterator[PollStack]:
    with running_poll_stack(tmp_path_factory.mktemp("poll"), fixtures_dir) as s:
        yield s


@pytest.fixture
def base(load_json: Any) -> dict[str, Any]:
    return dict(load_json("telegram/update_private_text.json"))


async def committed(stack: PollStack) -> int | None:
    return await stack.offsets.load("telegram", TG_BOT)


async def inbound_texts(stack: PollStack, chat_id: int) -> list[str]:
    rows = await stack.transcripts.scene("telegram", TG_BOT, str(chat_id))
    return [r.body for r in rows if r.direction == "inbound"]


async def test_a_polled_update_is_answered_and_its_offset_committed(
    stack: PollStack, base: dict[str, Any]
) -> None:
    stack.api.push(base)  # the recorded update: update_id 10000, "/start" from chat 1111111
    sent = await eventually(lambda: stack.sends(1111111), 60, "reply")
    assert sent == ["re: /start"]
    assert await eventually(lambda: committed(stack), 30, "offset") == 10001
    # the offset confirms the update to Telegram on the next call; nothing is polled twice
    later = stack.api.wait_until(lambda: [p for p in stack.api.polls if p.offset == 10001], what="next poll")
    assert later[0].payload == {"timeout": POLL_TIMEOUT_S, "allowed_updates": ["message"], "offset": 10001}
    first = stack.api.polls[0].payload
    assert first == {"timeout": POLL_TIMEOUT_S, "allowed_updates": ["message"]}  # nothing committed yet
    assert stack.api.arrivals("deleteWebhook") == 1
    assert stack.api.pending == []
    assert await inbound_texts(stack, 1111111) == ["/start"]
    # a polling bot has no webhook route (it would take unauthenticated updates)
    async with httpx.AsyncClient(base_url=stack.base_url) as client:
        resp = await client.post(f"/webhooks/telegram/{TG_BOT}", json=base)
    assert resp.status_code == 404
    assert stack.sends(1111111) == ["re: /start"]


async def test_a_poller_killed_between_store_and_offset_commit_skips_and_repeats_nothing(
    stack: PollStack, base: dict[str, Any]
) -> None:
    chat = 2222222
    gate = stack.markers / GATE
    gate.unlink(missing_ok=True)
    # one getUpdates answer with both: u1's turn waits on the gate, so u2 finds the session's
    # mailbox (one message) full — stored and answered "queued" (the inbox recovery loop routes
    # it once there is room: docs/decisions.md#inbox-durable), so both offsets are committed
    u1, u2 = update(20001, chat, 1, "slow 1", base), update(20002, chat, 2, "echo two", base)
    stack.api.push(u1, u2)
    await eventually(lambda: _at_least(committed(stack), 20003), 60, "both offsets committed")
    assert await inbound_texts(stack, chat) == ["slow 1", "echo two"]  # both stored
    assert await inbox_state(stack, f"{chat}:2") == "stored"  # u2 waits for room, not routed
    assert stack.sends(chat) == []

    stack.api.hold("deleteWebhook")  # the next incarnation parks at its first call
    deletes = stack.api.arrivals("deleteWebhook")
    os.kill(await stack.poller.pid.remote(), signal.SIGKILL)
    stack.api.wait_until(lambda: stack.api.arrivals("deleteWebhook") > deletes, what="poller restart")
    # Rewind to the state a crash right after u1 was stored (before its commit) leaves: neither
    # was confirmed to Telegram (both came in one answer), so Telegram serves both again.
    await stack.offsets.commit("telegram", TG_BOT, 20001)
    stack.api.push(u1, u2)
    polls_before = len(stack.api.polls)
    stack.api.release("deleteWebhook")
    again = stack.api.wait_until(lambda: [p for p in stack.api.polls[polls_before:] if p.offset == 20001])
    assert again, "the restarted poller reads from the committed offset"
    await eventually(
        lambda: _at_least(committed(stack), 20003), 60, "both committed again (inbox duplicates)"
    )

    gate.write_text("")
    await eventually(lambda: len(stack.sends(chat)) >= 2, 60, "both replies")
    stack.api.wait_until(lambda: [p for p in stack.api.polls if p.offset == 20003], what="poll after u2")
    await eventually(lambda: _state_is(stack, f"{chat}:2", "handled"), 60, "u2 handled")
    assert stack.sends(chat) == [SLOW_REPLY, "two"]  # each answered exactly once, in order
    assert await inbound_texts(stack, chat) == ["slow 1", "echo two"]
    assert len(list(stack.markers.glob("*.started"))) == 1  # u1's turn ran once


async def test_429_waits_the_retry_after_telegram_asks_for(stack: PollStack, base: dict[str, Any]) -> None:
    chat = 3333333
    stack.api.fail_polls(
        1,
        429,
        {"ok": False, "error_code": 429, "description": "Too Many Requests: retry after 3",
         "parameters": {"retry_after": 3}},
    )  # fmt: skip
    n = len(stack.api.polls)
    stack.api.wait_until(lambda: len(stack.api.polls) > n, what="the refused poll")
    stack.api.push(update(30001, chat, 1, "echo after the flood wait", base))
    assert await eventually(lambda: stack.sends(chat), 60, "reply") == ["after the flood wait"]
    # the first call after the script was answered 429; the next one came ≥ 3 s later (the
    # back-off alone would have waited 1 s) and took the update
    refused, following = stack.api.polls[n], stack.api.polls[n + 1]
    assert following.at - refused.at >= 3.0
    status = await stack.poller.status.remote()
    assert {"reason": "rate_limited", "wait_s": 3.0} in status["waits"]
    assert status["state"] == "polling"


async def test_409_conflict_is_surfaced_on_healthz(stack: PollStack, base: dict[str, Any]) -> None:
    chat = 4444444
    conflict = (
        "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
    )
    stack.api.fail_polls(3, 409, {"ok": False, "error_code": 409, "description": conflict})

    async def health() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=stack.base_url) as client:
            resp = await client.get("/healthz")
        assert resp.status_code == 200
        return dict(resp.json())

    async def in_conflict() -> dict[str, Any] | None:
        body = await health()
        return body if body["telegram_polling"][TG_BOT]["state"] == "conflict" else None

    body = await eventually(in_conflict, 60, "conflict on /healthz")
    assert body["status"] == "ok"
    assert body["telegram_polling"][TG_BOT]["error"] == f"HTTP 409: {conflict}"
    # once the other poller is gone, polling goes on by itself
    stack.api.push(update(40001, chat, 1, "echo back", base))
    assert await eventually(lambda: stack.sends(chat), 60, "reply") == ["back"]
    after = await health()
    assert after["telegram_polling"][TG_BOT]["state"] == "polling"
    assert after["telegram_polling"][TG_BOT]["error"] is None
    waits = [w["reason"] for w in (await stack.poller.status.remote())["waits"]]
    assert waits.count("conflict") >= 3


async def inbox_state(stack: PollStack, message_id: str) -> str | None:
    """The inbox state of one message of the bot (Telegram ids are ``<chat>:<message>``)."""
    db = stack.transcripts.db
    row = await db.run(lambda: get_row(db, "telegram", TG_BOT, message_id))
    return None if row is None else row.state


async def _state_is(stack: PollStack, message_id: str, state: str) -> bool:
    return await inbox_state(stack, message_id) == state


async def _at_least(coro: Any, value: int) -> bool:
    try:
        got = await coro
    except OperationalError:  # the poller has not created its offsets table yet
        return False
    return got is not None and got >= value

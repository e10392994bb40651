"""Attacks on hot-chat coalescing (docs/decisions.md#session-hot-chat-coalescing): the same
message delivered twice while it waits for a batch (a platform's webhook retry) is answered once,
in one batch, and never asked twice; a steer arriving while a batch turn runs reaches it once.
Real SessionCore + SQLite + a gated faux model, no sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.config.ai import CoalesceConfig
from runtime.llm.types import CustomMessage
from tests.session.test_hot_chat_coalescing import GROUP, GatedModel, Recorder, open_core, turn, until


async def test_a_message_delivered_twice_while_queued_is_asked_and_answered_once(repo: Any) -> None:
    model, rec = GatedModel({1}), Recorder()
    core = await open_core(repo, GROUP, model, rec, CoalesceConfig(max_batch=8, max_queue=8), "co-dup")
    first = asyncio.ensure_future(core.submit(turn(GROUP, 1, "a", "q1")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    again = [
        asyncio.ensure_future(core.submit(turn(GROUP, 2, "b", "q2"))),
        asyncio.ensure_future(core.submit(turn(GROUP, 3, "c", "q3"))),
        asyncio.ensure_future(core.submit(turn(GROUP, 4, "b", "q2", message_id="m2"))),  # the retry
    ]
    await until(lambda: core.status()["queued"] >= 2)
    model.gate(1).set()
    results = await asyncio.wait_for(asyncio.gather(first, *again), 20)

    assert len(model.calls) == 2
    _, asked, _ = model.calls[1]
    assert asked == [("b", "q2"), ("c", "q3")]  # m2 asked once
    assert [j.reply_id for j in rec.jobs] == [f"{core.session_id}/m1", f"{core.session_id}/m2"]
    assert (results[3].seq, results[3].message_id, results[3].reply_id) == (4, "m2", f"{core.session_id}/m2")
    stored = (await repo.load_context(core.session_id)).messages
    replies = [
        m.data["message_id"] for m in stored if isinstance(m, CustomMessage) and m.custom_type == "im_reply"
    ]
    assert sorted(replies) == ["m1", "m2", "m3"]  # one marker per message id


async def test_a_steer_arriving_mid_batch_reaches_the_model_once(repo: Any) -> None:
    model, rec = GatedModel({1, 2}), Recorder()
    core = await open_core(repo, GROUP, model, rec, CoalesceConfig(max_batch=8, max_queue=8), "co-steer")
    first = asyncio.ensure_future(core.submit(turn(GROUP, 1, "a", "q1")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    batch = [asyncio.ensure_future(core.submit(turn(GROUP, s, f"u{s}", f"q{s}"))) for s in (2, 3)]
    await until(lambda: core.status()["queued"] == 2)
    model.gate(1).set()
    await asyncio.wait_for(model.started_event(2).wait(), 10)  # the batch turn is at the model
    assert core.steer("and the weather?", "u2") == "steered"
    model.gate(2).set()
    results = await asyncio.wait_for(asyncio.gather(first, *batch), 20)
    assert [r.outcome for r in results] == ["ok"] * 3
    seen = [call for call in model.calls if any("and the weather?" in t for _, t in call[1])]
    assert len(seen) == 1  # inside the batch turn: asked once, never lost, never twice
    assert len(model.calls) == 3 and len(rec.jobs) == 2  # q1's turn, the batch turn + its steered call

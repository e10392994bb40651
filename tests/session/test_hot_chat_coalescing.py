"""Hot-chat coalescing in a real (Ray-free) session: SessionCore + SQLite + a faux model that waits
on events the test opens (docs/decisions.md#session-hot-chat-coalescing). No sleeps order anything:
the model signals each call's start and waits for the test's gate."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from providers.faux import register_faux_provider
from runtime.config.ai import CoalesceConfig
from runtime.llm.types import (
    AssistantMessage,
    Context,
    CustomMessage,
    TextContent,
    ToolCall,
    UserMessage,
)
from runtime.memory.db import Database
from runtime.session.coalesce import BusyNotices
from runtime.session.core import SessionCore
from runtime.session.turn import SessionSetup, TurnInput
from tests.session.recorder import Recorder

GROUP = "onebot11:10001:group:777"
PRIVATE = "onebot11:10001:private:888"
SENDER = re.compile(r"\[sender:id=(\S+) name=\S* roles=\S*\]\s*(.*)", re.S)


class GatedModel:
    """A faux model whose calls listed in ``blocking`` wait for the test to open their gate. Each
    answer mentions every distinct sender among the user messages after the last assistant message
    (what this turn answers), once, in order, then says what it answered."""

    def __init__(self, blocking: set[int], tool_calls: frozenset[int] = frozenset()) -> None:
        self.blocking = blocking
        self.tool_calls = tool_calls
        """Calls that ask for the ``echo_one`` tool first instead of answering."""
        self.calls: list[tuple[str, list[tuple[str, str]], list[str]]] = []
        self.started: dict[int, asyncio.Event] = {}
        self.gates: dict[int, asyncio.Event] = {}

    def started_event(self, n: int) -> asyncio.Event:
        return self.started.setdefault(n, asyncio.Event())

    def gate(self, n: int) -> asyncio.Event:
        return self.gates.setdefault(n, asyncio.Event())

    async def __call__(self, context: Context, options: Any) -> AssistantMessage:
        msgs = context.messages
        last = max(  # a tool round of this turn is not an answer
            (i for i, m in enumerate(msgs) if isinstance(m, AssistantMessage) and not m.tool_calls()),
            default=-1,
        )
        asked = [_sender_and_text(m) for m in msgs[last + 1 :] if isinstance(m, UserMessage)]
        history = [_sender_and_text(m)[1] for m in msgs[: last + 1] if isinstance(m, UserMessage)]
        self.calls.append((context.system_prompt or "", asked, history))
        n = len(self.calls)
        self.started_event(n).set()
        if n in self.blocking:
            await self.gate(n).wait()
        if n in self.tool_calls:
            call = ToolCall(id=f"call{n}", name="echo_one", arguments={"text": f"looked {n}"})
            return AssistantMessage(content=[call], stop_reason="toolUse")
        segments: list[dict[str, Any]] = []
        for sender in dict.fromkeys(s for s, _ in asked if s):
            segments.append({"type": "mention", "data": {"target": sender}})
        texts = ", ".join(t for _, t in asked)
        segments.append({"type": "text", "data": {"text": f" re: {texts}"}})
        return AssistantMessage(content=[TextContent(text=json.dumps({"segments": segments}))])


def _sender_and_text(m: UserMessage) -> tuple[str, str]:
    body = m.content if isinstance(m.content, str) else "".join(getattr(b, "text", "") for b in m.content)
    hit = SENDER.match(body)
    return (hit.group(1), hit.group(2).strip()) if hit else ("", body.strip())


async def until(pred: Any, timeout_s: float = 10.0) -> None:
    """Wait (polling the loop) until ``pred()`` holds; fails after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def turn(key: str, seq: int, user: str, words: str, *, attempt: int = 0, message_id: str = "") -> TurnInput:
    platform, bot, scope, scene = key.split(":")
    return TurnInput(
        seq=seq,
        session_key=key,
        platform=platform,
        bot_id=bot,
        message_id=message_id or f"m{seq}",
        scene_type=scope,
        scene_id=scene,
        sender={"id": user, "name": f"n{user}", "roles": []},
        text=words,
        time_ms=1_700_000_000_000 + seq,
        attempt=attempt,
    )


async def open_core(
    repo: Any, key: str, model: GatedModel, rec: Recorder, coalesce: CoalesceConfig | None, provider: str
) -> SessionCore:
    from tests.session.handlers import ONE_TOOL

    handle = register_faux_provider(provider=provider, default_response=model)
    setup = SessionSetup(model=handle.get_model(), coalesce=coalesce, tools=[ONE_TOOL])
    return await SessionCore.open(key, repo, setup, rec, max_concurrent_turns=4)


async def test_mentions_arriving_during_a_turn_are_answered_by_one_batch_turn(repo: Any, metric: Any) -> None:
    model, rec = GatedModel({1}), Recorder()
    config = CoalesceConfig(max_batch=16, max_queue=16)
    core = await open_core(repo, GROUP, model, rec, config, "co-batch")
    users = [f"u{i}" for i in range(5)]
    first = asyncio.ensure_future(core.submit(turn(GROUP, 1, users[0], "q1")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    rest = [
        asyncio.ensure_future(core.submit(turn(GROUP, s, users[(s - 1) % 5], f"q{s}"))) for s in range(2, 11)
    ]
    await until(lambda: core.status()["queued"] == 9)
    model.gate(1).set()
    results = await asyncio.wait_for(asyncio.gather(first, *rest), 20)

    assert len(model.calls) == 2  # exactly two LLM turns for ten mentions
    prompt, asked, _ = model.calls[1]
    assert asked == [(users[(s - 1) % 5], f"q{s}") for s in range(2, 11)]  # nine, in order, with senders
    assert "the last 9 user messages are one batch" in prompt
    assert [r.outcome for r in results] == ["ok"] * 10
    batch_id = f"{core.session_id}/m2"
    assert [r.reply_id for r in results] == [f"{core.session_id}/m1"] + [batch_id] * 9
    assert [r.message_id for r in results] == [f"m{s}" for s in range(1, 11)]
    assert [j.reply_id for j in rec.jobs] == [f"{core.session_id}/m1", batch_id]
    batch_reply = rec.jobs[1]
    askers = list(dict.fromkeys(users[(s - 1) % 5] for s in range(2, 11)))
    assert batch_reply.reply.mentions() == askers  # each asker once
    assert sorted(askers) == sorted(users)
    assert batch_reply.reply_to is None  # the mentions address the askers
    stored = (await repo.load_context(core.session_id)).messages
    replies = [m.data for m in stored if isinstance(m, CustomMessage) and m.custom_type == "im_reply"]
    assert [(d["message_id"], d["reply_id"]) for d in replies] == [("m1", f"{core.session_id}/m1")] + [
        (f"m{s}", batch_id) for s in range(2, 11)
    ]
    assert metric("sessionray_coalesced_batch_size_count", platform="onebot11") == 2
    assert metric("sessionray_coalesced_batch_size_sum", platform="onebot11") == 10


async def test_overflow_gets_one_busy_notice_per_interval_and_is_stored(repo: Any, metric: Any) -> None:
    model, rec = GatedModel({1}), Recorder()
    config = CoalesceConfig(max_batch=8, max_queue=2, busy_notice="busy, sorry", busy_notice_interval_s=3600)
    core = await open_core(repo, GROUP, model, rec, config, "co-over")
    first = asyncio.ensure_future(core.submit(turn(GROUP, 1, "a", "q1")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    queued = [asyncio.ensure_future(core.submit(turn(GROUP, s, "b", f"q{s}"))) for s in (2, 3)]
    await until(lambda: core.status()["queued"] == 2)
    over4 = await asyncio.wait_for(core.submit(turn(GROUP, 4, "c", "q4")), 10)
    over5 = await asyncio.wait_for(core.submit(turn(GROUP, 5, "d", "q5")), 10)
    # answered at once, while the first turn still runs: a notice for the first, none for the second
    assert (over4.outcome, over4.reply_id, over4.preview) == (
        "busy",
        f"{core.session_id}/busy/m4",
        "busy, sorry",
    )
    assert (over5.outcome, over5.reply_id) == ("busy", "")
    assert [j.reply.preview_text() for j in rec.jobs] == ["busy, sorry"]
    assert rec.jobs[0].reply_to == "m4"
    model.gate(1).set()
    results = await asyncio.wait_for(asyncio.gather(first, *queued), 20)
    assert [r.outcome for r in results] == ["ok"] * 3
    assert len(model.calls) == 2
    _, asked, history = model.calls[1]
    assert asked == [("b", "q2"), ("b", "q3")]
    assert {"q4", "q5"} <= set(history)  # the overflowed messages are history the next turn sees
    stored = (await repo.load_context(core.session_id)).messages
    users = [m.content for m in stored if isinstance(m, UserMessage)]
    assert sorted(users) == ["q1", "q2", "q3", "q4", "q5"]
    replies = {
        m.data["message_id"]: m.data["reply_id"]
        for m in stored
        if isinstance(m, CustomMessage) and m.custom_type == "im_reply"
    }
    assert replies["m4"] == f"{core.session_id}/busy/m4" and replies["m5"] == ""  # handled: never re-run
    assert metric("sessionray_busy_notices_total", platform="onebot11", outcome="sent") == 1
    assert metric("sessionray_busy_notices_total", platform="onebot11", outcome="suppressed") == 1


def test_busy_notices_are_rate_limited_by_the_interval() -> None:
    now = [100.0]
    notices = BusyNotices(CoalesceConfig(busy_notice_interval_s=30), clock=lambda: now[0])
    assert notices.take() is True
    now[0] = 129.9
    assert notices.take() is False
    now[0] = 130.0
    assert notices.take() is True


async def test_private_chats_are_not_coalesced_by_default(repo: Any) -> None:
    model, rec = GatedModel({1}), Recorder()
    core = await open_core(repo, PRIVATE, model, rec, CoalesceConfig(), "co-private")
    first = asyncio.ensure_future(core.submit(turn(PRIVATE, 1, "888", "q1")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    second = asyncio.ensure_future(core.submit(turn(PRIVATE, 2, "888", "q2")))
    await asyncio.wait_for(model.started_event(2).wait(), 10)  # ran while the first still waits
    model.gate(1).set()
    results = await asyncio.wait_for(asyncio.gather(first, second), 20)
    assert [r.reply_id for r in results] == [f"{core.session_id}/m1", f"{core.session_id}/m2"]
    # two overlapping turns (the second saw q1 as it was: not yet answered), no batch
    assert [c[1][-1] for c in model.calls] == [("", "q1"), ("", "q2")]
    assert "one batch" not in model.calls[1][0]


async def test_a_group_without_coalescing_overlaps_its_turns(repo: Any) -> None:
    model, rec = GatedModel({1}), Recorder()
    core = await open_core(repo, GROUP, model, rec, CoalesceConfig(groups=False), "co-off")
    first = asyncio.ensure_future(core.submit(turn(GROUP, 1, "a", "q1")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    others = [asyncio.ensure_future(core.submit(turn(GROUP, s, "b", f"q{s}"))) for s in (2, 3)]
    await asyncio.wait_for(model.started_event(3).wait(), 10)
    model.gate(1).set()
    results = await asyncio.wait_for(asyncio.gather(first, *others), 20)
    assert [r.reply_id for r in results] == [f"{core.session_id}/m{s}" for s in (1, 2, 3)]
    assert len(rec.jobs) == 3


async def _crash_during_the_batch(
    repo: Any, model: GatedModel, rec: Recorder, config: CoalesceConfig, call: int
) -> str:
    """q1 runs, q2–q4 queue behind it as one batch; the process "dies" while the batch's LLM call
    ``call`` waits (nothing more is written). Returns the session id."""
    core = await open_core(repo, GROUP, model, rec, config, "co-crash")
    first = asyncio.ensure_future(core.submit(turn(GROUP, 1, "a", "q1")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    batch = [
        asyncio.ensure_future(core.submit(turn(GROUP, s, u, f"q{s}")))
        for s, u in ((2, "b"), (3, "c"), (4, "d"))
    ]
    await until(lambda: core.status()["queued"] == 3)
    model.gate(1).set()
    assert (await asyncio.wait_for(first, 10)).outcome == "ok"
    await asyncio.wait_for(model.started_event(call).wait(), 10)
    for t in list(core._tasks):
        t.cancel()
    for f in batch:
        f.cancel()
    return core.session_id


async def _ledger_rows(repo: Any, reply_id: str) -> int:
    with repo.db.connection() as conn:
        rows = conn.execute(text("SELECT count(*) FROM delivery_ledger WHERE reply_id = :r"), {"r": reply_id})
        return int(rows.scalar_one())


async def test_a_crashed_batch_is_resumed_once_and_never_sent_twice(repo: Any) -> None:
    # the batch's first call asks for a tool: its records are written before the tool runs
    model, rec = GatedModel({1, 3}, tool_calls=frozenset({2})), Recorder()
    config = CoalesceConfig(max_batch=8, max_queue=8)
    sid = await _crash_during_the_batch(repo, model, rec, config, call=3)
    kinds = [type(m).__name__ for m in (await repo.load_context(sid)).messages]
    batch_then_tool_round = ["CustomMessage", "UserMessage"] * 3 + ["AssistantMessage", "ToolResultMessage"]
    assert kinds[-8:] == batch_then_tool_round
    retry = await open_core(repo, GROUP, model, rec, config, "co-crash")
    model.gate(4).set()
    again = [
        retry.submit(turn(GROUP, s - 1, u, f"q{s}", attempt=1, message_id=f"m{s}"))
        for s, u in ((2, "b"), (3, "c"), (4, "d"))
    ]
    results = await asyncio.wait_for(asyncio.gather(*again), 20)
    assert [r.outcome for r in results] == ["ok", "already_done", "already_done"]
    assert {r.reply_id for r in results} == {f"{sid}/m2"}
    prompt, asked, _ = model.calls[3]  # the resumed batch: all three messages, told it is a batch
    assert asked == [("b", "q2"), ("c", "q3"), ("d", "q4")]
    assert "the last 3 user messages are one batch" in prompt
    assert [j.reply_id for j in rec.jobs] == [f"{sid}/m1", f"{sid}/m2"]
    assert rec.jobs[1].reply.mentions() == ["b", "c", "d"]

    # one more retry of every member (a second crash after the hand-over): nothing is sent again
    third = await open_core(repo, GROUP, model, rec, config, "co-crash")
    again = [third.submit(turn(GROUP, s - 1, "x", f"q{s}", attempt=1, message_id=f"m{s}")) for s in (2, 3, 4)]
    assert [r.outcome for r in await asyncio.wait_for(asyncio.gather(*again), 20)] == ["already_done"] * 3
    assert len(model.calls) == 4
    assert await _ledger_rows(repo, f"{sid}/m2") == 1


async def test_a_batch_crashed_before_its_first_write_is_answered_as_new_and_never_twice(
    repo: Any,
) -> None:
    # no tool: the batch's records wait for its hand-over (docs/decisions.md#session-turn-records)
    model, rec = GatedModel({1, 2}), Recorder()
    config = CoalesceConfig(max_batch=8, max_queue=8)
    sid = await _crash_during_the_batch(repo, model, rec, config, call=2)
    kinds = [type(m).__name__ for m in (await repo.load_context(sid)).messages]
    assert kinds[-1] == "CustomMessage" and "UserMessage" not in kinds[kinds.index("AssistantMessage") :]
    retry = await open_core(repo, GROUP, model, rec, config, "co-crash")
    again = [
        retry.submit(turn(GROUP, s - 1, u, f"q{s}", attempt=1, message_id=f"m{s}"))
        for s, u in ((2, "b"), (3, "c"), (4, "d"))
    ]
    results = await asyncio.wait_for(asyncio.gather(*again), 20)
    assert all(r.outcome == "ok" for r in results)
    answered = [m for j in rec.jobs[1:] for m in j.reply.mentions()]
    assert sorted(answered) == ["b", "c", "d"]  # each asker answered once, by one reply or a batch
    for j in rec.jobs:
        assert await _ledger_rows(repo, j.reply_id) == 1
    third = await open_core(repo, GROUP, model, rec, config, "co-crash")
    again = [third.submit(turn(GROUP, s - 1, "x", f"q{s}", attempt=1, message_id=f"m{s}")) for s in (2, 3, 4)]
    assert [r.outcome for r in await asyncio.wait_for(asyncio.gather(*again), 20)] == ["already_done"] * 3
    assert len(rec.jobs) == 1 + len({r.reply_id for r in results})


async def test_chat_commands_are_answered_in_order_and_never_batched(repo: Any) -> None:
    from runtime.session.commands import CommandHandler
    from runtime.session.features import AgentFeatures

    model, rec = GatedModel({1}), Recorder()
    handle = register_faux_provider(provider="co-cmd", default_response=model)
    setup = SessionSetup(
        model=handle.get_model(),
        coalesce=CoalesceConfig(max_batch=8, max_queue=8),
        features=AgentFeatures(commands=CommandHandler()),
    )
    core = await SessionCore.open(GROUP, repo, setup, rec, max_concurrent_turns=4)
    first = asyncio.ensure_future(core.submit(turn(GROUP, 1, "a", "q1")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    words = {2: "q2", 3: "q3", 4: "/help", 5: "q5"}
    rest = [asyncio.ensure_future(core.submit(turn(GROUP, s, "b", w))) for s, w in words.items()]
    await until(lambda: core.status()["queued"] == 4)
    model.gate(1).set()
    results = await asyncio.wait_for(asyncio.gather(first, *rest), 20)
    sid = core.session_id
    # q2+q3 are one batch; /help is answered before the agent, on its own, in its place; q5 after it
    assert [r.reply_id for r in results] == [f"{sid}/m1", f"{sid}/m2", f"{sid}/m2", f"{sid}/m4", f"{sid}/m5"]
    assert [c[1] for c in model.calls[1:]] == [[("b", "q2"), ("b", "q3")], [("b", "q5")]]
    assert rec.jobs[2].reply.preview_text().startswith("Commands you can use here:")


async def test_history_never_lands_between_a_tool_call_and_its_result(repo: Any) -> None:
    from runtime.llm.types import ToolCall, ToolResultMessage
    from runtime.session.exchanges import Exchanges
    from runtime.session.turn import SessionWriter

    session_id, _ = await repo.open_active(GROUP, model="faux/faux-model")
    writer = SessionWriter(repo, session_id, [])
    exchanges = Exchanges(lambda: writer)
    owner = object()
    record = exchanges.recorder(owner)
    call = AssistantMessage(content=[ToolCall(id="c1", name="t", arguments={})], stop_reason="toolUse")
    await record([call])
    held = asyncio.ensure_future(exchanges.append_between([UserMessage(content="overflowed")]))
    await asyncio.sleep(0)  # the history waits: the call is open
    assert not held.done()
    result = ToolResultMessage(tool_call_id="c1", tool_name="t", content=[TextContent(text="ok")])
    await record([result])
    await asyncio.wait_for(held, 5)
    stored = (await repo.load_context(session_id)).messages
    assert [m.role for m in stored] == ["assistant", "toolResult", "user"]
    await exchanges.append_between([UserMessage(content="now")])  # nothing open: written at once
    assert [m.role for m in writer.snapshot()][-1] == "user" and len(writer) == 4


async def test_a_turn_sees_every_record_but_another_running_turns(repo: Any) -> None:
    from runtime.session.exchanges import Exchanges
    from runtime.session.turn import SessionWriter

    session_id, _ = await repo.open_active(GROUP, model="faux/faux-model")
    writer = SessionWriter(repo, session_id, [])
    exchanges = Exchanges(lambda: writer)
    history = await writer.append([UserMessage(content="old question")])
    mine, other = object(), object()
    seen = exchanges.visible(history, mine)
    assert seen == history and seen is not history  # nothing in flight: all of it, a copy
    said = AssistantMessage(content=[TextContent(text="other turn's answer so far")])
    await exchanges.recorder(other)([said])
    context = writer.snapshot()
    assert exchanges.visible(context, mine) == history  # the other turn's record is in flight
    assert exchanges.visible(context, other) == context  # its own record it sees
    await exchanges.end(other)
    assert exchanges.visible(context, mine) == context  # once that turn ended, everyone sees it


def test_the_config_turns_coalescing_on_for_groups_and_fits_the_queue_to_the_mailbox(tmp_path: Path) -> None:
    from actors.placement.hosts.setup import ConfigSetupFactory
    from runtime.config import ConfigError, parse_config

    def setup_of(agent: dict[str, Any], runtime: dict[str, Any] | None = None) -> Any:
        url = f"sqlite:///{tmp_path / 'cfg.db'}"
        cfg = parse_config({"ai": {"agent": agent}, "runtime": runtime or {}, "database": {"url": url}})
        Database(url).create_tables()
        return ConfigSetupFactory(cfg)(GROUP)

    default = setup_of({}).coalesce
    assert (default.groups, default.private, default.max_batch, default.max_queue) == (True, False, 8, 7)
    assert (
        default.enabled_for("group") and default.enabled_for("channel") and not default.enabled_for("private")
    )
    # the host's mailbox (16 by default) counts the running batch: 8 running + 7 waiting fit, 20 would not
    assert setup_of({"coalesce": {"max_queue": 20}}).coalesce.max_queue == 7
    assert setup_of({"coalesce": {"max_queue": 20}}, {"mailbox_size": 64}).coalesce.max_queue == 20
    assert setup_of({"coalesce": {"max_batch": 4}}, {"mailbox_size": 2}).coalesce.max_queue == 1
    with pytest.raises(ConfigError, match="max_batch"):
        parse_config({"ai": {"agent": {"coalesce": {"max_batch": 0}}}})


async def test_a_batch_sees_its_pre_tool_context_before_its_messages(repo: Any) -> None:
    from runtime.session.turn import PreTool

    async def weather(t: TurnInput) -> str:
        return f"sunny for {t.message_id}"

    model, rec = GatedModel({1}), Recorder()
    handle = register_faux_provider(provider="co-pre", default_response=model)
    setup = SessionSetup(
        model=handle.get_model(), coalesce=CoalesceConfig(), pre_tools=[PreTool("weather", weather)]
    )
    core = await SessionCore.open(GROUP, repo, setup, rec, max_concurrent_turns=4)
    first = asyncio.ensure_future(core.submit(turn(GROUP, 1, "a", "q1")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    rest = [asyncio.ensure_future(core.submit(turn(GROUP, s, f"u{s}", f"q{s}"))) for s in (2, 3)]
    await until(lambda: core.status()["queued"] == 2)
    model.gate(1).set()
    await asyncio.wait_for(asyncio.gather(first, *rest), 20)
    prompt, asked, _ = model.calls[1]
    # the pre-tool context (run once, for the batch's first message) precedes the batch's messages,
    # so "the last 2 user messages" of the note are the batch
    assert asked == [
        ("", "Context gathered before this turn:\n[weather] sunny for m2"),
        ("u2", "q2"),
        ("u3", "q3"),
    ]
    assert "the last 2 user messages are one batch" in prompt
    assert rec.jobs[1].reply.mentions() == ["u2", "u3"]

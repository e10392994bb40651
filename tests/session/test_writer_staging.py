"""A turn's records wait for its next write (docs/decisions.md#session-turn-records): real SQLite,
the scripted faux model, a Ray-free SessionCore; the repository's ``append_messages`` counted (and
failed once) by a thin wrapper around the real one."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
from sqlmodel import select

from runtime.llm.types import AgentMessage, CustomMessage, UserMessage
from runtime.memory.tables import AgentSummaryRow
from runtime.session.core import SessionCore
from runtime.session.turn import SessionWriter
from tests.actors.session_scripts import ScriptedSetup
from tests.session.recorder import Recorder
from tests.session.test_hot_chat_coalescing import PRIVATE, GatedModel
from tests.session.test_hot_chat_coalescing import open_core as open_gated
from tests.session.test_hot_chat_coalescing import turn as gated_turn
from tests.session.test_session_core import KEY, open_core, turn


def kinds(messages: list[AgentMessage]) -> list[str]:
    return [m.custom_type if isinstance(m, CustomMessage) else m.role for m in messages]


class CountingStore:
    """The real repository's ``append_messages``, each call's message kinds kept; the next call
    with a message of kind ``fail_on`` raises before it writes."""

    def __init__(self, repo: Any) -> None:
        self.repo = repo
        self.calls: list[list[str]] = []
        self.fail_on: str | None = None

    async def append_messages(self, session_id: str, messages: list[AgentMessage], **kw: Any) -> list[int]:
        if self.fail_on is not None and self.fail_on in kinds(messages):
            self.fail_on = None
            raise OSError("disk gone for a moment")
        self.calls.append(kinds(messages))
        return await self.repo.append_messages(session_id, messages, **kw)

    def check_storable(self, messages: list[AgentMessage]) -> None:
        self.repo.check_storable(messages)


async def test_a_turn_without_tools_writes_its_records_in_its_hand_over_alone(
    repo: Any, tmp_path: Path
) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec, turns=1)
    store = CountingStore(repo)
    core.writer.store = store
    for seq in (1, 2):
        assert (await core.submit(turn(seq, f"echo {seq}"))).outcome == "ok"
    one_turn = ["im_inbound", "user", "assistant", "im_reply"]
    assert store.calls == [one_turn, one_turn]  # one write transaction a turn: its hand-over
    stored = (await repo.load_context(core.session_id)).messages
    assert kinds(stored) == kinds(core.writer.snapshot()) == one_turn * 2
    assert core.writer.staged == 0


async def test_a_tool_call_writes_the_staged_records_before_the_tool_runs(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec, turns=1)
    store = CountingStore(repo)
    core.writer.store = store
    assert (await core.submit(turn(1, "slow 0"))).outcome == "ok"
    assert store.calls[0] == ["im_inbound", "user", "assistant"]  # the call, before its tool ran
    assert [k for call in store.calls for k in call] == kinds(core.writer.snapshot())


async def test_a_failed_write_keeps_the_staged_records_for_the_next_one(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec, turns=1)
    writer = SessionWriter(CountingStore(repo), core.session_id, [])
    store: CountingStore = writer.store
    marker = CustomMessage(custom_type="im_inbound", data={"message_id": "x1"})
    after = await writer.stage([marker])
    assert kinds(after) == ["im_inbound"] and writer.staged == 1
    assert writer.marker("im_inbound", "x1") == 0  # a duplicate check sees it at once
    store.fail_on = "im_reply"
    reply = CustomMessage(custom_type="im_reply", data={"message_id": "x1"})
    with pytest.raises(OSError):
        await writer.append([reply])
    assert kinds(writer.snapshot()) == ["im_inbound"] and writer.staged == 1  # the reply not added
    assert kinds(await writer.append([reply])) == ["im_inbound", "im_reply"]
    assert store.calls == [["im_inbound", "im_reply"]] and writer.staged == 0
    await writer.flush()  # nothing staged: no write
    assert len(store.calls) == 1
    assert kinds((await repo.load_context(core.session_id)).messages) == ["im_inbound", "im_reply"]


async def test_a_failed_turn_writes_its_staged_records_on_its_own(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec, turns=1)
    store = CountingStore(repo)
    core.writer.store = store
    store.fail_on = "im_reply"  # the hand-over fails
    assert (await core.submit(turn(1, "echo hi"))).outcome == "error"
    assert store.calls == [["im_inbound", "user", "assistant"]]  # on its own, the answer with them
    assert core.writer.staged == 0
    assert kinds((await repo.load_context(core.session_id)).messages) == kinds(core.writer.snapshot())


async def test_a_record_that_cannot_be_stored_is_refused_when_staged(repo: Any, tmp_path: Path) -> None:
    """A lone surrogate cannot be stored as JSON: refused by ``stage`` itself, so it never sits
    in front of other turns' writes (each would fail on it)."""
    core = await open_core(repo, tmp_path, Recorder(), turns=1)
    writer = SessionWriter(CountingStore(repo), core.session_id, [])
    with pytest.raises(ValueError, match="cannot be stored as JSON"):
        await writer.stage([UserMessage(content="bad \ud800 text")])
    assert writer.staged == 0 and writer.snapshot() == []
    reply = CustomMessage(custom_type="im_reply", data={"message_id": "x1"})
    assert kinds(await writer.append([reply])) == ["im_reply"]  # the next write is not blocked


async def test_a_stage_during_an_append_in_flight_keeps_sql_order(repo: Any, tmp_path: Path) -> None:
    """An overlapping turn stages while another turn's write is in flight: its records wait for
    that write, so the context's order stays SQL's and nothing is written twice or dropped."""
    core = await open_core(repo, tmp_path, Recorder(), turns=1)
    gate, entered = asyncio.Event(), asyncio.Event()

    class SlowStore(CountingStore):
        async def append_messages(
            self, session_id: str, messages: list[AgentMessage], **kw: Any
        ) -> list[int]:
            entered.set()
            await gate.wait()
            return await super().append_messages(session_id, messages, **kw)

    writer = SessionWriter(SlowStore(repo), core.session_id, [])
    first = CustomMessage(custom_type="im_inbound", data={"message_id": "a"})
    answer = CustomMessage(custom_type="im_reply", data={"message_id": "a"})
    second = CustomMessage(custom_type="im_inbound", data={"message_id": "b"})
    await writer.stage([first])
    write = asyncio.ensure_future(writer.append([answer]))
    await entered.wait()
    staging = asyncio.ensure_future(writer.stage([second]))
    await asyncio.sleep(0)
    assert not staging.done()  # waits for the write in flight
    gate.set()
    await write
    await staging
    assert [m.data["message_id"] for m in writer.snapshot()] == ["a", "a", "b"]
    assert writer.staged == 1
    await writer.flush()
    stored = (await repo.load_context(core.session_id)).messages
    assert [(m.custom_type, m.data["message_id"]) for m in stored] == [  # type: ignore[union-attr]
        ("im_inbound", "a"),
        ("im_reply", "a"),
        ("im_inbound", "b"),
    ]


async def test_a_new_epoch_during_a_turn_keeps_its_question_in_the_old_one(repo: Any) -> None:
    """``/new`` (``archive``) while a turn waits for its model: the turn's staged question is
    written to the epoch it was asked in before the new epoch starts."""
    model = GatedModel({1})
    core = await open_gated(repo, PRIVATE, model, Recorder(), None, "stage-new")
    old = core.session_id
    running = asyncio.ensure_future(core.submit(gated_turn(PRIVATE, 1, "u", "question")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    assert core.writer.staged == 2
    await core.archive()
    model.gate(1).set()
    assert (await asyncio.wait_for(running, 10)).outcome == "ok"
    assert kinds((await repo.load_context(old)).messages) == ["im_inbound", "user"]


async def test_a_summary_reaching_into_a_staged_question_is_stored(repo: Any, tmp_path: Path) -> None:
    """A question longer than the tail compaction keeps: the summary covers its staged records,
    which are written first, so every summary made is stored and anchored
    (docs/decisions.md#memory-compaction)."""

    def made() -> float:
        sample = prometheus_client.REGISTRY.get_sample_value(
            "sessionray_compactions_total", {"outcome": "ok"}
        )
        return sample or 0.0

    setup = ScriptedSetup(str(tmp_path / "markers"))(KEY)
    small = setup.model.model_copy(update={"context_window": 400})
    setup = dataclasses.replace(setup, model=small, compaction_threshold=0.5)
    core = await SessionCore.open(KEY, repo, setup, Recorder(), max_concurrent_turns=1)
    before = made()
    for i in range(1, 13):
        words = "words " * (200 if i == 3 else 20)  # turn 3: more than the kept tail (100 tokens)
        assert (await core.submit(turn(i, f"message {i} {words}"))).outcome == "ok"
    with repo.db.session() as s:
        rows = s.exec(select(AgentSummaryRow).where(AgentSummaryRow.session_id == core.session_id)).all()
    assert made() - before >= 2
    assert len(rows) == made() - before  # every summary made was stored
    assert all(r.anchor_message_id is not None for r in rows)


async def test_a_turn_aborted_during_its_model_call_writes_its_question(repo: Any) -> None:
    """A master's abort while the model thinks, the abort notice switched off: nothing is handed
    over, yet the turn's staged question is written, with the cut-off answer it holds, as it was
    when the question was written before the first LLM call."""
    model, rec = GatedModel({1}), Recorder()
    core = await open_gated(repo, PRIVATE, model, rec, None, "stage-abort")
    core.setup.abort_text = None
    store = CountingStore(repo)
    core.writer.store = store
    running = asyncio.ensure_future(core.submit(gated_turn(PRIVATE, 1, "u", "question")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    assert core.abort() == 1
    model.gate(1).set()  # this model does not watch the signal: its answer comes after the abort
    assert (await asyncio.wait_for(running, 10)).outcome == "aborted" and rec.jobs == []
    assert store.calls == [["im_inbound", "user", "assistant"]] and core.writer.staged == 0
    stored = (await repo.load_context(core.session_id)).messages
    assert kinds(stored) == ["im_inbound", "user", "assistant"]


async def test_a_question_staged_while_new_is_archiving_stays_in_the_old_epoch(repo: Any) -> None:
    """A turn starts while ``/new`` writes the archive: it stages into the old epoch's writer,
    which is written once more after the new writer took over."""
    model = GatedModel({1})
    core = await open_gated(repo, PRIVATE, model, Recorder(), None, "stage-race")
    old = core.session_id
    entered, gate = asyncio.Event(), asyncio.Event()

    class SlowArchive:
        """The real repository; its archive write waits for the test."""

        def __getattr__(self, name: str) -> Any:
            return getattr(repo, name)

        async def archive_session(self, key: str) -> str:
            entered.set()
            await gate.wait()
            return str(await repo.archive_session(key))

    core.repo = SlowArchive()
    archiving = asyncio.ensure_future(core.archive())
    await entered.wait()
    running = asyncio.ensure_future(core.submit(gated_turn(PRIVATE, 1, "u", "question")))
    await asyncio.wait_for(model.started_event(1).wait(), 10)
    gate.set()
    await archiving
    model.gate(1).set()
    assert (await asyncio.wait_for(running, 10)).outcome == "ok"
    assert kinds((await repo.load_context(old)).messages) == ["im_inbound", "user"]

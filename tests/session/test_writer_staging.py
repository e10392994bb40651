"""A turn's records wait for its next write (docs/decisions.md#session-turn-records): real SQLite,
the scripted faux model, a Ray-free SessionCore; the repository's ``append_messages`` counted (and
failed once) by a thin wrapper around the real one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.llm.types import AgentMessage, CustomMessage
from runtime.session.turn import SessionWriter
from tests.session.recorder import Recorder
from tests.session.test_session_core import open_core, turn


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

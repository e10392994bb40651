"""SessionCore without Ray: ordered inbox, overlapping turns with ordered handoff, steer, follow-up,
crash-retry semantics (docs/decisions.md#session-ordered-inbox,
docs/decisions.md#session-crash-recovery). Real SQLite, the scripted faux model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlmodel import select

from runtime.llm.types import AssistantMessage, CustomMessage, TextContent, ToolResultMessage, UserMessage
from runtime.session.core import SessionCore
from runtime.session.turn import ABORT_TEXT, INTERRUPTED_TEXT, TurnInput
from tests.actors.session_scripts import ScriptedSetup
from tests.session.recorder import Recorder

KEY = "onebot11:10001:private:20002"


def turn(seq: int, text: str, *, attempt: int = 0, message_id: str | None = None) -> TurnInput:
    return TurnInput(
        seq=seq,
        session_key=KEY,
        platform="onebot11",
        bot_id="10001",
        message_id=message_id or f"m{seq}",
        scene_type="private",
        scene_id="20002",
        sender={"id": "20002", "name": "Alice", "roles": []},
        text=text,
        time_ms=1_700_000_000_000 + seq,
        attempt=attempt,
    )


async def open_core(repo: Any, tmp_path: Path, rec: Recorder, *, turns: int = 4, **kw: Any) -> SessionCore:
    setup = ScriptedSetup(str(tmp_path / "markers"), **kw)(KEY)
    return await SessionCore.open(KEY, repo, setup, rec, max_concurrent_turns=turns)


async def wait_for(pred: Any, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_turns_start_in_seq_order_whatever_the_arrival_order(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec, turns=1)
    results = await asyncio.gather(
        core.submit(turn(3, "c")), core.submit(turn(1, "a")), core.submit(turn(2, "b"))
    )
    assert [r.outcome for r in results] == ["ok", "ok", "ok"]
    assert rec.texts() == ["re: a", "re: b", "re: c"]
    ctx = await repo.load_context(core.session_id)
    users = [m.content for m in ctx.messages if isinstance(m, UserMessage)]
    assert users == ["a", "b", "c"]
    assert [j.reply_id for j in rec.jobs] == [
        f"{core.session_id}/m1",
        f"{core.session_id}/m2",
        f"{core.session_id}/m3",
    ]


async def test_overlapping_turns_hand_off_in_chat_order(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec, turns=4)
    slow = asyncio.ensure_future(core.submit(turn(1, "slow 0.4")))
    await wait_for(lambda: any((tmp_path / "markers").glob("*.started")))
    fast = await asyncio.wait_for(asyncio.shield(core.submit(turn(2, "echo quick"))), 5)
    assert fast.outcome == "ok"
    assert (await slow).outcome == "ok"
    # turn 2 overlapped turn 1 (it finished its LLM work while the tool slept) yet was handed second
    assert rec.texts() == ["tool: slept 0.4; then: []", "quick"]


async def test_steer_reaches_the_next_llm_call_of_the_latest_turn(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec)
    task = asyncio.ensure_future(core.submit(turn(1, "slow 0.3")))
    await wait_for(lambda: any((tmp_path / "markers").glob("*.started")))
    assert core.steer("also mention the weather", "20002") == "steered"
    assert (await task).outcome == "ok"
    assert rec.texts() == ["tool: slept 0.3; then: ['also mention the weather']"]
    stored = (await repo.load_context(core.session_id)).messages
    steering = [m for m in stored if isinstance(m, UserMessage) and m.content == "also mention the weather"]
    assert steering[0].sender == {"id": "20002", "name": "", "roles": ["master"]}


async def test_follow_up_joins_the_running_turn_or_starts_one(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec)
    task = asyncio.ensure_future(core.submit(turn(1, "slow 0.2")))
    await wait_for(lambda: any((tmp_path / "markers").glob("*.started")))
    assert core.follow_up("and then?", "20002") == "queued"
    await task
    # the follow-up waited for the turn's reply, then ran as a turn of its own with its own reply
    await wait_for(lambda: len(rec.jobs) == 2 and core.idle)
    assert rec.texts() == ["tool: slept 0.2; then: []", "re: and then?"]
    assert core.follow_up("echo standalone", "20002") == "started"
    await wait_for(lambda: len(rec.jobs) == 3 and core.idle)
    assert rec.texts()[2] == "standalone"
    assert [j.reply_to for j in rec.jobs] == ["m1", None, None]


async def test_crash_retry_never_reruns_an_executed_tool(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    first = await open_core(repo, tmp_path, rec)
    doomed = asyncio.ensure_future(first.submit(turn(1, "slow 30")))
    await wait_for(lambda: any((tmp_path / "markers").glob("*.started")))
    # the process "dies": its tasks stop without writing anything more
    for t in list(first._tasks):
        t.cancel()
    doomed.cancel()
    second = await open_core(repo, tmp_path, rec)
    result = await second.submit(turn(1, "slow 30", attempt=1))
    assert result.outcome == "ok"
    assert len(list((tmp_path / "markers").glob("*.started"))) == 1  # the tool ran once
    assert rec.texts() == [f"tool: {INTERRUPTED_TEXT}; then: []"]
    msgs = (await repo.load_context(second.session_id)).messages
    kinds = [m.custom_type if isinstance(m, CustomMessage) else m.role for m in msgs]
    assert kinds == ["im_inbound", "user", "assistant", "toolResult", "assistant", "im_reply"]
    assert isinstance(msgs[3], ToolResultMessage) and msgs[3].is_error
    # a second retry of a finished entry is recognised and sends nothing
    again = await (await open_core(repo, tmp_path, rec)).submit(turn(1, "slow 30", attempt=1))
    assert again.outcome == "already_done"
    assert len(rec.jobs) == 1


async def test_retry_after_the_answer_was_recorded_only_hands_it_off(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec)
    t = turn(1, "hello")
    await core.writer.append(
        [CustomMessage(custom_type="im_inbound", data={"message_id": "m1"}), t.user_message()]
    )
    await core.writer.append([AssistantMessage(content=[TextContent(text=json.dumps({"segments": []}))])])
    fresh = await open_core(repo, tmp_path, rec)
    result = await fresh.submit(t.model_copy(update={"attempt": 1}))
    assert result.outcome == "empty"  # the recorded answer ({"segments": []}) was reused: no LLM call
    assert rec.jobs == []


async def test_a_failed_hand_over_still_records_the_final_answer(repo: Any, tmp_path: Path) -> None:
    # The final answer is written with the reply's marker and ledger row
    # (docs/decisions.md#session-turn-records); when that transaction fails (here the ledger table
    # is gone) the turn ends in error and the answer is recorded alone, after its user message.
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec)
    with repo.db.connection(write=True) as conn:
        conn.execute(text("DROP TABLE delivery_ledger"))
    result = await core.submit(turn(1, "echo kept"))
    assert result.outcome == "error" and "delivery_ledger" in result.error
    assert rec.jobs == []
    stored = (await repo.load_context(core.session_id)).messages
    kinds = [(m.role, getattr(m, "custom_type", None)) for m in stored]
    assert kinds == [("custom", "im_inbound"), ("user", None), ("assistant", None)]
    assert isinstance(stored[-1], AssistantMessage) and "kept" in stored[-1].content[0].text


async def test_run_deferred_task_delivers_its_result_as_a_separate_message(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec)
    result = await core.submit(turn(1, "defer square 7"))
    started = "started deferred task square; its result will be sent to the chat as a separate message"
    assert (result.outcome, result.preview) == ("ok", f"tool: {started}; then: []")
    await wait_for(lambda: len(rec.jobs) == 2 and core.idle)
    deferred = rec.jobs[1]
    assert deferred.reply.preview_text().startswith("square of 7 is 49 (pid ")
    assert deferred.reply_id.startswith(f"{core.session_id}/deferred/call-")
    assert deferred.reply_to is None
    msgs = (await repo.load_context(core.session_id)).messages
    assert isinstance(msgs[-1], CustomMessage) and msgs[-1].custom_type == "deferred_result"
    assert msgs[-1].data["task"] == "square"


async def test_a_sub_agent_turn_runs_without_the_im_preset(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec)
    await core.submit(turn(1, "delegate echo from the helper"))
    # the helper answered in plain text (no reply JSON: the IM contract is not inherited)
    assert rec.texts() == ["tool: from the helper; then: []"]


def abort_reasons(messages: list[Any]) -> list[str | None]:
    return [
        m.error_message for m in messages if isinstance(m, AssistantMessage) and m.stop_reason == "aborted"
    ]


async def test_a_masters_abort_stops_the_turn_and_sends_only_the_fixed_notice(
    repo: Any, tmp_path: Path
) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec)
    task = asyncio.ensure_future(core.submit(turn(1, "slow 30")))
    await wait_for(lambda: any((tmp_path / "markers").glob("*.started")))
    assert core.abort() == 1
    result = await asyncio.wait_for(task, 10)
    # the chat is told, in the host's words; nothing of the cut-off answer is sent
    assert (result.outcome, rec.texts()) == ("aborted", [ABORT_TEXT])
    assert rec.jobs[0].reply_to == "m1" and result.reply_id == rec.jobs[0].reply_id
    msgs = (await repo.load_context(core.session_id)).messages
    assert abort_reasons(msgs) == ["aborted by a master"]
    # the context stays valid: the next message gets a normal turn
    assert (await core.submit(turn(2, "hello again"))).outcome == "ok"
    assert rec.texts() == [ABORT_TEXT, "re: hello again"]


async def test_an_abort_notice_switched_off_sends_nothing(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    setup = ScriptedSetup(str(tmp_path / "markers"))(KEY)
    setup.abort_text = None
    core = await SessionCore.open(KEY, repo, setup, rec, max_concurrent_turns=4)
    task = asyncio.ensure_future(core.submit(turn(1, "slow 30")))
    await wait_for(lambda: any((tmp_path / "markers").glob("*.started")))
    assert core.abort() == 1
    assert ((await asyncio.wait_for(task, 10)).outcome, rec.jobs) == ("aborted", [])


async def test_a_shutdown_close_says_why_and_sends_nothing(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec)
    task = asyncio.ensure_future(core.submit(turn(1, "slow 30")))
    await wait_for(lambda: any((tmp_path / "markers").glob("*.started")))
    await core.close(10, "the shutdown")
    result = await asyncio.wait_for(task, 10)
    assert (result.outcome, rec.jobs) == ("error", [])  # replayed from the inbox, not answered now
    msgs = (await repo.load_context(core.session_id)).messages
    assert abort_reasons(msgs) == ["aborted by the shutdown"]


async def test_pre_executable_tools_run_before_the_turn_and_are_recorded(repo: Any, tmp_path: Path) -> None:
    from runtime.session.turn import PreTool

    rec = Recorder()
    setup = ScriptedSetup(str(tmp_path / "markers"))(KEY)

    async def weather(t: TurnInput) -> str:
        return f"sunny for {t.sender['name']}"

    async def broken(t: TurnInput) -> str:
        raise OSError("service down")

    setup.pre_tools = [PreTool("weather", weather), PreTool("news", broken)]
    core = await SessionCore.open(KEY, repo, setup, rec, max_concurrent_turns=4)
    await core.submit(turn(1, "hi"))
    msgs = (await repo.load_context(core.session_id)).messages
    pre = [m for m in msgs if isinstance(m, CustomMessage) and m.custom_type == "pre_tool_results"]
    assert pre[0].data == {"results": {"weather": "sunny for Alice", "news": "error: service down"}}
    from runtime.session.turn_agent import convert_for_session

    shown = convert_for_session("private")(list(msgs))
    assert shown[0] == UserMessage(
        content="Context gathered before this turn:\n[weather] sunny for Alice\n[news] error: service down",
        timestamp=pre[0].timestamp,
    )


async def test_archive_starts_an_empty_epoch(repo: Any, tmp_path: Path) -> None:
    rec = Recorder()
    core = await open_core(repo, tmp_path, rec)
    await core.submit(turn(1, "remember me"))
    old = core.session_id
    new = await core.archive()
    assert (old, new) == (f"{KEY}#1", f"{KEY}#2")
    await core.submit(turn(2, "who am I"))
    users = [m.content for m in (await repo.load_context(new)).messages if isinstance(m, UserMessage)]
    assert users == ["who am I"]


async def test_long_session_is_compacted_into_a_summary_and_keeps_answering(
    repo: Any, tmp_path: Path
) -> None:
    """Compaction (docs/decisions.md#memory-compaction) wired into session turns: above the
    threshold older messages are summarized into agent_summaries (anchored), the loaded context is
    summary + tail, and no message is deleted."""
    import dataclasses

    from runtime.memory.tables import AgentSummaryRow

    rec = Recorder()
    setup = ScriptedSetup(str(tmp_path / "markers"))(KEY)
    small = setup.model.model_copy(update={"context_window": 400})
    setup = dataclasses.replace(setup, model=small, compaction_threshold=0.5)
    core = await SessionCore.open(KEY, repo, setup, rec, max_concurrent_turns=1)
    for i in range(1, 9):
        assert (await core.submit(turn(i, f"message number {i} " + "words " * 40))).outcome == "ok"
    assert rec.texts()[-1].startswith("re: message number 8")
    with repo.db.session() as s:
        from sqlmodel import select

        summaries = s.exec(select(AgentSummaryRow).where(AgentSummaryRow.session_id == core.session_id)).all()
    assert summaries and all(r.anchor_message_id is not None for r in summaries)
    assert await repo.count_messages(core.session_id) >= 8 * 2  # nothing deleted
    ctx = await repo.load_context(core.session_id)
    users = [m.content for m in ctx.messages if isinstance(m, UserMessage)]
    assert len(users) < 8 and str(users[-1]).startswith("message number 8")


async def test_a_turn_converts_only_the_context_it_has_not_converted_and_sends_all_of_it(
    repo: Any, tmp_path: Path
) -> None:
    """docs/decisions.md#agent-incremental-convert: across turns (one with a tool call), each LLM
    call's messages are what a full conversion of the visible context gives, and each message
    is converted once."""
    from runtime.agent.replay import IncrementalConvert, prepare_replay
    from runtime.session.turn_agent import convert_for_session

    rec = Recorder()
    core = await open_core(repo, tmp_path, rec, turns=1)
    view, checked = IncrementalConvert(convert_for_session("private")), []

    def spy(messages: list[Any]) -> Any:
        out = view(messages)
        expected = prepare_replay(convert_for_session("private")(messages))
        checked.append(
            [m.model_dump(exclude={"timestamp"}) for m in out]
            == [m.model_dump(exclude={"timestamp"}) for m in expected]
        )
        return out

    core._llm_view = spy  # type: ignore[assignment]
    for seq, said in enumerate(["echo one", "slow 0.01", "echo two", "echo three"], 1):
        assert (await core.submit(turn(seq, said))).outcome == "ok"
    assert rec.texts() == ["one", "tool: slept 0.01; then: []", "two", "three"]
    assert checked == [True] * 5  # the tool turn made two calls
    # every message the calls saw was converted once: the context less the last call's answer
    assert view.converted == len(core.writer) - 2  # (the last answer and its reply marker)
    # the reply identity too read each message once (all but the last reply marker)
    assert core._identity_fold._growth.taken == len(core.writer) - 1


async def test_the_writer_finds_markers_without_a_scan_and_agrees_with_one(repo: Any, tmp_path: Path) -> None:
    from runtime.session.turn import INBOUND_MARKER, REPLY_MARKER, SessionWriter, find_marker

    rec = Recorder()
    core = await open_core(repo, tmp_path, rec, turns=1)
    for seq in (1, 2, 3):
        await core.submit(turn(seq, f"echo {seq}"))
    await core.submit(turn(4, "echo again", message_id="m2"))  # a second turn of one message id
    writer, context = core.writer, core.writer.snapshot()
    for kind in (INBOUND_MARKER, REPLY_MARKER):
        for mid in ("m1", "m2", "m3", "m9"):
            assert writer.marker(kind, mid) == find_marker(context, kind, mid)
    assert writer.marker(INBOUND_MARKER, "m2") == max(
        i for i, m in enumerate(context) if isinstance(m, CustomMessage) and m.data.get("message_id") == "m2"
        and m.custom_type == INBOUND_MARKER
    )  # fmt: skip
    reloaded = SessionWriter(repo, core.session_id, list((await repo.load_context(core.session_id)).messages))
    assert reloaded.marker(REPLY_MARKER, "m3") == writer.marker(REPLY_MARKER, "m3") is not None


async def test_a_live_session_does_not_summarize_its_history_again_in_every_turn(repo: Any) -> None:
    """docs/decisions.md#memory-compaction: the session keeps its compaction hook (and so the
    summary it made) across turns. A hook made per turn saw the whole live context again, still
    over the threshold, and summarized it once more in every later turn."""
    from providers.faux import faux_assistant_message, faux_text, register_faux_provider
    from runtime.llm.types import Context
    from runtime.memory.tables import AgentSummaryRow
    from runtime.session.turn import SessionSetup

    def respond(context: Context, options: Any) -> AssistantMessage:
        last = context.messages[-1]
        said = last.content if isinstance(last.content, str) else last.content[0].text  # type: ignore[union-attr]
        if said.startswith("Summarize this conversation"):  # a summarizer keeps to its budget
            return faux_assistant_message([faux_text("They talked about numbered messages.")])
        reply = {"segments": [{"type": "text", "data": {"text": "ok"}}]}
        return faux_assistant_message([faux_text(json.dumps(reply))])

    faux = register_faux_provider(provider="compacting", models=["m"], default_response=respond)
    model = faux.get_model("m").model_copy(update={"context_window": 4000})  # compacts above 3,200
    core = await SessionCore.open(
        KEY, repo, SessionSetup(model=model, compaction_threshold=0.8), Recorder(), max_concurrent_turns=1
    )
    counts = []
    for i in range(1, 31):
        assert (await core.submit(turn(i, f"message number {i} " + "words " * 40))).outcome == "ok"
        with repo.db.session() as s:
            rows = s.exec(select(AgentSummaryRow).where(AgentSummaryRow.session_id == core.session_id)).all()
        counts.append(len(rows))
    first = counts.index(1)  # ≈ 3,200 tokens at ≈ 150 a turn: about the 21st turn
    # after it the summary and a quarter of the window (≈ 1,000 tokens) are sent: the next
    # compaction is ≈ 2,200 tokens (about 14 turns) away, not in the next turn
    assert 15 <= first <= 25 and counts[first : first + 8] == [1] * 8, counts


async def test_a_budget_of_null_everywhere_sends_all_and_keeps_the_conversion(
    repo: Any, tmp_path: Path
) -> None:
    """The configured sessions always carry a budget policy; one with no budget for any model
    chooses no window, so its turns keep their conversion (docs/decisions.md#agent-incremental-convert)."""
    import dataclasses

    from runtime.agent.context_budget import BudgetPolicy

    rec = Recorder()
    setup = ScriptedSetup(str(tmp_path / "markers"))(KEY)
    unlimited = dataclasses.replace(setup, context_budget=BudgetPolicy(None, {"script/script-model": None}))
    core = await SessionCore.open(KEY, repo, unlimited, rec, max_concurrent_turns=1)
    for seq in (1, 2, 3):
        assert (await core.submit(turn(seq, f"echo {seq}"))).outcome == "ok"
    assert core._llm_view is not None and core._llm_view.converted == len(core.writer) - 2
    other = "onebot11:10001:private:30003"
    windowed = dataclasses.replace(setup, context_budget=BudgetPolicy(8000))
    budgeted = await SessionCore.open(other, repo, windowed, rec, max_concurrent_turns=1)
    await budgeted.submit(turn(1, "echo windowed").model_copy(update={"session_key": other}))
    assert budgeted._llm_view is None  # a window per call: converted afresh, none kept

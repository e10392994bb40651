"""Compaction as a transform_context hook: tool pairs kept together, summary stored with its
anchor, failing summarizers keep the full context (docs/decisions.md#memory-compaction)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import prometheus_client
import pytest

from providers.faux import FauxProviderHandle, faux_assistant_message, register_faux_provider
from runtime.llm.tokens import estimate_tokens
from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    Context,
    CustomMessage,
    Model,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from runtime.memory import ContextRepository, Database, make_compaction_hook, summary_message
from runtime.memory.compaction import find_cut, is_summary

KEY = "console:bot:private:alice"


def counter(outcome: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value("sessionray_compactions_total", {"outcome": outcome})
    return value or 0.0


@pytest.fixture
def faux() -> Iterator[FauxProviderHandle]:
    handle = register_faux_provider(
        provider="memfaux", models=[Model(id="small", api="faux", context_window=1000, max_tokens=200)]
    )
    yield handle
    handle.unregister()


def conversation() -> list[AgentMessage]:
    """~552 estimated tokens: 0 user, 1 assistant+call c1, 2 result c1, 3 assistant, 4 user,
    5 assistant+call c2, 6 result c2, 7 assistant."""
    return [
        UserMessage(content="A" * 400, timestamp=1),
        AssistantMessage(
            content=[TextContent(text="calling"), ToolCall(id="c1", name="lookup", arguments={"q": "x"})],
            stop_reason="toolUse",
            timestamp=2,
        ),
        ToolResultMessage(
            tool_call_id="c1", tool_name="lookup", content=[TextContent(text="R" * 400)], timestamp=3
        ),
        AssistantMessage(content=[TextContent(text="B" * 400)], timestamp=4),
        UserMessage(content="C" * 400, timestamp=5),
        AssistantMessage(
            content=[ToolCall(id="c2", name="lookup", arguments={"q": "y"})],
            stop_reason="toolUse",
            timestamp=6,
        ),
        ToolResultMessage(
            tool_call_id="c2", tool_name="lookup", content=[TextContent(text="S" * 400)], timestamp=7
        ),
        AssistantMessage(content=[TextContent(text="D" * 40)], timestamp=8),
    ]


def test_cut_never_splits_a_tool_call_from_its_result() -> None:
    msgs = conversation()
    # by tokens alone the tail would start at the result of c2 (index 6); the cut moves to its call
    assert find_cut(msgs, 110) == 5
    assert find_cut(msgs, 10) == 7
    assert find_cut(msgs, 230) == 4
    # a tail that would start at the result of c1 moves to the call at 1
    assert find_cut(msgs[:3], 50) == 1
    # over budget with a large keep: still the smallest valid head
    assert find_cut(msgs, 5000) == 1
    assert find_cut(msgs[:1], 10) is None  # nothing can be summarized
    assert find_cut([summary_message("s", 1, 0), msgs[0]], 10) is None  # only the old summary


async def test_compaction_summarizes_head_stores_anchor_and_keeps_tool_pairs(
    db: Database, faux: FauxProviderHandle
) -> None:
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    ids = await repo.append_messages(sid, conversation())
    ctx = await repo.load_context(sid)
    seen: list[Context] = []

    def summarizer(context: Context, _options: Any) -> AssistantMessage:
        seen.append(context)
        return faux_assistant_message("SUMMARY-1")

    faux.set_responses([summarizer])
    hook = make_compaction_hook(repo, sid, faux.get_model(), threshold=0.5, keep_recent_tokens=110)
    before = counter("ok")
    out = await hook(list(ctx.messages), None)
    tail = conversation()[5:]
    assert len(out) == 4 and out[1:] == tail
    assert isinstance(out[0], CustomMessage)
    assert out[0].data == {"summary": "SUMMARY-1", "anchor_message_id": ids[4]}
    assert counter("ok") == before + 1
    # the summarizer saw the head (messages 0-4) and nothing of the tail
    prompt = seen[0].messages[0]
    assert isinstance(prompt, UserMessage) and isinstance(prompt.content, str)
    assert prompt.content.startswith("Summarize this conversation:\n\n[user]\n" + "A" * 400)
    assert '(calls tool lookup {"q": "x"})' in prompt.content and "C" * 400 in prompt.content
    assert "S" * 400 not in prompt.content and '{"q": "y"}' not in prompt.content

    # the next load gives summary + tail; nothing was deleted
    again = await repo.load_context(sid)
    assert again.messages[1:] == tail
    assert again.messages[0] == summary_message("SUMMARY-1", ids[4], again.messages[0].timestamp)
    assert await repo.count_messages(sid) == 8

    # a later LLM call of the same turn reuses the summary without calling the model
    calls = faux.call_count
    assert await hook([*ctx.messages, UserMessage(content="more", timestamp=9)], None) == [
        out[0],
        *tail,
        UserMessage(content="more", timestamp=9),
    ]
    assert faux.call_count == calls

    # a new turn that grows past the budget again folds the earlier summary into the next one
    extra = [
        UserMessage(content="E" * 1600, timestamp=10),
        AssistantMessage(content=[TextContent(text="ok")]),
    ]
    await repo.append_messages(sid, extra)
    loaded = await repo.load_context(sid)
    faux.set_responses([summarizer])
    hook2 = make_compaction_hook(repo, sid, faux.get_model(), threshold=0.5, keep_recent_tokens=10)
    out2 = await hook2(list(loaded.messages), None)
    assert out2[1:] == extra
    assert out2[0].data == {"summary": "SUMMARY-1", "anchor_message_id": ids[7]}  # type: ignore[union-attr]
    second_prompt = seen[1].messages[0]
    assert isinstance(second_prompt, UserMessage) and isinstance(second_prompt.content, str)
    assert second_prompt.content.startswith("Summarize this conversation:\n\n[earlier summary]\nSUMMARY-1")
    final = await repo.load_context(sid)
    assert final.messages[1:] == extra
    assert final.messages[0].data["anchor_message_id"] == ids[7]  # type: ignore[union-attr]


@pytest.mark.parametrize("failure", ["error_reply", "empty_reply", "unknown_api"])
async def test_failing_summarizer_keeps_full_context(
    db: Database, faux: FauxProviderHandle, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    await repo.append_messages(sid, conversation())
    ctx = await repo.load_context(sid)
    model = faux.get_model()
    if failure == "error_reply":
        faux.set_responses([faux_assistant_message([], "error", error_message="rate limited")])
    elif failure == "empty_reply":
        faux.set_responses([faux_assistant_message("   ")])
    else:
        model = model.model_copy(update={"api": "no-such-api"})
    hook = make_compaction_hook(
        repo, sid, faux.get_model(), threshold=0.5, keep_recent_tokens=110, summary_model=model
    )
    before = counter("failed")
    with caplog.at_level(logging.WARNING, logger="runtime.memory.compaction"):
        out = await hook(list(ctx.messages), None)
    assert out == conversation()
    assert counter("failed") == before + 1
    assert any("failed, keeping the full context" in r.getMessage() for r in caplog.records)
    assert await repo.load_context(sid) == Context(messages=conversation())
    assert await repo.count_messages(sid) == 8


async def test_within_budget_is_untouched(db: Database, faux: FauxProviderHandle) -> None:
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    hook = make_compaction_hook(repo, sid, faux.get_model(), threshold=0.9)
    msgs = conversation()[:4]
    assert await hook(msgs, None) == msgs
    assert faux.call_count == 0


async def test_summary_reaching_into_unstored_messages_is_used_but_not_stored(
    db: Database, faux: FauxProviderHandle, caplog: pytest.LogCaptureFixture
) -> None:
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    msgs = conversation()
    await repo.append_messages(sid, msgs[:2])  # the rest is this turn's, not appended yet
    faux.set_responses([faux_assistant_message("IN-MEMORY")])
    hook = make_compaction_hook(repo, sid, faux.get_model(), threshold=0.5, keep_recent_tokens=110)
    with caplog.at_level(logging.WARNING, logger="runtime.memory.compaction"):
        out = await hook(msgs, None)
    assert out[1:] == msgs[5:]
    assert out[0].data == {"summary": "IN-MEMORY", "anchor_message_id": None}  # type: ignore[union-attr]
    assert any("not stored yet" in r.getMessage() for r in caplog.records)
    assert await repo.load_context(sid) == Context(messages=msgs[:2])


async def test_live_messages_with_unserializable_details_still_anchor(
    db: Database, faux: FauxProviderHandle
) -> None:
    """A live tool result whose ``details`` JSON cannot hold (stored as repr) still matches its
    stored row, so the summary is stored with its anchor instead of crashing the hook."""

    class Handle:
        def __repr__(self) -> str:
            return "Handle()"

    live = conversation()
    live[2] = live[2].model_copy(update={"details": {"h": Handle(), "tags": {"a"}}})
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    ids = await repo.append_messages(sid, live)
    faux.set_responses([faux_assistant_message("SUMMARY-H")])
    hook = make_compaction_hook(repo, sid, faux.get_model(), threshold=0.5, keep_recent_tokens=110)
    out = await hook(list(live), None)
    assert out[1:] == live[5:]
    assert out[0].data == {"summary": "SUMMARY-H", "anchor_message_id": ids[4]}  # type: ignore[union-attr]
    stored = (await repo.load_context(sid)).messages
    assert stored[0].data["anchor_message_id"] == ids[4]  # type: ignore[union-attr]


async def test_a_kept_hook_estimates_only_new_messages_and_decides_as_a_full_estimate_would(
    db: Database, faux: FauxProviderHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/decisions.md#agent-incremental-convert: the hook a session keeps sums the estimate of
    each message once, and compares the covered head by identity, not by JSON, while it is the
    same live context."""
    import runtime.memory.compaction as compaction

    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    faux.set_responses([faux_assistant_message("SUMMARY-1")])
    hook = make_compaction_hook(repo, sid, faux.get_model(), threshold=0.5, keep_recent_tokens=110)
    estimated: list[int] = []
    real = compaction.estimate_tokens
    monkeypatch.setattr(
        compaction, "estimate_tokens", lambda ms, **kw: estimated.append(len(ms)) or real(ms, **kw)
    )
    dumps: list[AgentMessage] = []
    monkeypatch.setattr(compaction, "_dump", lambda m: dumps.append(m) or compaction.message_json(m))

    context: list[AgentMessage] = []
    first, dumped, covered = None, 0, 0
    summary: AgentMessage | None = None
    later = [UserMessage(content=f"F{i}" * 20, timestamp=9 + i) for i in range(6)]
    for i, m in enumerate([*conversation(), *later]):
        await repo.append_messages(sid, [m])
        context.append(m)
        over = real(context) > hook.budget_tokens
        out = await hook(list(context), None)
        if first is None and not over:
            assert out == context  # within the budget: untouched, as a full estimate decides
        elif first is None:
            first, dumped = i, len(dumps)  # compacted where the full estimate first exceeds
            assert isinstance(out[0], CustomMessage) and faux.call_count == 1
        else:  # the summary reused; the head compared by identity: no JSON written again
            assert out[0] is summary and out[1:] == context[covered:] and len(dumps) == dumped
        if first == i:
            summary, covered = out[0], len(context) - (len(out) - 1)
    assert first is not None and faux.call_count == 1
    # each message estimated once, not the whole context at every call (quadratic: 120 here)
    assert sum(estimated) <= 2 * len(context) + 4, estimated


def _said(tag: str) -> AssistantMessage:
    return AssistantMessage(content=[TextContent(text=tag + "." * 196)])


def _asked(tag: str) -> UserMessage:
    return UserMessage(content=tag + "." * 196)


@pytest.mark.parametrize(
    ("steps", "b_every", "b_inbound"),
    [(40, 1, 196), (80, 4, 2400), (200, 40, 2400)],
    ids=["alternating", "b-summarizes-the-shared-head", "a-compacts-often-between-b-calls"],
)
async def test_overlapping_turns_sharing_the_hook_summarize_no_more_than_with_a_hook_each(
    db: Database, faux: FauxProviderHandle, steps: int, b_every: int, b_inbound: int
) -> None:
    """Turns of one session overlap and see different lists (each without the others' records in
    flight). The epoch's hook keeps a summary per list and uses the longest that fits, so neither
    turn makes the other summarize again, nor sends what its own summary covers: no more summaries
    and no more tokens than with a hook per turn."""
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    model = faux.get_model().model_copy(update={"context_window": 1000})

    async def run(shared: bool) -> tuple[int, int]:
        before = faux.call_count
        faux.set_responses([faux_assistant_message("S")] * 400)

        def hook() -> Any:
            return make_compaction_hook(repo, sid, model, threshold=0.8, keep_recent_tokens=150)

        first = hook()
        second = first if shared else hook()
        base = [m for i in range(5) for m in (_asked(f"U{i}"), _said(f"A{i}"))]
        a_list, b_list, sent = [*base, _asked("A-in")], None, 0
        for step in range(steps):
            a_list = [*a_list, _said(f"a{step}")]  # turn A: a long turn of tool calls
            sent += estimate_tokens(await first(a_list, None))
            if step == 3:  # B sees the shared history, not A's records in flight
                b_list = [*base, UserMessage(content="B-in" + "x" * b_inbound)]
            if b_list is not None and step % b_every == 0:
                b_list = [*b_list, _said(f"b{step}")]
                sent += estimate_tokens(await second(b_list, None))
        return faux.call_count - before, sent

    per_turn = await run(shared=False)
    shared = await run(shared=True)
    assert per_turn[0] > 0 and shared[0] <= per_turn[0] and shared[1] <= per_turn[1], (shared, per_turn)


async def test_a_summary_finished_while_another_was_made_covers_what_it_read(
    db: Database, faux: FauxProviderHandle
) -> None:
    """Two turns summarize at once on the shared hook; the one finishing last replaces only the
    head it summarized: every message of its list is in its summary or in its next view."""
    import asyncio

    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    model = faux.get_model().model_copy(update={"context_window": 1000})
    hook = make_compaction_hook(repo, sid, model, threshold=0.5, keep_recent_tokens=100)
    gate, prompts = asyncio.Event(), []

    async def summarizer(context: Context, _options: Any) -> AssistantMessage:
        text = str(context.messages[0].content)
        prompts.append(text)
        if "a0." in text:  # turn A's summary waits until B's is made
            await gate.wait()
        return faux_assistant_message(f"summary {len(prompts)}")

    faux.set_responses([summarizer] * 3)
    base = [m for i in range(6) for m in (_asked(f"U{i}"), _said(f"A{i}"))]
    await hook(base, None)  # a first summary
    a_list = [*base, *[_asked(f"a{i}") for i in range(8)]]
    b_list = [*base, *[_asked(f"b{i}") for i in range(9)]]
    a_task = asyncio.ensure_future(hook(a_list, None))
    await asyncio.sleep(0)
    await hook(b_list, None)
    gate.set()
    await a_task
    nxt = [*a_list, _asked("zz")]
    view = await hook(nxt, None)
    a_prompt = next(p for p in prompts if "a0." in p)
    for m in nxt:
        tag = str(m.content)[:3] if isinstance(m, UserMessage) else m.content[0].text[:3]  # type: ignore[union-attr]
        assert m in view[1:] or tag in a_prompt or tag.startswith(("U", "A")), tag
    assert view[1:] == nxt[len(nxt) - (len(view) - 1) :]  # a tail of the list, after the summary


async def test_a_failed_settle_keeps_the_summary_for_the_call(
    db: Database, faux: FauxProviderHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """``settle`` (the session writing what it holds back) fails: the summary is still used for
    this call, like any summary whose head could not be matched to stored rows, and the failure
    is logged."""
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    model = faux.get_model().model_copy(update={"context_window": 1000})
    faux.set_responses([faux_assistant_message("the summary")])

    async def settle() -> None:
        raise OSError("the database went away")

    hook = make_compaction_hook(repo, sid, model, threshold=0.3, keep_recent_tokens=100, settle=settle)
    view = await hook(conversation(), None)
    assert is_summary(view[0]) and "the summary" in str(view[0].data)  # type: ignore[union-attr]
    assert len(view) < len(conversation()) + 1
    assert "writing the staged records failed" in caplog.text

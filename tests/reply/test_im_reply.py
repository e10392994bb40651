"""The IM reply contract: strict Reply validation, one format-correction call, the fixed failure
message, mention identity, plain-text mode, the agent-loop integration and the preview gate
(docs/decisions.md#reply-segments, docs/decisions.md#reply-one-correction). The faux model is
scripted to misbehave."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from providers.faux import faux_assistant_message, faux_text, faux_thinking, faux_tool_call
from runtime import AbortController, AssistantMessage, ToolResultMessage, UserMessage
from runtime.agent.config import AgentContext, AgentLoopConfig
from runtime.agent.events import AgentEndEvent, MessageEndEvent
from runtime.agent.loop import agent_loop
from runtime.agent.replay import default_convert_to_llm
from runtime.agent.tools import AgentTool, AgentToolResult
from runtime.reply.im_reply import (
    CORRECTION_SYSTEM_PROMPT,
    IM_INSTRUCTIONS,
    ImReplyConfig,
    ImReplyContract,
    MentionIdentity,
    ReplyOutcome,
    ReplyPreview,
)
from runtime.reply.json_schema import inline_json_schema_refs
from runtime.reply.segments import (
    SEGMENT_TYPES,
    AudioSegment,
    DiceSegment,
    FaceData,
    FaceSegment,
    FileSegment,
    ForwardData,
    ForwardSegment,
    ImageSegment,
    MarkdownSegment,
    MentionSegment,
    Reply,
    ReplyData,
    ReplySegment,
    RpsSegment,
    ShareData,
    ShareSegment,
    TextSegment,
    VideoSegment,
)

FAIL = "Sorry, the reply could not be produced."
SENDER = "1234567890123456789"  # a 19-digit platform id

ALL_TYPES = {
    "segments": [
        {"type": "markdown", "data": {"content": "**结果**\n```py\nprint('x')\n```"}},
        {"type": "text", "data": {"text": "请 "}},
        {"type": "mention", "data": {"target": SENDER}},
        {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.com/r.png"}}},
        {"type": "audio", "data": {"media": {"kind": "path", "value": "a.mp3"}}},
        {"type": "video", "data": {"media": {"kind": "base64", "value": "AAAA"}}},
        {"type": "file", "data": {"media": {"kind": "file", "value": "platform-ref-1"}}},
        {"type": "reply", "data": {"message_id": "m-1"}},
        {"type": "forward", "data": {"forward_id": "f-1"}},
        {"type": "face", "data": {"id": 14}},
        {"type": "face", "data": {"id": "smile"}},
        {"type": "dice", "data": {}},
        {"type": "rps", "data": {}},
        {"type": "share", "data": {"url": "https://example.com", "title": "Example"}},
    ]
}
ALL_TYPES_REPLY = Reply(
    segments=[
        MarkdownSegment.of("**结果**\n```py\nprint('x')\n```"),
        TextSegment.of("请 "),
        MentionSegment.of(SENDER),
        ImageSegment.of("url", "https://example.com/r.png"),
        AudioSegment.of("path", "a.mp3"),
        VideoSegment.of("base64", "AAAA"),
        FileSegment.of("file", "platform-ref-1"),
        ReplySegment(data=ReplyData(message_id="m-1")),
        ForwardSegment(data=ForwardData(forward_id="f-1")),
        FaceSegment(data=FaceData(id=14)),
        FaceSegment(data=FaceData(id="smile")),
        DiceSegment.of(),
        RpsSegment.of(),
        ShareSegment(data=ShareData(url="https://example.com", title="Example")),
    ]
)
GOOD = {
    "segments": [{"type": "text", "data": {"text": "好的 "}}, {"type": "mention", "data": {"target": SENDER}}]
}
GOOD_REPLY = Reply(segments=[TextSegment.of("好的 "), MentionSegment.of(SENDER)])


def msg(text: str, stop: Any = "stop") -> AssistantMessage:
    return faux_assistant_message([faux_text(text)], stop)


def identity() -> MentionIdentity:
    return MentionIdentity(sender_id=SENDER)


def contract(faux: Any, cache: Any, **cfg: Any) -> ImReplyContract:
    return ImReplyContract(faux.get_model(), config=ImReplyConfig(failure_text=FAIL, **cfg), cache=cache)


# --------------------------------------------------------------------------- schema + validation


def test_reply_schema_is_strict_provider_shaped() -> None:
    schema = Reply.model_json_schema()
    assert schema["required"] == ["segments"] and schema["additionalProperties"] is False
    items = schema["properties"]["segments"]["items"]
    assert "discriminator" not in items and len(items["anyOf"]) == len(SEGMENT_TYPES) == 13
    for name, d in schema["$defs"].items():
        assert d["additionalProperties"] is False, name
        assert d["required"] == list(d["properties"]), name
        assert all("default" not in p for p in d["properties"].values()), name
    assert schema["$defs"]["Media"]["properties"]["kind"] == {
        "enum": ["url", "path", "base64", "file"],
        "title": "Kind",
        "type": "string",
    }
    assert schema["$defs"]["FaceData"]["properties"]["id"]["anyOf"] == [
        {"type": "string"},
        {"type": "integer"},
    ]


def test_schema_inlined_for_ref_less_providers() -> None:
    inlined = inline_json_schema_refs(Reply.model_json_schema())
    text = json.dumps(inlined)
    assert "$ref" not in text and "$defs" not in text and '"const"' not in text
    first = inlined["properties"]["segments"]["items"]["anyOf"][0]
    assert first["properties"]["type"] == {"enum": ["text"], "title": "Type", "type": "string"}
    assert first["properties"]["data"]["properties"] == {"text": {"title": "Text", "type": "string"}}


def test_every_segment_type_validates_whole() -> None:
    assert Reply.model_validate_json(json.dumps(ALL_TYPES)) == ALL_TYPES_REPLY
    assert json.loads(ALL_TYPES_REPLY.model_dump_json()) == ALL_TYPES
    assert sorted({s.type for s in ALL_TYPES_REPLY.segments}) == sorted(SEGMENT_TYPES)


@pytest.mark.parametrize(
    ("raw", "loc"),
    [
        (
            '{"segments":[{"type":"mention","data":{"target":1234567890123456789}}]}',
            "segments.0.mention.data.target",
        ),
        ('{"segments":[{"type":"text","data":{"text":"a"}},{"type":"dice"}]}', "segments.1.dice.data"),
        ('{"segments":[{"type":"text","data":{"text":"a","bold":true}}]}', "segments.0.text.data.bold"),
        ('{"segments":[{"type":"sticker","data":{}}]}', "segments.0"),
        ('{"segments":[{"type":"face","data":{"id":true}}]}', "segments.0.face.data.id.str"),
        ('{"segments":[],"extra":1}', "extra"),
        ('```json\n{"segments":[]}\n```', ""),
        ('Here you go: {"segments":[]}', ""),
    ],
)
def test_strict_validation_rejects(raw: str, loc: str) -> None:
    with pytest.raises(ValidationError) as info:
        Reply.model_validate_json(raw)
    assert ".".join(str(p) for p in info.value.errors()[0]["loc"]) == loc


# --------------------------------------------------------------------------- finalize


async def test_valid_reply_of_every_type_first_try(faux, cache, deltas) -> None:
    out = await contract(faux, cache).finalize(msg(json.dumps(ALL_TYPES)), identity())
    assert (out.reply, out.tier, out.outcome, out.reason, out.calls) == (
        ALL_TYPES_REPLY,
        "native",
        "first_try",
        None,
        0,
    )
    assert faux.call_count == 0
    assert deltas.structured() == {("native", "first_try"): 1}


async def test_empty_segments_sends_nothing(faux, cache, deltas) -> None:
    published: list[str] = []
    out = await contract(faux, cache).finalize(msg('{"segments": []}'), identity())
    await ReplyPreview(published.append).release(out)
    assert (out.reply, out.outcome, out.reply.is_empty(), published) == (
        Reply(segments=[]),
        "first_try",
        True,
        [],
    )
    assert deltas.structured() == {("native", "first_try"): 1}


async def test_thinking_is_never_part_of_the_reply(faux, cache) -> None:
    final = faux_assistant_message([faux_thinking('{"segments": [ half'), faux_text(json.dumps(GOOD))])
    out = await contract(faux, cache).finalize(final, identity())
    assert (out.reply, out.outcome) == (GOOD_REPLY, "first_try")


LONG = "长" * 40_000
INVALID = {
    "fenced": "```json\n" + json.dumps(GOOD) + "\n```",
    "prose": "Here is my answer: " + json.dumps(GOOD),
    "missing_field": '{"segments": [{"type": "text", "data": {}}]}',
    "extra_field": '{"segments": [{"type": "text", "data": {"text": "x", "style": "bold"}}]}',
    "unknown_type": '{"segments": [{"type": "sticker", "data": {"id": "1"}}]}',
    "numeric_target": '{"segments": [{"type": "mention", "data": {"target": 1234567890123456789}}]}',
    "long_40k": "```json\n" + json.dumps({"segments": [{"type": "text", "data": {"text": LONG}}]}) + "\n```",
}


def assert_correction_request(faux: Any, raw: str) -> None:
    """Exactly one call: the correction, with no history and no tools, carrying the raw output whole."""
    assert faux.call_count == 1
    call = faux.calls[0]
    assert call.context.system_prompt == CORRECTION_SYSTEM_PROMPT
    assert call.context.tools is None
    assert len(call.context.messages) == 1 and isinstance(call.context.messages[0], UserMessage)
    body = call.context.messages[0].content
    assert isinstance(body, str) and body.endswith(raw)  # whole, never truncated
    assert call.options is not None and call.options.output_schema == Reply.model_json_schema()
    assert call.options.max_tokens is not None and call.options.max_tokens >= len(raw)


@pytest.mark.parametrize("case", sorted(INVALID))
async def test_invalid_reply_one_correction_then_success(faux, cache, deltas, case) -> None:
    raw = INVALID[case]
    faux.chunk_size = 4096
    fixed = {"segments": [{"type": "text", "data": {"text": LONG}}]} if case == "long_40k" else GOOD
    faux.set_responses([msg(json.dumps(fixed))])
    out = await contract(faux, cache).finalize(msg(raw), identity())
    assert_correction_request(faux, raw)
    assert (out.reply, out.outcome, out.calls) == (Reply.model_validate(fixed), "corrected", 1)
    assert out.reason
    if case == "long_40k":
        assert (
            isinstance(out.reply.segments[0], TextSegment) and len(out.reply.segments[0].data.text) == 40_000
        )
    assert deltas.structured() == {("native", "corrected"): 1}


@pytest.mark.parametrize("case", sorted(INVALID))
async def test_invalid_twice_falls_back_to_fixed_message(faux, cache, deltas, case) -> None:
    raw = INVALID[case]
    faux.chunk_size = 4096
    faux.set_responses([msg(raw)])
    out = await contract(faux, cache).finalize(msg(raw), identity())
    assert_correction_request(faux, raw)
    assert (out.reply, out.outcome, out.calls) == (Reply.of_text(FAIL), "failed", 1)
    assert deltas.structured() == {("native", "failed"): 1}


async def test_correction_timeout_uses_injectable_clock(faux, cache, deltas) -> None:
    asked: list[float] = []

    async def instant_deadline(seconds: float) -> None:
        asked.append(seconds)

    async def hang(context: Any, options: Any) -> Any:
        await asyncio.Event().wait()

    faux.set_responses([hang])
    out = await contract(faux, cache, sleep=instant_deadline).finalize(msg("not json"), identity())
    assert asked == [30.0]
    assert (out.reply, out.outcome) == (Reply.of_text(FAIL), "failed")
    assert out.reason is not None and out.reason.endswith("correction failed: timeout after 30.0 s")
    assert deltas.structured() == {("native", "failed"): 1}


async def test_correction_honours_turn_cancellation(faux, cache, deltas) -> None:
    ctl = AbortController()

    async def cancel_mid_call(context: Any, options: Any) -> Any:
        ctl.abort("user pressed stop")
        await asyncio.Event().wait()

    faux.set_responses([cancel_mid_call])
    out = await contract(faux, cache).finalize(msg("not json"), identity(), signal=ctl.signal)
    assert (out.reply, out.outcome, out.calls) == (Reply(segments=[]), "aborted", 1)
    assert deltas.structured() == {("native", "failed"): 1}


async def test_unknown_mention_target_is_corrected_not_guessed(faux, cache, deltas, request_text) -> None:
    raw = json.dumps({"segments": [{"type": "mention", "data": {"target": "99999"}}]})
    faux.set_responses([msg(raw)])
    ident = MentionIdentity.from_messages(
        SENDER,
        [
            UserMessage(content="hi", sender={"id": "20002", "name": "Alice"}),
            ToolResultMessage(tool_call_id="c1", tool_name="find_member", details={"member_ids": ["30003"]}),
        ],
    )
    assert ident.allowed() == {SENDER, "20002", "30003"}
    out = await contract(faux, cache).finalize(msg(raw), ident)
    assert (out.reply, out.outcome) == (Reply.of_text(FAIL), "failed")
    assert "mention target '99999' is not a known user id" in request_text(faux.calls[0].context)
    # known ids (sender, earlier speaker, member-lookup result) are accepted
    ok = {"segments": [{"type": "mention", "data": {"target": t}} for t in (SENDER, "20002", "30003")]}
    out2 = await contract(faux, cache).finalize(msg(json.dumps(ok)), ident)
    assert (out2.outcome, out2.reply.mentions()) == ("first_try", [SENDER, "20002", "30003"])
    assert deltas.structured() == {("native", "failed"): 1, ("native", "first_try"): 1}


async def test_plain_text_mode_never_makes_mentions(faux, cache, deltas) -> None:
    c = ImReplyContract(faux.get_model(), False, config=ImReplyConfig(failure_text=FAIL), cache=cache)
    out = await c.finalize(msg("@Alice 你好 " + json.dumps(GOOD)), identity())
    assert out == ReplyOutcome(
        Reply.of_text("@Alice 你好 " + json.dumps(GOOD)),
        "plain",
        "plain",
        "@Alice 你好 " + json.dumps(GOOD),
        None,
    )
    assert out.reply.mentions() == []
    ctx, opts = c.prepare(AgentContext(system_prompt="sys").to_context(), None)
    assert (ctx.system_prompt, opts.output_schema, opts.tool_choice) == ("sys", None, None)
    assert deltas.structured() == {}


async def test_provider_rejecting_native_downgrades_next_turn(faux, cache, deltas) -> None:
    c = contract(faux, cache)
    final = faux_assistant_message(
        [], "error", error_message="HTTP 400: response_format json_schema unsupported"
    )
    out = await c.finalize(final, identity())
    assert (out.reply, out.outcome, faux.call_count) == (Reply.of_text(FAIL), "failed", 0)
    assert cache.get(faux.get_model()) == "tool"
    assert contract(faux, cache).tier == "tool"
    # the same contract object (one per session) asks for the tool tier on its next turn
    _ctx, opts = c.prepare(AgentContext(system_prompt="s").to_context(), None)
    assert (c.tier, opts.output_schema, opts.tool_choice) == ("tool", None, "reply")
    assert deltas.downgrades() == {("native", "tool"): 1}
    assert deltas.structured() == {("native", "failed"): 1}


def test_custom_schema_is_not_the_im_preset(faux, cache) -> None:
    with pytest.raises(ValueError, match="output_schema must be 'segments' or False"):
        ImReplyContract(faux.get_model(), {"type": "object"}, cache=cache)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- agent loop integration


class LookupArgs(BaseModel):
    name: str


def lookup_tool(runs: list[str]) -> AgentTool[LookupArgs]:
    async def run(call_id: str, params: LookupArgs, signal: Any, on_update: Any) -> AgentToolResult:
        runs.append(params.name)
        return AgentToolResult.text("found 30003", details={"member_ids": ["30003"]})

    return AgentTool("find_member", "Find a group member's id by name.", LookupArgs, run)


async def run_turn(c: ImReplyContract, faux: Any, tools: list[Any], max_iterations: int | None = None) -> Any:
    config = c.configure(AgentLoopConfig(model=faux.get_model(), max_iterations=max_iterations))
    user = UserMessage(content="@Bob 看看这个问题", sender={"id": SENDER, "name": "Alice"})
    events = [
        e async for e in agent_loop([user], AgentContext(system_prompt="You are a bot.", tools=tools), config)
    ]
    end = events[-1]
    assert isinstance(end, AgentEndEvent)
    finals = [
        e.message
        for e in events
        if isinstance(e, MessageEndEvent) and isinstance(e.message, AssistantMessage)
    ]
    return events, end, finals[-1]


async def test_native_tier_turn_tool_then_validated_reply(faux, cache, deltas) -> None:
    runs: list[str] = []
    answer = {
        "segments": [
            {"type": "text", "data": {"text": "请 "}},
            {"type": "mention", "data": {"target": "30003"}},
        ]
    }
    faux.set_responses(
        [faux_assistant_message([faux_tool_call("find_member", {"name": "Bob"})]), msg(json.dumps(answer))]
    )
    c = contract(faux, cache)
    _events, end, final = await run_turn(c, faux, [lookup_tool(runs)])
    ident = MentionIdentity.from_messages(SENDER, end.messages)
    out = await c.finalize(final, ident)
    assert (out.reply, out.outcome, runs) == (Reply.model_validate(answer), "first_try", ["Bob"])
    for call in faux.calls:  # every call of the turn carries the schema; tools keep their own
        assert call.options is not None and call.options.output_schema == Reply.model_json_schema()
        assert call.options.output_schema_name == "reply"
        assert [t.name for t in call.context.tools or []] == ["find_member"]
        assert call.context.system_prompt == "You are a bot.\n\n" + IM_INSTRUCTIONS
    assert deltas.structured() == {("native", "first_try"): 1}


async def test_tool_tier_turn_reply_call_ends_loop_and_correction_never_reruns_tools(
    faux, cache, deltas
) -> None:
    cache.record(faux.get_model(), "tool")
    runs: list[str] = []
    bad = {"segments": [{"type": "mention", "data": {"target": "Bob"}}]}
    good = {
        "segments": [
            {"type": "text", "data": {"text": "Bob 是 "}},
            {"type": "mention", "data": {"target": "30003"}},
        ]
    }
    faux.set_responses(
        [
            faux_assistant_message([faux_tool_call("find_member", {"name": "Bob"})]),
            faux_assistant_message([faux_tool_call("reply", bad)]),
            faux_assistant_message([faux_tool_call("reply", good)]),  # the correction
        ]
    )
    c = contract(faux, cache)
    assert c.tier == "tool"
    _events, end, final = await run_turn(c, faux, [lookup_tool(runs)])
    assert (end.reason, final.tool_calls(), final.stop_reason) == ("stop", [], "stop")
    for call in faux.calls[:2]:
        assert call.options is not None and call.options.tool_choice == "required"
        assert [t.name for t in call.context.tools or []] == ["find_member", "reply"]
    out = await c.finalize(final, MentionIdentity.from_messages(SENDER, end.messages))
    assert (out.reply, out.outcome, out.tier) == (Reply.model_validate(good), "corrected", "tool")
    corr = faux.calls[2]
    assert corr.options is not None and corr.options.tool_choice == "reply"
    assert [t.name for t in corr.context.tools or []] == ["reply"]  # no business tools
    assert len(corr.context.messages) == 1  # no history
    assert runs == ["Bob"]  # the tool ran once; the correction re-ran nothing
    assert deltas.structured() == {("tool", "corrected"): 1}


async def test_summary_after_tool_budget_keeps_the_schema(faux, cache, deltas) -> None:
    runs: list[str] = []
    faux.set_responses(
        [faux_assistant_message([faux_tool_call("find_member", {"name": "Bob"})]), msg(json.dumps(GOOD))]
    )
    c = contract(faux, cache)
    _events, end, _final = await run_turn(c, faux, [lookup_tool(runs)], max_iterations=1)
    assert (end.reason, runs) == ("max_iterations", ["Bob"])
    seen: list[int] = []

    async def convert(ms: list[Any]) -> list[Any]:  # the session's converter, async here
        seen.append(len(ms))
        return default_convert_to_llm(ms)

    out = await c.summarize(end.messages, identity(), system_prompt="You are a bot.", convert_to_llm=convert)
    assert (out.reply, out.outcome, out.calls, seen) == (GOOD_REPLY, "first_try", 1, [4])
    summary = faux.calls[1]
    assert summary.context.tools is None
    assert summary.options is not None and summary.options.output_schema == Reply.model_json_schema()
    assert [m.role for m in summary.context.messages] == ["user", "assistant", "toolResult", "user"]
    assert deltas.structured() == {("native", "first_try"): 1}


async def test_summary_call_failure_gives_fixed_message(faux, cache, deltas) -> None:
    faux.set_responses([faux_assistant_message([], "error", error_message="HTTP 503 overloaded")])
    out = await contract(faux, cache).summarize([UserMessage(content="hi")], identity())
    assert (out.reply, out.outcome, out.calls) == (Reply.of_text(FAIL), "failed", 1)
    assert deltas.structured() == {("native", "failed"): 1}


async def test_preview_only_after_validation(faux, cache) -> None:
    faux.chunk_size = 5
    raw = json.dumps(GOOD)
    faux.set_responses([msg(raw)])
    c = contract(faux, cache)
    published: list[str] = []
    preview = ReplyPreview(published.append)
    config = c.configure(AgentLoopConfig(model=faux.get_model()))
    final = None
    async for e in agent_loop([UserMessage(content="hi")], AgentContext(), config):
        preview.on_event(e)
        assert published == []  # no half JSON while streaming
        if isinstance(e, MessageEndEvent) and isinstance(e.message, AssistantMessage):
            final = e.message
    assert preview.held_deltas == (len(raw) + 4) // 5
    out = await c.finalize(final, identity())
    await preview.release(out)
    await preview.release(out)
    assert published == ["好的 @" + SENDER]


async def test_non_im_entry_points_do_not_inherit_the_preset(faux) -> None:
    """A plain agent loop (sub-agent, non-IM entry point) sends no reply schema, no reply tool and
    no IM instructions: the preset exists only where ImReplyContract.configure was applied."""
    faux.set_responses([msg("plain answer")])
    config = AgentLoopConfig(model=faux.get_model())
    _ = [e async for e in agent_loop([UserMessage(content="hi")], AgentContext(system_prompt="sub"), config)]
    call = faux.calls[0]
    assert call.options is not None
    assert (call.options.output_schema, call.options.tool_choice) == (None, None)
    assert (call.context.system_prompt, call.context.tools) == ("sub", None)


async def test_correction_cut_off_by_budget_is_never_sent(faux, cache, deltas) -> None:
    model = faux.get_model().model_copy(update={"compat": {"max_output_tokens": 8192}})
    faux.chunk_size = 4096
    raw = INVALID["long_40k"]
    faux.set_responses([msg(json.dumps(GOOD), "length")])
    c = ImReplyContract(model, config=ImReplyConfig(failure_text=FAIL), cache=cache)
    out = await c.finalize(msg(raw), identity())
    assert faux.calls[0].options is not None and faux.calls[0].options.max_tokens == 8192
    assert (out.reply, out.outcome) == (Reply.of_text(FAIL), "failed")
    assert out.reason is not None
    assert out.reason.endswith("correction still invalid: the correction was cut off")
    assert deltas.structured() == {("native", "failed"): 1}


async def test_fixed_message_outcome_writes_one_log_record(faux, cache, deltas, caplog) -> None:
    """Seed 003 §9.3: raw output, reason and tier — all three, in one record, every time."""
    import logging

    faux.set_responses([msg("still not json")])
    with caplog.at_level(logging.INFO, logger="runtime.reply.structured"):
        out = await contract(faux, cache).finalize(msg("not json"), identity())
    records = [r.structured for r in caplog.records if hasattr(r, "structured")]  # type: ignore[attr-defined]
    assert [(r["tier"], r["outcome"], r["raw"], r["output_type"], r["calls"]) for r in records] == [
        ("native", "failed", "still not json", "Reply", 1)
    ]
    assert records[0]["reason"] == out.reason and out.reason.startswith(
        "(root): Invalid JSON: expected ident at line 1 column 2; correction still invalid: "
    )
    assert deltas.structured() == {("native", "failed"): 1}

"""Transcripts (write rules, redelivery) and the chat_history tool, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from runtime.agent.tools import AgentToolResult, validate_tool_call
from runtime.llm.types import TextContent, ToolCall
from runtime.memory import Database, TranscriptEntry, TranscriptStore
from runtime.session.chat_history import make_chat_history_tool

T0 = 1_764_500_000_000  # 2025-11-30 10:53:20 UTC


async def test_redelivered_inbound_event_is_stored_once(db: Database, fixtures_dir: Path) -> None:
    event = json.loads((fixtures_dir / "onebot11" / "event_group_message_array.json").read_text())
    store = TranscriptStore(db)
    fields = dict(
        message_id=str(event["message_id"]),
        platform="onebot11",
        bot_id=str(event["self_id"]),
        scene_id=str(event["group_id"]),
        scene_type="group",
        sender_id=str(event["sender"]["user_id"]),
        sender_name=event["sender"]["nickname"],
        sender_role=event["sender"]["role"],
        segments=event["message"],
        time_ms=event["time"] * 1000,
    )
    assert await store.record_inbound(**fields) == "stored"
    assert await store.record_inbound(**fields) == "duplicate"
    # the bot's own reply with the same platform id is a different row (other direction)
    assert (
        await store.record_outbound(**{**fields, "sender_id": "1000000001", "sender_name": "bot"}) == "stored"
    )
    assert (
        await store.record_outbound(**{**fields, "sender_id": "1000000001", "sender_name": "bot"})
        == "duplicate"
    )
    rows = await store.scene("onebot11", "1000000001", "300000003")
    assert rows == [
        TranscriptEntry(
            message_id="70440311",
            platform="onebot11",
            bot_id="1000000001",
            scene_id="300000003",
            scene_type="group",
            sender_id="200000002",
            sender_name="　",
            sender_role="owner",
            direction="inbound",
            body="3",
            media=None,
            time=1_756_168_837_000,
        ),
        TranscriptEntry(
            message_id="70440311",
            platform="onebot11",
            bot_id="1000000001",
            scene_id="300000003",
            scene_type="group",
            sender_id="1000000001",
            sender_name="bot",
            sender_role="owner",
            direction="outbound",
            body="3",
            media=None,
            time=1_756_168_837_000,
        ),
    ]


async def test_body_is_text_only_media_json_is_segments_and_empty_inbound_is_skipped(
    db: Database, fixtures_dir: Path
) -> None:
    segments = json.loads((fixtures_dir / "onebot11" / "message_segments_array.json").read_text())
    store = TranscriptStore(db)
    base = dict(
        platform="onebot11", bot_id="1", scene_id="2", scene_type="private", sender_id="2", time_ms=T0
    )
    assert await store.record_inbound(message_id="m1", segments=segments, **base) == "stored"
    image_only = [{"type": "image", "data": {"file": "a.jpg"}}]
    assert await store.record_inbound(message_id="m2", segments=image_only, **base) == "stored"
    assert (
        await store.record_inbound(
            message_id="m3", segments=[{"type": "text", "data": {"text": " \n"}}], **base
        )
        == "skipped"
    )
    assert await store.record_inbound(message_id="m4", segments=[], **base) == "skipped"
    assert await store.record_outbound(message_id="m5", text="explicit text", **base) == "stored"
    rows = await store.scene("onebot11", "1", "2")
    assert [(r.message_id, r.body, r.media) for r in rows] == [
        ("m1", "[第一部分]图片之后的部分，表情：", segments),
        ("m2", "", image_only),
        ("m5", "explicit text", None),
    ]
    with pytest.raises(
        ValueError, match=re.escape("scene_type must be one of private|group|channel, got 'room'")
    ):
        await store.record_inbound(message_id="m6", text="x", **{**base, "scene_type": "room"})
    with pytest.raises(ValueError, match=re.escape("direction must be inbound|outbound")):
        await store.record(direction="sideways", message_id="m7", text="x", **base)  # type: ignore[arg-type]


async def call_history(tool: object, args: dict[str, object]) -> AgentToolResult:
    call = ToolCall(id="c1", name="chat_history", arguments=args)
    params = validate_tool_call([tool], call)  # type: ignore[list-item]
    result = await tool.execute("c1", params, None, lambda _r: None)  # type: ignore[attr-defined]
    assert isinstance(result, AgentToolResult)
    return result


async def test_chat_history_escapes_like_wildcards_and_stays_in_scene(db: Database) -> None:
    store = TranscriptStore(db)
    scene = dict(platform="telegram", bot_id="777", scene_id="-100", scene_type="group", sender_role="member")
    bodies = [
        ("u1", "Alice", "50% off today"),
        ("u2", "Bob", "5000 off, not a match for 50%"),
        ("u1", "Alice", "file a_b.txt"),
        ("u2", "Bob", "file axb.txt"),
        ("u2", "Bob", "path C:\\tmp\\x"),
        ("u1", "Alice", "UPPER 50% OFF"),
    ]
    for i, (uid, name, body) in enumerate(bodies):
        await store.record_inbound(
            message_id=f"m{i}", sender_id=uid, sender_name=name, text=body, time_ms=T0 + i * 1000, **scene
        )
    await store.record_outbound(
        message_id="o1",
        sender_id="777",
        sender_name="bot",
        text="bot says 50% too",
        time_ms=T0 + 9000,
        **scene,
    )
    # same words in another scene: never returned
    await store.record_inbound(
        message_id="x1",
        sender_id="u9",
        sender_name="Eve",
        text="50% off elsewhere",
        time_ms=T0,
        **{**scene, "scene_id": "-200"},
    )
    tool = make_chat_history_tool(db, platform="telegram", bot_id="777", scene_id="-100")

    res = await call_history(tool, {"query": "50%"})
    assert res.content == [
        TextContent(
            text="[2025-11-30 10:53:20 UTC] Alice (u1): 50% off today\n"
            "[2025-11-30 10:53:21 UTC] Bob (u2): 5000 off, not a match for 50%\n"
            "[2025-11-30 10:53:25 UTC] Alice (u1): UPPER 50% OFF\n"
            "[2025-11-30 10:53:29 UTC] bot (777): bot says 50% too"
        )
    ]
    assert res.details == {"count": 4}
    res = await call_history(tool, {"query": "% off"})
    assert res.content[0].text.splitlines() == [  # type: ignore[union-attr]
        "[2025-11-30 10:53:20 UTC] Alice (u1): 50% off today",
        "[2025-11-30 10:53:25 UTC] Alice (u1): UPPER 50% OFF",
    ]
    res = await call_history(tool, {"query": "a_b"})
    assert res.content == [TextContent(text="[2025-11-30 10:53:22 UTC] Alice (u1): file a_b.txt")]
    res = await call_history(tool, {"query": "C:\\tmp"})
    assert res.content == [TextContent(text="[2025-11-30 10:53:24 UTC] Bob (u2): path C:\\tmp\\x")]
    res = await call_history(tool, {"query": "_"})
    assert res.details == {"count": 1}
    # limit keeps the newest, shown oldest first; time range is inclusive
    res = await call_history(tool, {"query": "50%", "limit": "2"})
    assert [line[:32] for line in res.content[0].text.splitlines()] == [  # type: ignore[union-attr]
        "[2025-11-30 10:53:25 UTC] Alice ",
        "[2025-11-30 10:53:29 UTC] bot (7",
    ]
    res = await call_history(tool, {"query": "file", "since_ms": T0 + 3000, "until_ms": T0 + 3000})
    assert res.content == [TextContent(text="[2025-11-30 10:53:23 UTC] Bob (u2): file axb.txt")]
    res = await call_history(tool, {"query": "nothing like this"})
    assert res.content == [TextContent(text="No messages matching 'nothing like this'.")]
    assert res.details == {"count": 0}

"""OneBot v11: lenient CQ strings (docs/decisions.md#platform-cq-lenient) and outbound forwards
(docs/decisions.md#platform-forward-api) — the codec alone, then real sends through the delivery
core (ledger on SQLite) to the platform-API stand-in over loopback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runtime.config import BotConfig
from runtime.delivery.core import DeliverySender, DeliverySettings
from runtime.delivery.job import DeliveryJob
from runtime.platforms import cqcode
from runtime.platforms.base import RenderTarget
from runtime.platforms.onebot11 import OneBot11Codec
from runtime.reply.segments import Reply
from tests.platform_api_server import PlatformApiServer

BOT = "1000000001"


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": t}}


# --------------------------------------------------------------------------- lenient CQ strings


@pytest.mark.parametrize(
    ("cq", "segments"),
    [
        # one trailing comma is allowed, as the SDKs read it
        ("[CQ:face,id=14,]", [{"type": "face", "data": {"id": "14"}}]),
        ("[CQ:rps,]", [{"type": "rps", "data": {}}]),
        # anything else that does not parse stays literal text, merged with the text around it
        ("[CQ:at,qq]", [text("[CQ:at,qq]")]),
        ("a[CQ:image,file=a,b.jpg]b", [text("a[CQ:image,file=a,b.jpg]b")]),
        ("[CQ:at, qq=10001] hi", [text("[CQ:at, qq=10001] hi")]),
        ("[CQ:表情,id=1]", [text("[CQ:表情,id=1]")]),
        ("[CQ:at ,qq=1]", [text("[CQ:at ,qq=1]")]),
        ("[CQ:]", [text("[CQ:]")]),
        ("[CQ:at,=1]", [text("[CQ:at,=1]")]),
        ("[CQ:face,id=1,,]", [text("[CQ:face,id=1,,]")]),
        # literal text is unescaped like any text; a good code after a bad one still parses
        (
            "&#91;[CQ:at,qq][CQ:face,id=2]&amp;",
            [text("[[CQ:at,qq]"), {"type": "face", "data": {"id": "2"}}, text("&")],
        ),
        # an unescaped '[' is part of a value (aiocqhttp's reading: test_cqcode_aiocqhttp.py)
        ("x[CQ:at,qq=[CQ:face,id=3]", [text("x"), {"type": "at", "data": {"qq": "[CQ:face", "id": "3"}}]),
        # an empty value is a value; a repeated key keeps the last one; '=' may be in a value
        ("[CQ:at,qq=]", [{"type": "at", "data": {"qq": ""}}]),
        ("[CQ:share,url=u,url=v,title=a=b]", [{"type": "share", "data": {"url": "v", "title": "a=b"}}]),
        ("[CQ:my.type-2_x,k-1.a_b=v]", [{"type": "my.type-2_x", "data": {"k-1.a_b": "v"}}]),
    ],
)
def test_cq_strings_parse_without_error(cq: str, segments: list[dict[str, Any]]) -> None:
    assert cqcode.parse_cq(cq) == segments


def onebot_event(message: Any) -> bytes:
    return json.dumps(
        {
            "post_type": "message",
            "message_type": "private",
            "self_id": int(BOT),
            "user_id": 200000002,
            "message_id": 42,
            "time": 1756168635,
            "message": message,
            "sender": {"user_id": 200000002, "nickname": "n"},
        }
    ).encode()


def test_an_event_with_odd_codes_is_accepted_whole() -> None:
    message = "[CQ:face,id=14,]hi [CQ:at, qq=10001][CQ:at,qq][CQ:image,file=a,b.jpg][CQ:rps,][CQ:表情,id=1]"
    msg = OneBot11Codec(self_id=BOT).parse({}, onebot_event(message))
    assert msg is not None
    assert msg.segments == [
        {"type": "face", "data": {"id": "14"}},
        text("hi [CQ:at, qq=10001][CQ:at,qq][CQ:image,file=a,b.jpg]"),
        {"type": "rps", "data": {}},
        text("[CQ:表情,id=1]"),
    ]
    assert (msg.text, msg.mentioned_bot) == (
        "hi [CQ:at, qq=10001][CQ:at,qq][CQ:image,file=a,b.jpg][CQ:表情,id=1]",
        False,
    )


# --------------------------------------------------------------------------- outbound forward

FORWARD_REPLY = {
    "segments": [
        {"type": "text", "data": {"text": "look:"}},
        {"type": "forward", "data": {"forward_id": "fw-1"}},
        {"type": "forward", "data": {"forward_id": "fw-2"}},
        {"type": "text", "data": {"text": "and this"}},
        {"type": "forward", "data": {"forward_id": "fw-3"}},
    ]
}


def node(forward_id: str) -> dict[str, Any]:
    return {
        "type": "node",
        "data": {
            "user_id": int(BOT),
            "nickname": BOT,
            "uin": BOT,  # Lagrange.OneBot reads uin/name, go-cqhttp and NapCat user_id/nickname
            "name": BOT,
            "content": [{"type": "forward", "data": {"id": forward_id}}],
        },
    }


def test_render_forward_api_splits_runs_in_order() -> None:
    c = OneBot11Codec(self_id=BOT, forward_api=True)
    assert "forward" in c.supported_segments
    calls = c.render(
        Reply.model_validate(FORWARD_REPLY), RenderTarget(scene_type="group", scene_id="300", reply_to="77")
    )
    assert [(k.path, k.kind, k.json_body) for k in calls] == [
        (
            "/send_group_msg",
            "message",
            {"group_id": 300, "message": [{"type": "reply", "data": {"id": "77"}}, text("look:")]},
        ),
        ("/send_group_forward_msg", "forward", {"group_id": 300, "messages": [node("fw-1"), node("fw-2")]}),
        ("/send_group_msg", "message", {"group_id": 300, "message": [text("and this")]}),
        ("/send_group_forward_msg", "forward", {"group_id": 300, "messages": [node("fw-3")]}),
    ]
    only = c.render(
        Reply.model_validate({"segments": FORWARD_REPLY["segments"][1:2]}),
        RenderTarget(scene_type="private", scene_id="200", reply_to="77"),
    )
    assert [(k.path, k.json_body) for k in only] == [
        ("/send_private_forward_msg", {"user_id": 200, "messages": [node("fw-1")]})
    ]


def sender(tmp_path: Path, api: PlatformApiServer, forward_api: bool) -> DeliverySender:
    bot = BotConfig(platform="onebot11", self_id=BOT, api_base=api.base_url, forward_api=forward_api)
    settings = DeliverySettings(database_url=f"sqlite:///{tmp_path / 'd.db'}", bots=[bot], max_age_s=1)
    return DeliverySender(settings, 0, "0:test")


def job(scene_type: str, scene_id: str) -> DeliveryJob:
    return DeliveryJob(
        reply_id=f"fwd-{scene_type}",
        session_key=f"onebot11:{BOT}:{scene_type}:{scene_id}",
        platform="onebot11",
        bot_id=BOT,
        scene_type=scene_type,  # type: ignore[arg-type]
        scene_id=scene_id,
        reply=Reply.model_validate(FORWARD_REPLY),
    )


async def test_forward_through_the_forward_api(
    tmp_path: Path, api_server: PlatformApiServer, degraded: Any
) -> None:
    s = sender(tmp_path, api_server, forward_api=True)
    try:
        group = await s.deliver(job("group", "300"))
        private = await s.deliver(job("private", "200"))
    finally:
        await s.close()
    assert (group.outcome, private.outcome) == ("sent", "sent")
    assert [(r.path, r.json) for r in api_server.requests] == [
        ("/send_group_msg", {"group_id": 300, "message": [text("look:")]}),
        ("/send_group_forward_msg", {"group_id": 300, "messages": [node("fw-1"), node("fw-2")]}),
        ("/send_group_msg", {"group_id": 300, "message": [text("and this")]}),
        ("/send_group_forward_msg", {"group_id": 300, "messages": [node("fw-3")]}),
        ("/send_private_msg", {"user_id": 200, "message": [text("look:")]}),
        ("/send_private_forward_msg", {"user_id": 200, "messages": [node("fw-1"), node("fw-2")]}),
        ("/send_private_msg", {"user_id": 200, "message": [text("and this")]}),
        ("/send_private_forward_msg", {"user_id": 200, "messages": [node("fw-3")]}),
    ]
    assert degraded.delta() == {}


async def test_forward_without_the_api_is_counted_text(
    tmp_path: Path, api_server: PlatformApiServer, degraded: Any
) -> None:
    s = sender(tmp_path, api_server, forward_api=False)
    try:
        result = await s.deliver(job("group", "300"))
    finally:
        await s.close()
    assert result.outcome == "sent"
    message = [
        text("look:"),
        text("[forward fw-1]"),
        text("[forward fw-2]"),
        text("and this"),
        text("[forward fw-3]"),
    ]
    assert [(r.path, r.json) for r in api_server.requests] == [
        ("/send_group_msg", {"group_id": 300, "message": message})
    ]
    assert degraded.delta() == {("onebot11", "forward"): 3.0}

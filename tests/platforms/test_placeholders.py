"""A message with no text still reads as something to the model (docs/decisions.md#platform-placeholders):
a QQ face, dice or sticker sent alone, a Telegram sticker, dice or location. Checked from the
platform event to the stored user message (the codec, then ``TurnInput.user_message``); through a
real session turn to the model in tests/session/test_features_session_turn.py."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.llm.types import NO_TEXT
from runtime.platforms.base import InboundMessage
from runtime.platforms.placeholders import model_lines, model_text
from runtime.session.turn import TurnInput
from tests.platforms.test_codec_hardening import ob_event, onebot, raw, telegram, tg_update


def inbound_onebot(message: Any) -> InboundMessage:
    got = onebot().parse({}, raw(ob_event(message=message)))
    assert got is not None
    return got


def inbound_telegram(**fields: Any) -> InboundMessage:
    got = telegram().parse({}, raw(tg_update(1, **fields)))
    assert got is not None
    return got


def model_sees(inbound: InboundMessage) -> Any:
    return TurnInput.from_inbound(inbound, seq=1).user_message().content


@pytest.mark.parametrize(
    ("message", "seen"),
    [
        ([{"type": "face", "data": {"id": "14"}}], "[face 14]"),
        ("[CQ:face,id=14]", "[face 14]"),
        ("[CQ:face,id=14][CQ:face,id=178]", "[face 14]\n[face 178]"),
        ([{"type": "dice", "data": {}}], "[dice]"),
        ([{"type": "rps", "data": {}}], "[rps]"),
        ([{"type": "mface", "data": {"summary": "[嘿嘿]", "emoji_id": "1"}}], "[sticker 嘿嘿]"),  # QQ market
        ([{"type": "mface", "data": {"emoji_id": "1"}}], "[sticker]"),
        ("[CQ:forward,id=fw1]", "[forward fw1]"),
        ("[CQ:share,url=https://e.com/a,title=News]", "[share News https://e.com/a]"),
        ("[CQ:image,file=abc.image,url=https://q.qpic.cn/x]", "[image url=https://q.qpic.cn/x]"),
        ("[CQ:reply,id=5]", NO_TEXT),  # a quote alone says nothing
        ("", NO_TEXT),
        ("hi[CQ:face,id=14]", "hi\n[face 14]"),
    ],
)
def test_onebot_non_text_segments_reach_the_model_as_placeholders(message: Any, seen: str) -> None:
    inbound = inbound_onebot(message)
    assert model_sees(inbound) == seen


@pytest.mark.parametrize(
    ("fields", "seen"),
    [
        ({"text": ..., "sticker": {"file_id": "CAAC-1", "emoji": "😀"}}, "[sticker 😀 file=CAAC-1]"),
        ({"text": ..., "sticker": {"file_id": "CAAC-2"}}, "[sticker file=CAAC-2]"),
        ({"text": ..., "dice": {"emoji": "🎲", "value": 4}}, "[dice]"),
        ({"text": ..., "voice": {"file_id": "AwAC-1"}}, "[audio file=AwAC-1]"),
        ({"text": ..., "location": {"latitude": 1.0, "longitude": 2.0}}, NO_TEXT),
        ({"text": "look", "sticker": {"file_id": "CAAC-1", "emoji": "🐱"}}, "look\n[sticker 🐱 file=CAAC-1]"),
    ],
)
def test_telegram_non_text_messages_reach_the_model_as_placeholders(
    fields: dict[str, Any], seen: str
) -> None:
    assert model_sees(inbound_telegram(**fields)) == seen


def test_a_telegram_sticker_is_an_image_marked_as_a_sticker() -> None:
    inbound = inbound_telegram(text=..., sticker={"file_id": "CAAC-1", "emoji": "😀"})
    media = {"kind": "file", "value": "CAAC-1"}
    assert inbound.segments == [{"type": "image", "data": {"media": media, "sticker": "😀"}}]
    assert inbound.text == ""  # the inbound text stays the text (triggers, commands, transcripts)


def test_model_lines_follow_the_segments_in_order() -> None:
    segments = [
        {"type": "reply", "data": {"message_id": "9"}},
        {"type": "text", "data": {"text": "a"}},
        {"type": "face", "data": {"id": "1"}},
        {"type": "mention", "data": {"target": "7"}},
        {"type": "image", "data": {"media": {"kind": "base64", "value": "AAAA"}}},
        {"type": "video", "data": {"media": {"kind": "url", "value": "https://e.com/v.mp4"}}},
        {"type": "share", "data": {"url": "https://e.com", "title": ""}},
        {"type": "poll", "data": {}},
    ]
    assert model_lines(segments) == ["[face 1]", "[image]", "[video url=https://e.com/v.mp4]",
                                     "[share https://e.com]", "[poll]"]  # fmt: skip
    assert model_text("  ", []) == NO_TEXT
    assert model_text("a", segments[:2]) == "a"


def test_odd_segments_of_another_codec_give_lines_never_errors() -> None:
    """Segments the built-in codecs never make (a codec of one's own may): a non-dict segment or
    ``data``, a number where a string is expected — a line or nothing, never an exception that
    would drop the whole event."""
    from runtime.platforms.placeholders import model_text

    odd: list[Any] = [
        "not a segment",
        {"type": "share", "data": {"title": 5, "url": None}},
        {"type": "face", "data": [1]},
        {"type": "poke", "data": None},
    ]
    assert model_text("", odd) == "[share 5]\n[face ]\n[poke]"

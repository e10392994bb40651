"""Codec hardening (docs/decisions.md#platform-strict-boundary): per-bot unique Telegram message
ids, strict inbound types (→ MalformedEvent, which the ingress answers 400), byte-wise signature
compare, OneBot segment checks, lone surrogates, and a linear CQ-code parser."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from runtime.memory import Database, TranscriptStore
from runtime.platforms import cqcode
from runtime.platforms.base import InboundMessage, MalformedEvent, RenderTarget, Sender, SignatureError
from runtime.platforms.onebot11 import MAX_SEGMENTS, OneBot11Codec
from runtime.platforms.telegram import TelegramCodec, native_message_id
from runtime.reply.segments import Reply

OB_SELF = "10001"
TG_BOT = "123456789"


def onebot(**kw: Any) -> OneBot11Codec:
    kw.setdefault("self_id", OB_SELF)
    return OneBot11Codec(**kw)


def telegram(**kw: Any) -> TelegramCodec:
    kw.setdefault("bot_id", TG_BOT)
    kw.setdefault("token", f"{TG_BOT}:AAF-test")
    kw.setdefault("username", "sessionray_bot")
    return TelegramCodec(**kw)


def ob_event(**fields: Any) -> dict[str, Any]:
    """A private OneBot message event (the attack's ``priv`` shape); ``fields`` override/add keys
    (a value of ``...`` removes the key)."""
    event: dict[str, Any] = {
        "self_id": 10001,
        "user_id": 7400,
        "time": 1756168635,
        "message_id": 42,
        "message_type": "private",
        "sender": {"user_id": 7400, "nickname": "n", "card": ""},
        "message": [{"type": "text", "data": {"text": "hi"}}],
        "post_type": "message",
    }
    event.update(fields)
    return {k: v for k, v in event.items() if v is not ...}


def tg_update(update_id: int = 1, /, **fields: Any) -> dict[str, Any]:
    """A private Telegram text update (the attack's ``upd`` shape); ``fields`` override message keys
    (a value of ``...`` removes the key)."""
    msg: dict[str, Any] = {
        "message_id": 77,
        "date": 1756168635,
        "chat": {"id": 4444441, "type": "private", "first_name": "A"},
        "from": {"id": 4444441, "is_bot": False, "first_name": "A"},
        "text": "hello",
    }
    msg.update(fields)
    return {"update_id": update_id, "message": {k: v for k, v in msg.items() if v is not ...}}


def raw(value: Any) -> bytes:
    return json.dumps(value).encode()


# --------------------------------------------------------------------------- 1. Telegram dedup identity


def tg_private(chat_id: int, update_id: int, text: str) -> dict[str, Any]:
    """The attack's t9.py shape: a private chat whose chat id is the user id, message_id 77."""
    user = {"id": chat_id, "is_bot": False, "first_name": "U"}
    return tg_update(update_id, chat={"id": chat_id, "type": "private"}, **{"from": user}, text=text)


def expected_private(chat_id: int, text: str) -> InboundMessage:
    return InboundMessage(
        platform="telegram",
        bot_id=TG_BOT,
        message_id=f"{chat_id}:77",
        scene_type="private",
        scene_id=str(chat_id),
        sender=Sender(id=str(chat_id), name="U"),
        text=text,
        segments=[{"type": "text", "data": {"text": text}}],
        time_ms=1756168635000,
    )


def test_same_telegram_message_id_in_two_chats_gives_two_dedup_keys() -> None:
    c = telegram()
    a = c.parse({}, raw(tg_private(4444441, 1, "from chat A")))
    b = c.parse({}, raw(tg_private(4444442, 2, "from chat B")))
    assert (a, b) == (expected_private(4444441, "from chat A"), expected_private(4444442, "from chat B"))
    assert a is not None and b is not None
    # the router's dedup key
    assert {(m.platform, m.bot_id, m.message_id) for m in (a, b)} == {
        ("telegram", TG_BOT, "4444441:77"),
        ("telegram", TG_BOT, "4444442:77"),
    }


async def test_same_telegram_message_id_in_two_chats_gives_two_transcript_rows(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path}/transcripts.db")
    db.create_tables()
    try:
        store = TranscriptStore(db)
        c = telegram()
        outcomes = []
        for chat_id, update_id in ((4444441, 1), (4444442, 2), (4444441, 1)):  # A, B, A redelivered
            msg = c.parse({}, raw(tg_private(chat_id, update_id, f"chat {chat_id}")))
            assert msg is not None
            fields = dict(
                message_id=msg.message_id,
                platform=msg.platform,
                bot_id=msg.bot_id,
                scene_id=msg.scene_id,
                scene_type=msg.scene_type,
                sender_id=msg.sender.id,
                segments=msg.segments,
                text=msg.text,
                time_ms=msg.time_ms,
            )
            outcomes.append(await store.record_inbound(**fields))
        # the bot's replies in both chats: Telegram answers message_id 78 in each chat
        for chat_id in (4444441, 4444442):
            answer = {"ok": True, "result": {"message_id": 78, "chat": {"id": chat_id, "type": "private"}}}
            sent = c.parse_send_result(200, {}, raw(answer))
            assert sent.message_id == f"{chat_id}:78"
            outcomes.append(
                await store.record_outbound(
                    message_id=sent.message_id,
                    platform="telegram",
                    bot_id=TG_BOT,
                    scene_id=str(chat_id),
                    scene_type="private",
                    sender_id=TG_BOT,
                    text="re",
                )
            )
        assert outcomes == ["stored", "stored", "duplicate", "stored", "stored"]
        rows = await store.scene("telegram", TG_BOT, "4444442")
        assert [(r.scene_id, r.message_id, r.direction) for r in rows] == [
            ("4444442", "4444442:77", "inbound"),
            ("4444442", "4444442:78", "outbound"),
        ]
    finally:
        db.dispose()


def test_quoting_uses_the_native_telegram_message_id() -> None:
    c = telegram()
    update = tg_update(
        chat={"id": -1001293752024, "type": "supergroup"},
        text="@sessionray_bot hi",
        entities=[{"offset": 0, "length": 15, "type": "mention"}],
        reply_to_message={"message_id": 70, "date": 1, "chat": {"id": -1001293752024, "type": "supergroup"}},
    )
    msg = c.parse({}, raw(update))
    assert msg is not None
    assert (msg.message_id, msg.reply_to, msg.segments[0]) == (
        "-1001293752024:77",
        "70",
        {"type": "reply", "data": {"message_id": "70"}},
    )
    # the session answers with reply_to = the inbound message_id (per-bot form)
    target = RenderTarget(scene_type="group", scene_id=msg.scene_id, reply_to=msg.message_id)
    [call] = c.render(Reply.of_text("ok"), target)
    assert call.json_body == {
        "chat_id": -1001293752024,
        "text": "ok",
        "parse_mode": "HTML",
        "reply_parameters": {"message_id": 77},
    }
    assert [native_message_id(r) for r in ("-100:77", "77", "x")] == [77, 77, None]
    # a quote names a message of the chat being answered, with a positive integer id
    refs = ("-100:77", "77", "-200:77", "-100:abc")
    assert [native_message_id(r, "-100") for r in refs] == [77, 77, None, None]
    assert [native_message_id(r) for r in ("0", "-5", "99999999999999999999999")] == [None, None, None]
    # a model-written quote of another chat's message is dropped, not sent as a wrong quote
    other = Reply.model_validate(
        {
            "segments": [
                {"type": "reply", "data": {"message_id": "4444442:77"}},
                {"type": "text", "data": {"text": "ok"}},
            ]
        }
    )
    [call] = c.render(other, target)
    assert "reply_parameters" not in (call.json_body or {})


# --------------------------------------------------------------------------- 2. strict types (OneBot)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"user_id": None}, "user_id must be an integer or a decimal string, got None"),
        ({"user_id": True}, "user_id must be an integer or a decimal string, got True"),
        ({"user_id": 1.5}, "user_id must be"),
        ({"user_id": 10**40}, "user_id is outside the 64-bit integer range"),
        ({"user_id": "1" * 20}, "user_id must be"),
        ({"user_id": "a#b"}, "user_id must be"),
        ({"user_id": "a b"}, "user_id must be"),
        ({"user_id": "7\n"}, "user_id must be"),
        ({"user_id": ""}, "user_id must be"),
        ({"user_id": " "}, "user_id must be"),
        ({"user_id": "٣"}, "user_id must be"),  # a non-ASCII digit
        ({"user_id": -5}, "user_id must be a positive number, got -5"),  # QQ numbers are ≥ 1
        ({"user_id": "0"}, "user_id must be a positive number"),
        ({"message_type": "group", "group_id": -7}, "group_id must be a positive number"),
        ({"message_id": None}, "message_id must be"),
        ({"message_id": {"a": 1}}, "message_id must be"),
        ({"message_id": False}, "message_id must be"),
        ({"self_id": ...}, "lacks self_id"),
        ({"self_id": True}, "self_id must be"),
        ({"self_id": 10002}, "event for self_id 10002 posted to bot 10001"),
        ({"message_type": "group"}, "lacks group_id"),
        ({"message_type": "group", "group_id": None}, "group_id must be"),
        ({"message_type": "group", "group_id": [1]}, "group_id must be"),
        ({"message_type": "group", "group_id": "a#b"}, "group_id must be"),
        ({"time": 1e20}, "time must be within 0..2\\*\\*32 Unix seconds"),
        ({"time": -1}, "time must be within"),
        ({"time": 2**32}, "time must be within"),
        ({"time": "1756168635"}, "time must be a number of Unix seconds"),
        ({"time": True}, "time must be a number"),
    ],
)
def test_onebot_bad_ids_and_times_are_malformed(fields: dict[str, Any], match: str) -> None:
    with pytest.raises(MalformedEvent, match=match):
        onebot().parse({}, raw(ob_event(**fields)))


@pytest.mark.parametrize("literal", ["NaN", "Infinity"])
def test_onebot_non_finite_time_is_malformed(literal: str) -> None:
    body = raw(ob_event(time=0)).replace(b'"time": 0', f'"time": {literal}'.encode())
    with pytest.raises(MalformedEvent, match="time must be within"):
        onebot().parse({}, body)


def test_onebot_decimal_string_ids_are_accepted_in_canonical_form() -> None:
    event = ob_event(
        time=1.5,
        self_id="10001",
        user_id="007400",
        message_id="-12",
        message_type="group",
        group_id="300000003",
    )
    assert onebot(masters=["7400"]).parse({}, raw(event)) == InboundMessage(
        platform="onebot11",
        bot_id=OB_SELF,
        message_id="-12",
        scene_type="group",
        scene_id="300000003",
        sender=Sender(id="7400", name="n", roles=["master"]),
        text="hi",
        segments=[{"type": "text", "data": {"text": "hi"}}],
        triggered=False,  # a group without a mention (trigger: mention)
        time_ms=1500,
    )


# --------------------------------------------------------------------------- 2. strict types (Telegram)


@pytest.mark.parametrize(
    ("update", "match"),
    [
        ({"message": tg_update()["message"]}, "update_id must be an integer, got None"),
        ({**tg_update(), "update_id": "1"}, "update_id must be an integer"),
        ({**tg_update(), "update_id": True}, "update_id must be an integer"),
        (tg_update(message_id=None), "message_id must be an integer, got None"),
        (tg_update(message_id=1.5), "message_id must be an integer"),
        (tg_update(message_id="77"), "message_id must be an integer"),
        (tg_update(message_id=...), "lacks message_id or date"),
        (tg_update(date=1e20), "date must be an integer"),
        (tg_update(date=10**20), "date must be within 0..2\\*\\*32"),
        (tg_update(date=-5), "date must be within"),
        (tg_update(chat={"id": {"a": 1}, "type": "private"}), "chat.id must be an integer"),
        (tg_update(chat={"id": "a#b", "type": "private"}), "chat.id must be an integer"),
        (tg_update(chat={"id": None, "type": "group"}), "chat.id must be an integer"),
        (tg_update(**{"from": {"id": None}}), "from.id must be an integer"),
        (tg_update(**{"from": {"id": 1.5}}), "from.id must be an integer"),
        (tg_update(**{"from": {"id": "a\n"}}), "from.id must be an integer"),
        (tg_update(**{"from": "x"}), "'from' must be an object"),
        (tg_update(entities="x"), "entities must be a list of objects"),
        (tg_update(entities=[5]), "entities must be a list of objects"),
        (tg_update(entities=[{"offset": 0, "length": "x", "type": "bold"}]), "entities length must be"),
        (tg_update(entities=[{"offset": -1, "length": 1, "type": "bold"}]), "entities offset must be"),
        (tg_update(entities=[{"offset": True, "length": 1, "type": "bold"}]), "entities offset must be"),
        (tg_update(text=..., caption="c", caption_entities={"a": 1}), "caption_entities must be a list"),
        (
            tg_update(entities=[{"offset": 0, "length": 5, "type": "text_mention", "user": {"id": None}}]),
            "text_mention user.id must be an integer",
        ),
        (tg_update(reply_to_message={"message_id": "x"}), "reply_to_message.message_id must be"),
        (tg_update(reply_to_message=5), "reply_to_message must be an object"),
        (tg_update(text=5), "text must be a string"),
        (tg_update(photo=[{"file_id": 5}]), "photo.file_id must be a non-empty string"),
    ],
)
def test_telegram_bad_types_are_malformed(update: dict[str, Any], match: str) -> None:
    with pytest.raises(MalformedEvent, match=match):
        telegram().parse({}, raw(update))


# ------------------------------------------------------------------- 2. surrogates, nesting, content type


def test_lone_surrogates_become_replacement_characters() -> None:
    event = ob_event(
        sender={"user_id": 7400, "nickname": "ab\ud83d", "card": ""},  # a nickname cut inside an emoji
        message=[{"type": "text", "data": {"text": "a\ud800b"}}],
    )
    body = raw(event)
    assert b"\\ud800" in body
    msg = onebot().parse({}, body)
    assert msg is not None
    assert (msg.text, msg.sender.name, msg.segments) == (
        "a\ufffdb",
        "ab\ufffd",
        [{"type": "text", "data": {"text": "a\ufffdb"}}],
    )
    msg.model_dump_json()  # storable: valid Unicode everywhere


def test_raw_surrogate_bytes_become_replacement_characters() -> None:
    body = raw(ob_event(message="X")).replace(b'"X"', b'"a\xed\xa0\x80b"')
    msg = onebot().parse({}, body)
    assert msg is not None and msg.text == "a\ufffdb"


def test_telegram_lone_surrogate_keeps_utf16_entity_offsets() -> None:
    update = tg_update(
        chat={"id": -100, "type": "group"},
        text="\ud800 @sessionray_bot hi",
        entities=[{"offset": 2, "length": 15, "type": "mention"}],
    )
    msg = telegram().parse({}, raw(update))
    assert msg is not None
    assert (msg.text, msg.segments, msg.mentioned_bot, msg.triggered) == (
        f"\ufffd @{TG_BOT} hi",
        [
            {"type": "text", "data": {"text": "\ufffd "}},
            {"type": "mention", "data": {"target": TG_BOT}},
            {"type": "text", "data": {"text": " hi"}},
        ],
        True,
        True,
    )


def test_telegram_entity_cutting_a_surrogate_pair_is_not_an_error() -> None:
    update = tg_update(text="😀x", entities=[{"offset": 1, "length": 2, "type": "bold"}])
    msg = telegram().parse({}, raw(update))
    assert msg is not None and msg.text == "😀x"


@pytest.mark.parametrize("body", [b'{"a":' * 100_000, b"[" * 200_000])
@pytest.mark.parametrize("make", [onebot, telegram])
def test_deeply_nested_json_is_malformed(make: Any, body: bytes) -> None:
    with pytest.raises(MalformedEvent, match="nested too deeply"):
        make().parse({}, body)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
@pytest.mark.parametrize("make", [onebot, telegram])
def test_non_json_content_type_is_malformed(make: Any, ctype: str) -> None:
    body = raw(ob_event() if make is onebot else tg_update())
    with pytest.raises(MalformedEvent, match="must be sent as application/json"):
        make().parse({"Content-Type": ctype}, body)


@pytest.mark.parametrize("ctype", ["application/json", "Application/JSON; charset=utf-8", None])
def test_json_content_types_are_accepted(ctype: str | None) -> None:
    headers = {} if ctype is None else {"content-type": ctype}
    msg = onebot().parse(headers, raw(ob_event()))
    assert msg is not None and msg.message_id == "42"


# --------------------------------------------------------------------------- 3. signatures


def test_onebot_non_ascii_signature_is_a_signature_error() -> None:
    c = onebot(secret="s3cret")
    body = raw(ob_event())
    good = "sha1=" + hmac.new(b"s3cret", body, hashlib.sha1).hexdigest()
    c.verify({"X-Signature": good.upper().replace("SHA1", "sha1")}, body)  # hex case is ignored
    for bad in ("sha1=\xe9\xe9", "sha1=\ud800", good + "\xe9"):
        with pytest.raises(SignatureError, match="does not match"):
            c.verify({"X-Signature": bad}, body)


def test_telegram_non_ascii_secret_header_is_a_signature_error() -> None:
    c = telegram(secret_token="tg-secret")
    for bad in ("tg-secr\xe9t", "\ud800"):
        with pytest.raises(SignatureError, match="does not match"):
            c.verify({"X-Telegram-Bot-Api-Secret-Token": bad}, b"{}")


# --------------------------------------------------------------------------- 4. OneBot segments


@pytest.mark.parametrize(
    ("segment", "match"),
    [
        ({"type": "text", "data": None}, "'data' must be an object"),
        ({"type": "text"}, "'data' must be an object"),
        ({"type": "text", "data": {"text": 5}}, "text segment data.text must be a string, got 5"),
        ({"type": "text", "data": {"text": ["a"]}}, "data.text must be a string"),
        ({"type": "at", "data": {"qq": {"a": 1}}}, "at segment data.qq must be a string or an integer"),
        ({"type": "at", "data": {"qq": True}}, "at segment data.qq must be"),
        ({"type": "image", "data": {"file": 5}}, "image segment data.file must be a string"),
        ({"type": "reply", "data": {"id": 1.5}}, "reply segment data.id must be"),
        ({"type": "share", "data": {"url": "https://e.com", "title": 7}}, "share segment data.title must be"),
    ],
)
def test_onebot_bad_segments_are_malformed(segment: dict[str, Any], match: str) -> None:
    with pytest.raises(MalformedEvent, match=match):
        onebot().parse({}, raw(ob_event(message=[segment])))


def test_onebot_segment_ids_as_integers_and_unknown_types_as_placeholders() -> None:
    segments = [
        {"type": "reply", "data": {"id": -2147483000}},
        {"type": "at", "data": {"qq": 10001}},
        {"type": "face", "data": {"id": 14}},
        {"type": "poke", "data": {"type": "1", "id": "-1"}},
        {"type": "at", "data": {"qq": "all"}},
    ]
    msg = onebot().parse({}, raw(ob_event(message=segments)))
    assert msg is not None
    assert (msg.segments, msg.text, msg.reply_to, msg.mentioned_bot) == (
        [
            {"type": "reply", "data": {"message_id": "-2147483000"}},
            {"type": "mention", "data": {"target": "10001"}},
            {"type": "face", "data": {"id": "14"}},
            {"type": "text", "data": {"text": "[poke]"}},
            {"type": "mention", "data": {"target": "all"}},
        ],
        "@10001 [poke]@all",
        "-2147483000",
        True,
    )


# --------------------------------------------------------------------------- 5. CQ-code parser


def test_cq_parser_handles_80000_codes() -> None:
    segments = cqcode.parse_cq("[CQ:at,qq=1]" * 80_000)
    assert len(segments) == 80_000
    assert all(s == {"type": "at", "data": {"qq": "1"}} for s in segments)


def test_onebot_message_segment_limit() -> None:
    at_most = onebot().parse({}, raw(ob_event(message="[CQ:face,id=1]x" * (MAX_SEGMENTS // 2))))
    assert at_most is not None and len(at_most.segments) == MAX_SEGMENTS
    for message in (
        "[CQ:at,qq=1]" * 80_000,  # the attack's ~1 MB body: refused before parsing
        "[CQ:face,id=1]x" * (MAX_SEGMENTS // 2) + "[CQ:dice]",
        [{"type": "dice", "data": {}}] * (MAX_SEGMENTS + 1),
    ):
        with pytest.raises(MalformedEvent, match=f"OneBot message has more than {MAX_SEGMENTS} segments"):
            onebot().parse({}, raw(ob_event(message=message)))


def test_cq_parser_unescapes_and_keeps_text_between_codes() -> None:
    text = "&#91;a&#93;&amp;#91;[CQ:share,url=https://e.com/?a=1&#44;2,title=T&amp;C][CQ:dice]b&#44;"
    assert cqcode.parse_cq(text) == [
        {"type": "text", "data": {"text": "[a]&#91;"}},
        {"type": "share", "data": {"url": "https://e.com/?a=1,2", "title": "T&C"}},
        {"type": "dice", "data": {}},
        {"type": "text", "data": {"text": "b,"}},
    ]
    assert cqcode.parse_cq("[CQ:at,qq=1") == [{"type": "text", "data": {"text": "[CQ:at,qq=1"}}]

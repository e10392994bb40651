"""Telegram codec: every fixture update parsed, triggers, secret token, rendering, splitting, results."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.platforms.base import (
    InboundMessage,
    MalformedEvent,
    RenderTarget,
    Sender,
    SendResult,
    SignatureError,
)
from runtime.platforms.telegram import TelegramCodec, utf16_slice
from runtime.reply.segments import Reply

TOKEN = "1000000099:AAF-test-token"
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def codec(**kw: Any) -> TelegramCodec:
    kw.setdefault("bot_id", "1000000099")
    kw.setdefault("token", TOKEN)
    kw.setdefault("username", "sessionray_bot")
    return TelegramCodec(**kw)


def group_update(text: str, entities: list[dict[str, Any]], **extra: Any) -> bytes:
    msg = {
        "message_id": 77,
        "date": 1721592580,
        "chat": {"id": -1001293752024, "title": "CryptoInside Chat", "type": "supergroup"},
        "from": {"id": 1000000011, "is_bot": False, "first_name": "Test User One"},
        "text": text,
        "entities": entities,
        **extra,
    }
    return json.dumps({"update_id": 1, "message": msg}).encode()


# --------------------------------------------------------------------------- fixtures


def test_private_text_update(load: Any) -> None:
    msg = codec(masters=["1111111"]).parse({}, load("telegram/update_private_text.json"))
    assert msg == InboundMessage(
        platform="telegram",
        bot_id="1000000099",
        message_id="1111111:1365",  # unique per bot: "<chat.id>:<message_id>"
        scene_type="private",
        scene_id="1111111",
        sender=Sender(id="1111111", name="Test Firstname Test Lastname", roles=["master"]),
        text="/start",
        segments=[{"type": "text", "data": {"text": "/start"}}],
        reply_to=None,
        mentioned_bot=False,
        triggered=True,
        time_ms=1441645532000,
    )
    assert msg.session_key == "telegram:1000000099:private:1111111"


def test_supergroup_reply_with_bot_command(load: Any) -> None:
    msg = codec().parse({}, load("telegram/update_supergroup_reply_bot_command.json"))
    assert msg == InboundMessage(
        platform="telegram",
        bot_id="1000000099",
        message_id="-1001293752024:134546",
        scene_type="group",
        scene_id="-1001293752024",
        sender=Sender(id="1000000011", name="Test User One", roles=[]),
        text="/report",
        segments=[
            {"type": "reply", "data": {"message_id": "134545"}},
            {"type": "text", "data": {"text": "/report"}},
        ],
        reply_to="134545",
        mentioned_bot=False,  # the quoted message is Bobb's, not the bot's
        triggered=True,  # a command triggers
        time_ms=1721592580000,
    )
    assert msg.session_key == "telegram:1000000099:group:-1001293752024"


def test_photo_with_caption(load_json: Any) -> None:
    message = load_json("telegram/message_photo_caption.json")
    msg = codec().parse({}, json.dumps({"update_id": 5, "message": message}).encode())
    assert msg == InboundMessage(
        platform="telegram",
        bot_id="1000000099",
        message_id="10000001:3460",
        scene_type="private",
        scene_id="10000001",
        sender=Sender(id="10000001", name="Alice Example Name", roles=[]),
        text="www.example.com",
        segments=[
            {"type": "image", "data": {"media": {"kind": "file", "value": message["photo"][3]["file_id"]}}},
            {"type": "text", "data": {"text": "www.example.com"}},
        ],
        reply_to=None,
        mentioned_bot=False,
        triggered=True,
        time_ms=1655671349000,
    )


def test_non_message_updates_ignored() -> None:
    c = codec()
    assert c.parse({}, b'{"update_id": 1, "edited_message": {"message_id": 1}}') is None
    chan = {"update_id": 2, "message": {"message_id": 1, "date": 1, "chat": {"id": -100, "type": "channel"}}}
    assert c.parse({}, json.dumps(chan).encode()) is None


# --------------------------------------------------------------------------- triggers in groups


def test_group_without_trigger_is_not_triggered() -> None:
    msg = codec().parse({}, group_update("just chatting", []))
    assert msg is not None and (msg.mentioned_bot, msg.triggered) == (False, False)
    always = codec(trigger="always").parse({}, group_update("just chatting", []))
    assert always is not None and always.triggered is True
    kw = codec(trigger="keyword", keywords=["CHAT"]).parse({}, group_update("just chatting", []))
    assert kw is not None and kw.triggered is True


def test_mention_entity_of_bot_username_with_utf16_offsets() -> None:
    text = "😀 hey @SessionRay_Bot look, @someone"
    # 😀 is 2 UTF-16 units: "@SessionRay_Bot" starts at unit 7
    body = group_update(
        text, [{"type": "mention", "offset": 7, "length": 15}, {"type": "mention", "offset": 29, "length": 8}]
    )
    msg = codec().parse({}, body)
    assert msg is not None
    assert msg.segments == [
        {"type": "text", "data": {"text": "😀 hey "}},
        {"type": "mention", "data": {"target": "1000000099"}},
        {"type": "text", "data": {"text": " look, @someone"}},
    ]
    assert (msg.text, msg.mentioned_bot, msg.triggered) == ("😀 hey @1000000099 look, @someone", True, True)


def test_text_mention_of_bot_id_and_of_another_user() -> None:
    text = "ask Bot and Ann"
    body = group_update(
        text,
        [
            {
                "type": "text_mention",
                "offset": 4,
                "length": 3,
                "user": {"id": 1000000099, "is_bot": True, "first_name": "B"},
            },
            {
                "type": "text_mention",
                "offset": 12,
                "length": 3,
                "user": {"id": 42, "is_bot": False, "first_name": "Ann"},
            },
        ],
    )
    msg = codec().parse({}, body)
    assert msg is not None
    assert msg.segments == [
        {"type": "text", "data": {"text": "ask "}},
        {"type": "mention", "data": {"target": "1000000099"}},
        {"type": "text", "data": {"text": " and "}},
        {"type": "mention", "data": {"target": "42"}},
    ]
    assert (msg.mentioned_bot, msg.triggered) == (True, True)
    only_ann = codec().parse(
        {},
        group_update(
            "hi Ann",
            [{"type": "text_mention", "offset": 3, "length": 3, "user": {"id": 42, "first_name": "Ann"}}],
        ),
    )
    assert only_ann is not None and (only_ann.mentioned_bot, only_ann.triggered) == (False, False)


def test_reply_to_bot_message_triggers() -> None:
    reply_to = {
        "message_id": 70,
        "date": 1,
        "chat": {"id": -1001293752024, "type": "supergroup"},
        "from": {"id": 1000000099, "is_bot": True, "first_name": "Bot"},
        "text": "earlier answer",
    }
    msg = codec().parse({}, group_update("thanks", [], reply_to_message=reply_to))
    assert msg is not None
    assert (msg.reply_to, msg.mentioned_bot, msg.triggered) == ("70", True, True)


def test_command_addressed_to_another_bot_does_not_trigger() -> None:
    mine = codec().parse(
        {}, group_update("/help@sessionray_bot", [{"type": "bot_command", "offset": 0, "length": 20}])
    )
    other = codec().parse(
        {}, group_update("/help@other_bot", [{"type": "bot_command", "offset": 0, "length": 15}])
    )
    assert mine is not None and mine.triggered is True
    assert other is not None and other.triggered is False


def test_utf16_slice() -> None:
    assert utf16_slice("a😀b𝄞c", 1, 2) == "😀"
    assert utf16_slice("a😀b𝄞c", 3, 3) == "b𝄞"


# --------------------------------------------------------------------------- verify / malformed


def test_secret_token(load: Any) -> None:
    body = load("telegram/update_private_text.json")
    c = codec(secret_token="tg-secret")
    c.verify({"X-Telegram-Bot-Api-Secret-Token": "tg-secret"}, body)
    with pytest.raises(SignatureError, match="does not match"):
        c.verify({"X-Telegram-Bot-Api-Secret-Token": "nope"}, body)
    with pytest.raises(SignatureError, match="missing"):
        c.verify({}, body)
    codec().verify({}, body)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"not json", "not valid JSON"),
        (b"[]", "JSON object"),
        (b'{"update_id": 1, "message": 5}', "must be an object"),
        (b'{"update_id": 1, "message": {"message_id": 1, "date": 1}}', "chat"),
        (b'{"update_id": 1, "message": {"date": 1, "chat": {"id": 1, "type": "private"}}}', "message_id"),
    ],
)
def test_malformed(body: bytes, match: str) -> None:
    with pytest.raises(MalformedEvent, match=match):
        codec().parse({}, body)


# --------------------------------------------------------------------------- rendering


def bodies(calls: list[Any]) -> list[tuple[str, Any]]:
    return [
        (c.path.rsplit("/", 1)[1], c.json_body if c.json_body is not None else (c.form, c.files))
        for c in calls
    ]


def test_render_every_segment_type(tmp_path: Path, degraded: Any) -> None:
    (tmp_path / "pic.png").write_bytes(PNG)
    reply = Reply.model_validate(
        {
            "segments": [
                {"type": "reply", "data": {"message_id": "134546"}},
                {"type": "markdown", "data": {"content": "**Result** for <you> & `a<b`\n"}},
                {"type": "text", "data": {"text": "please 1 < 2 "}},
                {"type": "mention", "data": {"target": "123456789"}},
                {"type": "share", "data": {"url": "https://e.com/?a=1&b=2", "title": "E & co"}},
                {"type": "face", "data": {"id": 14}},
                {"type": "rps", "data": {}},
                {"type": "forward", "data": {"forward_id": "fw-9"}},
                {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.com/r.png"}}},
                {"type": "audio", "data": {"media": {"kind": "file", "value": "AwACAgQ"}}},
                {
                    "type": "video",
                    "data": {"media": {"kind": "base64", "value": base64.b64encode(PNG).decode()}},
                },
                {"type": "file", "data": {"media": {"kind": "path", "value": "pic.png"}}},
                {"type": "dice", "data": {}},
                {"type": "text", "data": {"text": "bye"}},
            ]
        }
    )
    c = codec(media_dir=tmp_path)
    calls = c.render(reply, RenderTarget(scene_type="group", scene_id="-1001293752024", reply_to="134546"))
    chat = -1001293752024
    assert {c.base_url for c in calls} == {"https://api.telegram.org"}
    assert {c.path.rsplit("/", 1)[0] for c in calls} == {f"/bot{TOKEN}"}
    # The text before the media run is the photo's caption (the run is followed by dice, not text);
    # image / audio / video / file cannot share albums in this order, so each goes alone.
    assert [c.kind for c in calls] == ["photo", "audio", "video", "document", "dice", "message"]
    assert bodies(calls) == [
        (
            "sendPhoto",
            {
                "chat_id": chat,
                "photo": "https://example.com/r.png",
                "caption": "<b>Result</b> for &lt;you&gt; &amp; <code>a&lt;b</code>\nplease 1 &lt; 2 "
                '<a href="tg://user?id=123456789">@123456789</a>'
                '<a href="https://e.com/?a=1&amp;b=2">E &amp; co</a>'
                "[face 14][rock-paper-scissors][forward fw-9]",
                "parse_mode": "HTML",
                "reply_parameters": {"message_id": 134546},
            },
        ),
        ("sendAudio", {"chat_id": chat, "audio": "AwACAgQ"}),
        ("sendVideo", ({"chat_id": str(chat)}, {"video": calls[2].files["video"]})),
        ("sendDocument", ({"chat_id": str(chat)}, {"document": calls[3].files["document"]})),
        ("sendDice", {"chat_id": chat}),
        ("sendMessage", {"chat_id": chat, "text": "bye", "parse_mode": "HTML"}),
    ]
    video, document = calls[2].files["video"], calls[3].files["document"]
    assert (video.filename, video.content_type, video.data) == ("video.png", "image/png", PNG)
    assert (document.filename, document.content_type, document.data) == ("pic.png", "image/png", PNG)
    assert degraded.delta() == {("telegram", t): 1.0 for t in ("share", "face", "rps", "forward")}


def test_render_private_no_implicit_quote_and_multipart_reply_parameters() -> None:
    c = codec()
    (call,) = c.render(
        Reply.of_text("hi"), RenderTarget(scene_type="private", scene_id="1111111", reply_to="1365")
    )
    assert call.json_body == {"chat_id": 1111111, "text": "hi", "parse_mode": "HTML"}
    reply = Reply.model_validate(
        {
            "segments": [
                {"type": "reply", "data": {"message_id": "9"}},
                {
                    "type": "image",
                    "data": {"media": {"kind": "base64", "value": base64.b64encode(PNG).decode()}},
                },
            ]
        }
    )
    (photo,) = c.render(reply, RenderTarget(scene_type="private", scene_id="1111111"))
    assert photo.form == {"chat_id": "1111111", "reply_parameters": '{"message_id": 9}'}
    assert photo.files is not None and photo.files["photo"].filename == "photo.png"
    assert c.render(Reply(segments=[]), RenderTarget(scene_type="private", scene_id="1")) == []
    assert c.render(Reply.of_text("  \n"), RenderTarget(scene_type="private", scene_id="1")) == []


def test_long_text_split_on_utf16_boundaries() -> None:
    text = "你" * 4000 + "😀" * 200 + "é" * 100  # 4,300 code points, 4,500 UTF-16 units (😀 is 2)
    calls = codec().render(Reply.of_text(text), RenderTarget(scene_type="group", scene_id="-5", reply_to="3"))
    texts = [c.json_body["text"] for c in calls if c.json_body]
    assert [len(t.encode("utf-16-le")) // 2 for t in texts] == [4096, 404]
    assert "".join(texts) == text
    assert texts[0] == "你" * 4000 + "😀" * 48
    assert [c.json_body.get("reply_parameters") for c in calls if c.json_body] == [{"message_id": 3}, None]


def test_long_formatted_text_split_keeps_html_balanced() -> None:
    md = "**" + "a<" * 2500 + "**"  # 5,000 bold characters, each '<' escaped to 4 HTML characters
    calls = codec().render(
        Reply.model_validate({"segments": [{"type": "markdown", "data": {"content": md}}]}),
        RenderTarget(scene_type="private", scene_id="1"),
    )
    texts = [c.json_body["text"] for c in calls if c.json_body]
    assert texts == ["<b>" + "a&lt;" * 2048 + "</b>", "<b>" + "a&lt;" * 452 + "</b>"]


def test_markdown_to_html() -> None:
    md = (
        "# Title\n- one\n- [link](https://a.b/?q=1&r=2)\n> quoted\n"
        "```python\nif a < b:\n    pass\n```\n~~s~~ _it_ snake_case 2*3*4 ![alt](https://i/p.png)"
    )
    (call,) = codec().render(
        Reply.model_validate({"segments": [{"type": "markdown", "data": {"content": md}}]}),
        RenderTarget(scene_type="private", scene_id="1"),
    )
    assert call.json_body is not None
    assert call.json_body["text"] == (
        '<b>Title</b>\n• one\n• <a href="https://a.b/?q=1&amp;r=2">link</a>\n<blockquote>quoted</blockquote>\n'
        '<pre><code class="language-python">if a &lt; b:\n    pass</code></pre>\n'
        '<s>s</s> <i>it</i> snake_case 2*3*4 <a href="https://i/p.png">alt</a>'
    )


# --------------------------------------------------------------------------- send results


def test_send_results(load: Any) -> None:
    c = codec()
    assert c.parse_send_result(200, {}, load("telegram/api_sendMessage_response.json")) == SendResult(
        ok=True,
        message_id="123456789:40",  # "<chat.id>:<message_id>", unique per bot
    )
    too_many = (
        b'{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 5",'
        b'"parameters":{"retry_after":5}}'
    )
    assert c.parse_send_result(429, {}, too_many) == SendResult(
        ok=False, error="429: Too Many Requests: retry after 5", retry_after_s=5.0, retryable=True
    )
    bad = b'{"ok":false,"error_code":400,"description":"Bad Request: chat not found"}'
    assert c.parse_send_result(400, {}, bad) == SendResult(ok=False, error="400: Bad Request: chat not found")
    assert c.parse_send_result(502, {"Retry-After": "2"}, b"<html>bad gateway</html>") == SendResult(
        ok=False, error="HTTP 502: <html>bad gateway</html>", retry_after_s=2.0, retryable=True
    )


def test_render_and_send_over_http(api_server: Any) -> None:
    c = codec(api_base=api_server.base_url)
    reply = Reply.model_validate(
        {
            "segments": [
                {"type": "text", "data": {"text": "look"}},
                {
                    "type": "image",
                    "data": {"media": {"kind": "base64", "value": base64.b64encode(PNG).decode()}},
                },
                {"type": "text", "data": {"text": "x" * 1025}},  # too long for a caption
            ]
        }
    )
    api_server.fail_next(1, 429, retry_after=3)
    calls = c.render(reply, RenderTarget(scene_type="private", scene_id="1111111"))
    results = []
    for call in [calls[0], *calls]:  # the first one is answered 429 once, then resent
        files = {k: (f.filename, f.data, f.content_type) for k, f in (call.files or {}).items()}
        resp = httpx.post(call.url, json=call.json_body, data=call.form, files=files or None)
        results.append(c.parse_send_result(resp.status_code, resp.headers, resp.content))
    assert results == [
        SendResult(ok=False, error="429: Too Many Requests: retry later", retry_after_s=3.0, retryable=True),
        SendResult(ok=True, message_id="123456789:40"),  # the recorded answer's chat.id
        SendResult(ok=True, message_id="123456789:40"),
    ]
    recs = api_server.requests
    # "look" is the caption (a multipart string field, not JSON); the long text follows alone.
    assert [r.path for r in recs] == [f"/bot{TOKEN}/sendPhoto"] * 2 + [f"/bot{TOKEN}/sendMessage"]
    assert recs[1].form == {"chat_id": "1111111", "caption": "look", "parse_mode": "HTML"}
    assert (
        recs[1].files["photo"].filename,
        recs[1].files["photo"].content_type,
        recs[1].files["photo"].data,
    ) == ("photo.png", "image/png", PNG)
    assert recs[2].json == {"chat_id": 1111111, "text": "x" * 1025, "parse_mode": "HTML"}


def test_unreadable_upload_becomes_a_counted_notice(tmp_path: Path, rejected: Any) -> None:
    reply = Reply.model_validate(
        {
            "segments": [
                {"type": "text", "data": {"text": "a "}},
                {"type": "image", "data": {"media": {"kind": "path", "value": "missing.png"}}},
                {"type": "audio", "data": {"media": {"kind": "base64", "value": "!!not base64"}}},
            ]
        }
    )
    calls = codec(media_dir=tmp_path).render(reply, RenderTarget(scene_type="private", scene_id="5"))
    assert [c.json_body for c in calls] == [
        {"chat_id": 5, "text": "a [attachment unavailable][attachment unavailable]", "parse_mode": "HTML"}
    ]
    assert rejected.delta() == {"not_found": 1.0, "bad_base64": 1.0}

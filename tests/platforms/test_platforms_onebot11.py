"""OneBot v11 codec: every fixture event parsed, CQ ⇄ array, signatures, rendering, send results."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.platforms import cqcode
from runtime.platforms.base import (
    InboundMessage,
    MalformedEvent,
    RenderTarget,
    Sender,
    SendResult,
    SignatureError,
)
from runtime.platforms.onebot11 import OneBot11Codec, from_onebot_segments
from runtime.reply.segments import Reply

SECRET = "s3cret"


def codec(**kw: Any) -> OneBot11Codec:
    kw.setdefault("self_id", "1000000001")
    return OneBot11Codec(**kw)


def signed(body: bytes, secret: str = SECRET) -> dict[str, str]:
    return {"X-Signature": "sha1=" + hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()}


# --------------------------------------------------------------------------- inbound fixtures


def test_private_message_array(load: Any) -> None:
    msg = codec(masters=["200000002"]).parse({}, load("onebot11/event_private_message_array.json"))
    assert msg == InboundMessage(
        platform="onebot11",
        bot_id="1000000001",
        message_id="799899884",
        scene_type="private",
        scene_id="200000002",
        sender=Sender(id="200000002", name="\u3000", roles=["master"]),
        text="33",
        segments=[{"type": "text", "data": {"text": "33"}}],
        reply_to=None,
        mentioned_bot=False,
        triggered=True,
        time_ms=1756168635000,
    )
    assert msg.session_key == "onebot11:1000000001:private:200000002"


def test_group_message_array_not_mentioned(load: Any) -> None:
    body = load("onebot11/event_group_message_array.json")
    msg = codec().parse({}, body)
    assert msg == InboundMessage(
        platform="onebot11",
        bot_id="1000000001",
        message_id="70440311",
        scene_type="group",
        scene_id="300000003",
        sender=Sender(id="200000002", name="\u3000", roles=["owner"]),
        text="3",
        segments=[{"type": "text", "data": {"text": "3"}}],
        reply_to=None,
        mentioned_bot=False,
        triggered=False,
        time_ms=1756168837000,
    )
    assert msg.session_key == "onebot11:1000000001:group:300000003"
    # trigger modes: always → triggered; keyword "3" → triggered; keyword "x" → not
    always = codec(trigger="always").parse({}, body)
    assert always is not None and always.triggered is True
    kw = codec(trigger="keyword", keywords=["3"]).parse({}, body)
    assert kw is not None and kw.triggered is True
    kw_miss = codec(trigger="keyword", keywords=["x"]).parse({}, body)
    assert kw_miss is not None and kw_miss.triggered is False


def test_private_message_cqstring(load: Any) -> None:
    msg = codec(self_id="10001000").parse({}, load("onebot11/event_private_message_cqstring.json"))
    assert msg == InboundMessage(
        platform="onebot11",
        bot_id="10001000",
        message_id="12",
        scene_type="private",
        scene_id="12345678",
        sender=Sender(id="12345678", name="小不点", roles=[]),
        text="你好～",
        segments=[{"type": "text", "data": {"text": "你好～"}}],
        reply_to=None,
        mentioned_bot=False,
        triggered=True,
        time_ms=1515204254000,
    )


@pytest.mark.parametrize("name", ["event_meta_heartbeat.json", "event_notice_friend_recall.json"])
def test_notice_and_meta_events_ignored(load: Any, name: str) -> None:
    assert codec().parse({}, load(f"onebot11/{name}")) is None


def test_cq_string_and_array_give_the_same_segments(load: Any, load_json: Any) -> None:
    array = load_json("onebot11/message_segments_array.json")
    cq = load("onebot11/message_segments_cqstring.txt").decode().rstrip("\n")
    assert cqcode.parse_cq(cq) == array
    expected = [
        {"type": "text", "data": {"text": "[第一部分]"}},
        {"type": "image", "data": {"media": {"kind": "file", "value": "123.jpg"}}},
        {"type": "text", "data": {"text": "图片之后的部分，表情："}},
        {"type": "face", "data": {"id": "123"}},
    ]
    assert from_onebot_segments(array) == expected
    # the same through whole events, one per form
    event = load_json("onebot11/event_private_message_array.json")
    c = codec()
    as_array = c.parse({}, json.dumps({**event, "message": array}).encode())
    as_string = c.parse({}, json.dumps({**event, "message": cq}).encode())
    assert as_array is not None and as_string is not None
    assert as_array.segments == as_string.segments == expected
    assert as_array.text == as_string.text == "[第一部分]图片之后的部分，表情："
    # and back: array → CQ string reproduces the spec's escaped string
    assert cqcode.to_cq(array) == cq


def test_cq_escaping_round_trip() -> None:
    segs = [
        {"type": "text", "data": {"text": "a&b [x] &#91;"}},
        {"type": "share", "data": {"url": "https://e.com/?a=1,b=[2]&c", "title": "t,i]t[le"}},
    ]
    s = cqcode.to_cq(segs)
    assert (
        s
        == "a&amp;b &#91;x&#93; &amp;#91;[CQ:share,url=https://e.com/?a=1&#44;b=&#91;2&#93;&amp;c,title=t&#44;i&#93;t&#91;le]"
    )
    assert cqcode.parse_cq(s) == segs


def test_napcat_segment_samples_and_mention_of_self(load_json: Any) -> None:
    samples = load_json("onebot11/message_segments_napcat_samples.json")
    segs = from_onebot_segments(samples)
    url0, url1 = samples[3]["data"]["url"], samples[4]["data"]["url"]
    assert segs == [
        {"type": "text", "data": {"text": "33"}},
        {"type": "face", "data": {"id": "187"}},
        {"type": "face", "data": {"id": "338"}},
        {"type": "image", "data": {"media": {"kind": "url", "value": url0}}},
        {"type": "image", "data": {"media": {"kind": "url", "value": url1}}},
        {"type": "mention", "data": {"target": "1000000001"}},
        {"type": "reply", "data": {"message_id": "1481434866"}},
    ]
    group = load_json("onebot11/event_group_message_array.json")
    msg = codec().parse({}, json.dumps({**group, "message": samples}).encode())
    assert msg is not None
    assert (msg.mentioned_bot, msg.triggered, msg.reply_to, msg.text) == (
        True,
        True,
        "1481434866",
        "33@1000000001",
    )


def test_other_segment_types_inbound() -> None:
    segs = from_onebot_segments(
        [
            {"type": "record", "data": {"file": "a.amr"}},
            {"type": "video", "data": {"file": "https://e.com/v.mp4"}},
            {"type": "file", "data": {"file": "ref123"}},
            {"type": "forward", "data": {"id": "fw1"}},
            {"type": "dice", "data": {"result": "3"}},
            {"type": "rps", "data": {}},
            {"type": "share", "data": {"url": "https://e.com", "title": "E"}},
            {"type": "json", "data": {"data": "{}"}},
        ]
    )
    assert segs == [
        {"type": "audio", "data": {"media": {"kind": "file", "value": "a.amr"}}},
        {"type": "video", "data": {"media": {"kind": "url", "value": "https://e.com/v.mp4"}}},
        {"type": "file", "data": {"media": {"kind": "file", "value": "ref123"}}},
        {"type": "forward", "data": {"forward_id": "fw1"}},
        {"type": "dice", "data": {}},
        {"type": "rps", "data": {}},
        {"type": "share", "data": {"url": "https://e.com", "title": "E"}},
        {"type": "text", "data": {"text": "[json]"}},
    ]


# --------------------------------------------------------------------------- verify / malformed


def test_signature(load: Any) -> None:
    body = load("onebot11/event_private_message_array.json")
    c = codec(secret=SECRET)
    c.verify(signed(body), body)
    c.verify({"x-signature": signed(body)["X-Signature"]}, body)  # header names are case-insensitive
    with pytest.raises(SignatureError, match="does not match"):
        c.verify(signed(body, "wrong"), body)
    with pytest.raises(SignatureError, match="does not match"):
        c.verify(signed(body), body + b" ")
    with pytest.raises(SignatureError, match="missing"):
        c.verify({}, body)
    codec().verify({}, body)  # no secret configured: nothing to check


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "post_type"),
        (b'{"post_type": "wat"}', "unknown OneBot post_type"),
        (
            b'{"post_type": "message", "self_id": 1000000001, "message_type": "private"}',
            "lacks message_id, user_id, message",
        ),
        (
            b'{"post_type": "message", "self_id": 1000000001, '
            b'"message_type": "guild", "message_id": 1, "user_id": 2, '
            b'"message": "x"}',
            "unsupported OneBot message_type",
        ),
        (
            b'{"post_type": "message", "self_id": 1000000001, '
            b'"message_type": "group", "message_id": 1, "user_id": 2, '
            b'"message": "x"}',
            "lacks group_id",
        ),
        (
            b'{"post_type": "message", "self_id": 1000000001, '
            b'"message_type": "private", "message_id": 1, "user_id": 2, '
            b'"message": 5}',
            "segment array or a CQ-code string",
        ),
        (
            b'{"post_type": "message", "self_id": 1000000001, '
            b'"message_type": "private", "message_id": 1, "user_id": 2, '
            b'"message": [{"data": {}}]}',
            "string 'type'",
        ),
        (
            b'{"post_type": "message", "self_id": 9, "message_type": "private", "message_id": 1, '
            b'"user_id": 2, "message": "x"}',
            "posted to bot 1000000001",
        ),
    ],
)
def test_malformed(body: bytes, match: str) -> None:
    with pytest.raises(MalformedEvent, match=match):
        codec().parse({}, body)


# --------------------------------------------------------------------------- rendering

EVERY_SEGMENT = {
    "segments": [
        {"type": "markdown", "data": {"content": "**Result**\n"}},
        {"type": "text", "data": {"text": "please "}},
        {"type": "mention", "data": {"target": "123456789"}},
        {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.com/r.png"}}},
        {"type": "audio", "data": {"media": {"kind": "base64", "value": "AAAA"}}},
        {"type": "video", "data": {"media": {"kind": "file", "value": "vid-ref"}}},
        {"type": "file", "data": {"media": {"kind": "path", "value": "docs/report.pdf"}}},
        {"type": "reply", "data": {"message_id": "555"}},
        {"type": "forward", "data": {"forward_id": "fw-9"}},
        {"type": "face", "data": {"id": 14}},
        {"type": "dice", "data": {}},
        {"type": "rps", "data": {}},
        {"type": "share", "data": {"url": "https://e.com", "title": "E"}},
    ]
}


def test_render_every_segment_type(tmp_path: Path, degraded: Any) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "report.pdf").write_bytes(b"%PDF-1.4")
    c = codec(access_token="tok", media_dir=tmp_path, api_base="http://127.0.0.1:5700/")
    reply = Reply.model_validate(EVERY_SEGMENT)
    calls = c.render(reply, RenderTarget(scene_type="group", scene_id="300000003", reply_to="70440311"))
    assert [c.model_dump() for c in calls] == [
        {
            "method": "POST",
            "base_url": "http://127.0.0.1:5700/",
            "path": "/send_group_msg",
            "json_body": {
                "group_id": 300000003,
                "message": [
                    {"type": "text", "data": {"text": "**Result**\n"}},
                    {"type": "text", "data": {"text": "please "}},
                    {"type": "at", "data": {"qq": "123456789"}},
                    {"type": "image", "data": {"file": "https://example.com/r.png"}},
                    {"type": "record", "data": {"file": "base64://AAAA"}},
                    {"type": "video", "data": {"file": "vid-ref"}},
                    {
                        "type": "file",
                        "data": {
                            "file": (tmp_path / "docs/report.pdf").resolve().as_uri(),
                            "name": "report.pdf",
                        },
                    },
                    {"type": "reply", "data": {"id": "555"}},
                    {"type": "text", "data": {"text": "[forward fw-9]"}},
                    {"type": "face", "data": {"id": "14"}},
                    {"type": "dice", "data": {}},
                    {"type": "rps", "data": {}},
                    {"type": "share", "data": {"url": "https://e.com", "title": "E"}},
                ],
            },
            "form": None,
            "files": None,
            "headers": {"Authorization": "Bearer tok"},
            "kind": "message",
        }
    ]
    assert calls[0].url == "http://127.0.0.1:5700/send_group_msg"
    assert degraded.delta() == {("onebot11", "markdown"): 1.0, ("onebot11", "forward"): 1.0}
    assert c.supported_segments | {"markdown", "forward"} == {
        "text",
        "markdown",
        "mention",
        "image",
        "audio",
        "video",
        "file",
        "reply",
        "forward",
        "face",
        "dice",
        "rps",
        "share",
    }
    assert "forward" not in c.supported_segments  # without forward_api a forward is degraded


def test_render_private_quotes_nothing_and_group_quotes_the_inbound() -> None:
    c = codec()
    reply = Reply.of_text("hi")
    private = c.render(reply, RenderTarget(scene_type="private", scene_id="200000002", reply_to="799899884"))
    assert [(x.path, x.json_body, x.headers) for x in private] == [
        (
            "/send_private_msg",
            {"user_id": 200000002, "message": [{"type": "text", "data": {"text": "hi"}}]},
            {},
        )
    ]
    group = c.render(reply, RenderTarget(scene_type="group", scene_id="300000003", reply_to="70440311"))
    assert [x.json_body for x in group] == [
        {
            "group_id": 300000003,
            "message": [
                {"type": "reply", "data": {"id": "70440311"}},
                {"type": "text", "data": {"text": "hi"}},
            ],
        }
    ]
    assert c.render(Reply(segments=[]), RenderTarget(scene_type="group", scene_id="1")) == []


def test_render_path_outside_media_dir_becomes_a_counted_notice(tmp_path: Path, rejected: Any) -> None:
    reply = Reply.model_validate(
        {"segments": [{"type": "image", "data": {"media": {"kind": "path", "value": "../x.png"}}}]}
    )
    for c in (codec(media_dir=tmp_path), codec()):  # escaping path; no media directory at all
        (call,) = c.render(reply, RenderTarget(scene_type="private", scene_id="1"))
        assert call.json_body == {
            "user_id": 1,
            "message": [{"type": "text", "data": {"text": "[attachment unavailable]"}}],
        }
    assert rejected.delta() == {"outside_media_dir": 2.0}


# --------------------------------------------------------------------------- send results


def test_send_results(load: Any) -> None:
    c = codec()
    assert c.parse_send_result(200, {}, load("onebot11/api_response_ok_napcat.json")) == SendResult(
        ok=True, message_id="1936658337"
    )
    assert c.parse_send_result(200, {}, load("onebot11/api_response_failed_1404.json")) == SendResult(
        ok=False, error="retcode 1404: failed"
    )
    assert c.parse_send_result(200, {}, b'{"status":"async","retcode":1,"data":null}') == SendResult(ok=True)
    assert c.parse_send_result(
        200, {}, b'{"status":"failed","retcode":100,"data":null,"message":"bad","wording":"group not found"}'
    ) == SendResult(ok=False, error="retcode 100: group not found")
    assert c.parse_send_result(429, {"Retry-After": "7"}, b"slow down") == SendResult(
        ok=False, error="HTTP 429: slow down", retry_after_s=7.0, retryable=True
    )
    assert c.parse_send_result(503, {}, b"") == SendResult(ok=False, error="HTTP 503: ", retryable=True)
    assert c.parse_send_result(401, {}, b"") == SendResult(ok=False, error="HTTP 401: ", retryable=False)


def test_render_and_send_over_http(api_server: Any, load: Any) -> None:
    """The rendered call, sent over loopback to the platform API stand-in, then read back."""
    c = codec(access_token="tok", api_base=api_server.base_url)
    for scene_type, scene_id in (("private", "200000002"), ("group", "300000003")):
        (call,) = c.render(Reply.of_text("pong"), RenderTarget(scene_type=scene_type, scene_id=scene_id))
        resp = httpx.post(call.url, json=call.json_body, headers=call.headers)
        assert c.parse_send_result(resp.status_code, resp.headers, resp.content) == SendResult(
            ok=True, message_id="1936658337"
        )
    api_server.fail_retcode("/send_group_msg")
    (call,) = c.render(Reply.of_text("pong"), RenderTarget(scene_type="group", scene_id="300000003"))
    resp = httpx.post(call.url, json=call.json_body, headers=call.headers)
    assert c.parse_send_result(resp.status_code, resp.headers, resp.content) == SendResult(
        ok=False, error="retcode 1404: failed"
    )
    reqs = api_server.requests
    assert [(r.path, r.json, r.headers["authorization"]) for r in reqs] == [
        (
            "/send_private_msg",
            {"user_id": 200000002, "message": [{"type": "text", "data": {"text": "pong"}}]},
            "Bearer tok",
        ),
        (
            "/send_group_msg",
            {"group_id": 300000003, "message": [{"type": "text", "data": {"text": "pong"}}]},
            "Bearer tok",
        ),
        (
            "/send_group_msg",
            {"group_id": 300000003, "message": [{"type": "text", "data": {"text": "pong"}}]},
            "Bearer tok",
        ),
    ]

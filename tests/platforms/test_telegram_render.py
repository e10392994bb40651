"""Telegram rendering as Telegram would render it: Markdown → HTML table (hand-checked), entity
nesting, splitting in UTF-16 units between grapheme clusters, captions and sendMediaGroup albums
(rendered calls, and the requests the platform-API stand-in receives over loopback HTTP)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.platforms.base import ApiCall, RenderTarget, SendResult
from runtime.platforms.telegram import TelegramCodec
from runtime.platforms.tg_html import BOLD, Run, link, split_runs, to_html, utf16_len
from runtime.platforms.tg_markdown import markdown_runs
from runtime.reply.segments import Reply
from tests.platform_api_server import PlatformApiServer

TOKEN = "1000000099:AAF-test-token"
PRIVATE = RenderTarget(scene_type="private", scene_id="1111111")
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # man ZWJ woman ZWJ girl: 5 code points, 8 units


def codec(**kw: Any) -> TelegramCodec:
    return TelegramCodec(bot_id="1000000099", token=TOKEN, **kw)


def render(*segments: dict[str, Any], target: RenderTarget = PRIVATE) -> list[ApiCall]:
    return codec().render(Reply.model_validate({"segments": list(segments)}), target)


def method(call: ApiCall) -> str:
    return call.path.rsplit("/", 1)[1]


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": value}}


def md(value: str) -> dict[str, Any]:
    return {"type": "markdown", "data": {"content": value}}


def image(value: str, kind: str = "url") -> dict[str, Any]:
    return {"type": "image", "data": {"media": {"kind": kind, "value": value}}}


def media(seg_type: str, value: str) -> dict[str, Any]:
    return {"type": seg_type, "data": {"media": {"kind": "file", "value": value}}}


# --------------------------------------------------------------------------- Markdown → HTML


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # one quote block is one blockquote, whatever formatting its lines carry
        ("> **q1**\n> q2", "<blockquote><b>q1</b>\nq2</blockquote>"),
        ("> a\n>\n> b", "<blockquote>a\n\nb</blockquote>"),
        ("> a\n\n> b", "<blockquote>a</blockquote>\n\n<blockquote>b</blockquote>"),
        ("> # Title\n> - item", "<blockquote><b>Title</b>\n• item</blockquote>"),
        # link URLs with balanced parentheses
        (
            "[Foo](https://en.wikipedia.org/wiki/Foo_(bar))",
            '<a href="https://en.wikipedia.org/wiki/Foo_(bar)">Foo</a>',
        ),
        ("[deep](https://e.com/a_(b_(c))) x", '<a href="https://e.com/a_(b_(c))">deep</a> x'),
        ("see [x](https://e.com/a)) y", 'see <a href="https://e.com/a">x</a>) y'),
        ('![alt](https://i.example/p.png "title")', '<a href="https://i.example/p.png">alt</a>'),
        # only http(s) and tg:// links; anything else keeps its text, plain
        ("[x](javascript:alert(1))", "x"),
        ("[d](data:text/html,hi) [f](file:///etc/passwd)", "d f"),
        ("[m](mailto:a@b.example) [r](/relative)", "m r"),
        ("[u](tg://user?id=42)", '<a href="tg://user?id=42">u</a>'),
        ("![pic](javascript:x)", "pic"),
        # no code inside other entities: formatting closes and reopens around it
        ("**a `b` c**", "<b>a </b><code>b</code><b> c</b>"),
        ("# Head `x`", "<b>Head </b><code>x</code>"),
        ("~~s `c`~~ ||sp||", "<s>s </s><code>c</code> <tg-spoiler>sp</tg-spoiler>"),
        # … but inside a link or a quote the code is plain text (the link / block stays whole)
        ("[a `b` **c**](https://x.example/)", '<a href="https://x.example/">a b <b>c</b></a>'),
        ("> quote `code` end", "<blockquote>quote code end</blockquote>"),
        # formatting may contain links and links may contain formatting
        ("**bold [l](https://a.example/) end**", '<b>bold <a href="https://a.example/">l</a> end</b>'),
        # escaping of text and attribute values
        (
            'a < b & [l](https://a.example/?x="1"&y=2)',
            'a &lt; b &amp; <a href="https://a.example/?x=&quot;1&quot;&amp;y=2">l</a>',
        ),
        ("```\n<x> **no**\n```", "<pre>&lt;x&gt; **no**</pre>"),
        ("```sh\necho `a`\n```", '<pre><code class="language-sh">echo `a`</code></pre>'),
    ],
)
def test_markdown_to_telegram_html(source: str, expected: str) -> None:
    assert to_html(markdown_runs(source)) == expected
    (call,) = render(md(source))
    assert call.json_body == {"chat_id": 1111111, "text": expected, "parse_mode": "HTML"}


def test_adjacent_links_to_one_target_stay_two_links() -> None:
    runs = [link("@1", "tg://user?id=1"), link("@1", "tg://user?id=1")]
    assert to_html(runs) == '<a href="tg://user?id=1">@1</a><a href="tg://user?id=1">@1</a>'
    assert to_html([link("x", "javascript:alert(1)")]) == "x"


# --------------------------------------------------------------------------- splitting


def texts(calls: list[ApiCall]) -> list[str]:
    return [c.json_body["text"] for c in calls if c.json_body is not None]


def test_split_counts_utf16_units() -> None:
    pieces = texts(render(text("😀" * 3000)))  # 6,000 units
    assert pieces == ["😀" * 2048, "😀" * 952]
    assert [utf16_len(p) for p in pieces] == [4096, 1904]
    assert texts(render(text("😀" * 2048))) == ["😀" * 2048]  # exactly 4,096 units: one message


@pytest.mark.parametrize(
    "cluster",
    [FAMILY, "e\u0301\u0302", "\U0001f1e9\U0001f1ea", "\U0001f44d\U0001f3fd"],
    ids=["zwj-family", "combining-marks", "flag", "skin-tone"],
)
def test_split_never_cuts_a_grapheme_cluster(cluster: str) -> None:
    pieces = texts(render(text("a" * 4095 + cluster + "b")))
    assert pieces == ["a" * 4095, cluster + "b"]


def test_split_never_cuts_a_mention_link() -> None:
    calls = render(text("x" * 4090), {"type": "mention", "data": {"target": "123456789"}}, text(" ok"))
    assert texts(calls) == ["x" * 4090, '<a href="tg://user?id=123456789">@123456789</a> ok']


def test_split_prefers_a_line_break_outside_entities() -> None:
    source = "**" + "a" * 2500 + "**\n" + "b " * 700 + "\n" + "c" * 1500  # 5,402 units
    assert texts(render(md(source))) == ["<b>" + "a" * 2500 + "</b>\n" + "b " * 700 + "\n", "c" * 1500]


def test_split_inside_formatting_reopens_tags() -> None:
    source = "> " + "q " * 2100 + "\n> **end**"  # one quote block of 4,204 units
    first, second = texts(render(md(source)))
    assert first == "<blockquote>" + "q " * 2048 + "</blockquote>"
    assert second == "<blockquote>" + "q " * 52 + "\n<b>end</b></blockquote>"


def test_split_leaves_out_whitespace_only_pieces() -> None:
    assert texts(render(text("a" * 4096 + " " * 300))) == ["a" * 4096]
    assert texts(render(text("a" * 4000 + "\n" * 200 + " " * 5000))) == ["a" * 4000 + "\n" * 96]
    assert split_runs([Run(" \n\t")]) == []
    assert render(text("\n" * 5000)) == []


def test_split_keeps_code_alone_and_bold_outside_it() -> None:
    runs = [Run("a", (BOLD,)), Run("b" * 10, (BOLD, *markdown_runs("`x`")[0].tags)), Run("c", (BOLD,))]
    pieces = split_runs(runs, limit=6)
    assert [to_html(p) for p in pieces] == ["<b>a</b><code>bbbbb</code>", "<code>bbbbb</code><b>c</b>"]


# --------------------------------------------------------------------------- captions and albums


def test_image_and_short_text_is_one_captioned_photo() -> None:
    for segments in ([image("https://e.example/a.png"), md("**nice** pic")],
                     [md("**nice** pic"), image("https://e.example/a.png")]):  # fmt: skip
        (call,) = render(*segments)
        assert method(call) == "sendPhoto"
        assert call.json_body == {
            "chat_id": 1111111,
            "photo": "https://e.example/a.png",
            "caption": "<b>nice</b> pic",
            "parse_mode": "HTML",
        }


def test_caption_limit_is_1024_utf16_units() -> None:
    (call,) = render(image("AgACAgQ", "file"), text("😀" * 512))  # 1,024 units: fits
    assert call.json_body is not None and call.json_body["caption"] == "😀" * 512
    photo, message = render(image("AgACAgQ", "file"), text("😀" * 512 + "a"))  # 1,025: after the photo
    assert (method(photo), photo.json_body) == ("sendPhoto", {"chat_id": 1111111, "photo": "AgACAgQ"})
    assert message.json_body == {"chat_id": 1111111, "text": "😀" * 512 + "a", "parse_mode": "HTML"}
    long_first = render(text("y" * 1025), image("AgACAgQ", "file"))
    assert [method(c) for c in long_first] == ["sendMessage", "sendPhoto"]
    assert "caption" not in (long_first[1].json_body or {})


def test_text_after_media_is_preferred_and_text_is_captioned_once() -> None:
    calls = render(text("intro"), image("P1", "file"), text("about 1"), image("P2", "file"))
    assert [(method(c), c.json_body) for c in calls] == [
        ("sendMessage", {"chat_id": 1111111, "text": "intro", "parse_mode": "HTML"}),
        ("sendPhoto", {"chat_id": 1111111, "photo": "P1", "caption": "about 1", "parse_mode": "HTML"}),
        ("sendPhoto", {"chat_id": 1111111, "photo": "P2"}),
    ]


def test_album_of_photos_and_videos_with_caption_on_first_item() -> None:
    target = RenderTarget(scene_type="group", scene_id="-100", reply_to="-100:7")
    (call,) = render(image("P1", "file"), text("\n"), media("video", "V1"), image("P2", "file"),
                     md("_three_"), target=target)  # fmt: skip
    assert (method(call), call.kind) == ("sendMediaGroup", "media_group")
    assert call.json_body == {
        "chat_id": -100,
        "reply_parameters": {"message_id": 7},
        "media": [
            {"type": "photo", "media": "P1", "caption": "<i>three</i>", "parse_mode": "HTML"},
            {"type": "video", "media": "V1"},
            {"type": "photo", "media": "P2"},
        ],
    }


def test_albums_group_by_kind_in_order_and_hold_at_most_ten() -> None:
    calls = render(
        image("P1", "file"), media("video", "V1"), media("file", "D1"), media("file", "D2"),
        media("audio", "A1"), media("audio", "A2"), media("file", "D3"), image("P2", "file"),
    )  # fmt: skip
    assert [(method(c), [m["media"] for m in (c.json_body or {}).get("media", [])]) for c in calls] == [
        ("sendMediaGroup", ["P1", "V1"]),
        ("sendMediaGroup", ["D1", "D2"]),
        ("sendMediaGroup", ["A1", "A2"]),
        ("sendDocument", []),
        ("sendPhoto", []),
    ]
    assert [m["type"] for c in calls[:3] for m in (c.json_body or {})["media"]] == [
        "photo", "video", "document", "document", "audio", "audio",
    ]  # fmt: skip
    many = render(*[image(f"P{n}", "file") for n in range(23)], text("all"))
    assert [len((c.json_body or {})["media"]) for c in many] == [10, 10, 3]
    assert [(c.json_body or {})["media"][0].get("caption") for c in many] == ["all", None, None]
    eleven = render(*[image(f"P{n}", "file") for n in range(11)])
    assert [method(c) for c in eleven] == ["sendMediaGroup", "sendPhoto"]


def test_dice_separates_media_runs() -> None:
    calls = render(image("P1", "file"), {"type": "dice", "data": {}}, image("P2", "file"))
    assert [method(c) for c in calls] == ["sendPhoto", "sendDice", "sendPhoto"]


def test_album_answer_keeps_the_first_message_id(fixtures_dir: Path) -> None:
    recorded = json.loads((fixtures_dir / "telegram/api_sendMessage_response.json").read_text())
    album = {"ok": True, "result": [recorded["result"], {**recorded["result"], "message_id": 41}]}
    result = codec().parse_send_result(200, {}, json.dumps(album).encode())
    assert result == SendResult(ok=True, message_id="123456789:40")


def test_captioned_upload_and_uploaded_album_over_http(fixtures_dir: Path) -> None:
    """Multipart shapes as the stand-in receives them: caption fields as plain strings, album items
    naming their files with attach://."""
    b64 = base64.b64encode(PNG).decode()
    reply = Reply.model_validate(
        {
            "segments": [
                {"type": "reply", "data": {"message_id": "9"}},
                image(b64, "base64"),
                md("**one**"),
                image(b64, "base64"),
                image("https://e.example/b.png"),
                image(b64, "base64"),
                text("three & more"),
            ]
        }
    )
    with PlatformApiServer(fixtures_dir, vary_message_ids=True) as api:
        c = codec(api_base=api.base_url)
        results = []
        for call in c.render(reply, PRIVATE):
            files = {k: (f.filename, f.data, f.content_type) for k, f in (call.files or {}).items()}
            resp = httpx.post(call.url, json=call.json_body, data=call.form, files=files or None)
            results.append(c.parse_send_result(resp.status_code, resp.headers, resp.content))
        recs = api.requests
    assert [r.path.rsplit("/", 1)[1] for r in recs] == ["sendPhoto", "sendMediaGroup"]
    assert recs[0].form == {
        "chat_id": "1111111",
        "reply_parameters": '{"message_id": 9}',
        "caption": "<b>one</b>",
        "parse_mode": "HTML",
    }
    assert recs[0].files["photo"].data == PNG
    assert recs[1].form.keys() == {"chat_id", "media"}
    assert json.loads(recs[1].form["media"]) == [
        {"type": "photo", "media": "attach://media0", "caption": "three &amp; more", "parse_mode": "HTML"},
        {"type": "photo", "media": "https://e.example/b.png"},
        {"type": "photo", "media": "attach://media2"},
    ]
    assert {k: (f.filename, f.content_type, f.data) for k, f in recs[1].files.items()} == {
        "media0": ("photo.png", "image/png", PNG),
        "media2": ("photo.png", "image/png", PNG),
    }
    # the stand-in answers the album with one message per item; the first one's id is kept
    assert results == [
        SendResult(ok=True, message_id="123456789:40"),
        SendResult(ok=True, message_id="123456789:41"),
    ]

"""Media references and links (docs/decisions.md#security-media-references,
docs/decisions.md#security-media-bytes).

* ``bots[].media_dir`` confines that bot's ``path`` media at delivery (per bot): a real file inside
  is sent, a path outside it, a ``..`` and a symlink pointing out are replaced and counted.
* ``file``-kind media must be a platform file id: URIs (``file:``, ``http:``, ``base64:``…) and
  file-system paths never reach OneBot's ``file`` field or Telegram's ``sendPhoto``.
* ``share`` links: only http(s) (``javascript:``, ``data:``, ``file:`` become text).

Ray-free: the DeliverySender a DeliveryActor wraps, a real SQLite file, the platform-API test
server over loopback (recorded fixture answers), the real OneBot/Telegram codecs.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runtime.delivery.core import DeliveryJob, DeliverySender, DeliverySettings
from runtime.platforms.base import RenderTarget
from runtime.platforms.onebot11 import to_onebot_segments
from runtime.platforms.telegram import TelegramCodec
from runtime.reply.media import (
    MediaPolicy,
    check_reply_media,
    file_ref_problem,
    share_url_problem,
)
from runtime.reply.segments import FileSegment, ImageSegment, Reply, ShareData, ShareSegment, TextSegment
from tests.platform_api_server import PlatformApiServer
from tests.reply.conftest import png_bytes, sample

MEDIA = "sessionray_media_rejected_total"
UNAVAILABLE = "[attachment unavailable]"
OB_BOT, OB_USER = "10001", "20002"
TG_BOT, TG_TOKEN, TG_CHAT = "1000000099", "1000000099:AAF-test-token", "1111111"

BAD_FILE_REFS = [
    "file:///etc/passwd",
    "FILE:///etc/passwd",
    "/etc/passwd",
    "//server/share/x.png",
    "~/secret.png",
    "~root",
    "./x.png",
    "../x.png",
    ".",
    "..",
    "dir/x.png",
    "C:\\Windows\\win.ini",
    "C:x.png",
    "\\\\server\\share\\x.png",
    "x\\y.png",
    "http://169.254.169.254/latest",
    "https://example.com/a.png",
    "base64://iVBORw0KGgo=",
    "base64:iVBORw0KGgo=",
    "data:image/png;base64,iVBORw0KGgo=",
    "javascript:alert(1)",
    "x.png\x00",
    "a\nb",
    " 123.jpg",
    "123.jpg ",
    "",
    "   ",
]


def counts() -> dict[str, float]:
    return {r: sample(MEDIA, reason=r) for r in ("bad_file_ref", "bad_url", "outside_media_dir", "not_found")}


def increase(before: dict[str, float]) -> dict[str, float]:
    return {r: v - before[r] for r, v in counts().items() if v != before[r]}


def share(url: str, title: str = "Docs") -> ShareSegment:
    return ShareSegment(data=ShareData(url=url, title=title))


# --------------------------------------------------------------------------- the rules (no I/O)


def test_file_ref_rule_refuses_uris_and_paths_and_keeps_platform_ids(fixtures_dir: Path) -> None:
    assert [v for v in BAD_FILE_REFS if file_ref_problem(v) is None] == []
    photo = json.loads((fixtures_dir / "telegram/message_photo_caption.json").read_text())
    tg_ids = [p["file_id"] for p in photo["photo"]]
    good = [*tg_ids, "123.jpg", "E98410F4B2AB990BB6285288F6896228.png", "AwACAgQ", "ref123", "vid-ref"]
    assert [v for v in good if file_ref_problem(v) is not None] == []
    assert file_ref_problem("file:///etc/passwd") == (
        "file reference 'file:///etc/passwd' has a URI scheme; only a platform file id is allowed"
    )
    assert file_ref_problem("/etc/passwd") == (
        "file reference '/etc/passwd' is a file-system path; only a platform file id is allowed"
    )


def test_share_url_rule_only_http_and_https() -> None:
    bad = [
        "javascript:alert(1)",
        "JavaScript:alert(1)",
        " javascript:alert(1)",
        "data:text/html,<script>alert(1)</script>",
        "file:///etc/passwd",
        "vbscript:msgbox(1)",
        "ftp://example.com/x",
        "tg://user?id=1",
        "http://",
        "https:///path-only",
        "//example.com/x",
        "example.com",
        "http://exa mple.com/",
        "http://example.com/\nx",
        "http://[::1/",
    ]
    assert [u for u in bad if share_url_problem(u) is None] == []
    good = [
        "https://example.com/a?b=1&c=2",
        "http://example.com",
        "HTTPS://Example.COM/x",
        "http://10.0.0.1/x",
    ]
    assert [u for u in good if share_url_problem(u) is not None] == []


# --------------------------------------------------------------------------- the delivery-stage check


async def test_check_replaces_file_refs_that_are_uris_or_paths() -> None:
    before = counts()
    reply = Reply(
        segments=[
            ImageSegment.of("file", "file:///etc/passwd"),
            ImageSegment.of("file", "/etc/passwd"),
            FileSegment.of("file", "base64://aGVsbG8="),
            ImageSegment.of("file", "123.jpg"),
        ]
    )
    result = await check_reply_media(reply, MediaPolicy(), "onebot11")
    assert result.reply == Reply(
        segments=[
            TextSegment.of(UNAVAILABLE),
            TextSegment.of(UNAVAILABLE),
            TextSegment.of(UNAVAILABLE),
            ImageSegment.of("file", "123.jpg"),
        ]
    )
    assert [(i, r) for i, r, _ in result.rejected] == [
        (0, "bad_file_ref"),
        (1, "bad_file_ref"),
        (2, "bad_file_ref"),
    ]
    assert increase(before) == {"bad_file_ref": 3.0}


async def test_check_replaces_non_http_share_links_by_their_title() -> None:
    before = counts()
    reply = Reply(
        segments=[
            share("javascript:alert(1)", "Click me"),
            share("data:text/html,x", "  "),
            share("https://example.com/doc", "Doc"),
        ]
    )
    result = await check_reply_media(reply, MediaPolicy(), "telegram")
    assert result.reply == Reply(
        segments=[
            TextSegment.of("Click me [link unavailable]"),
            TextSegment.of("[link unavailable]"),
            share("https://example.com/doc", "Doc"),
        ]
    )
    assert [(i, r) for i, r, _ in result.rejected] == [(0, "bad_url"), (1, "bad_url")]
    assert increase(before) == {"bad_url": 2.0}


# --------------------------------------------------------------------------- the renderers (defence in depth)


def test_onebot_renderer_never_puts_a_uri_or_path_in_file() -> None:
    before = counts()
    reply = Reply(
        segments=[
            ImageSegment.of("file", "file:///etc/passwd"),
            ImageSegment.of("file", "/etc/passwd"),
            FileSegment.of("file", "../../etc/shadow"),
            ImageSegment.of("file", "123.jpg"),
            share("javascript:alert(1)", "x"),
            share("https://example.com/", "ok"),
        ]
    )
    assert to_onebot_segments(reply, None) == [
        {"type": "text", "data": {"text": UNAVAILABLE}},
        {"type": "text", "data": {"text": UNAVAILABLE}},
        {"type": "text", "data": {"text": UNAVAILABLE}},
        {"type": "image", "data": {"file": "123.jpg"}},
        {"type": "text", "data": {"text": "x [link unavailable]"}},
        {"type": "share", "data": {"url": "https://example.com/", "title": "ok"}},
    ]
    assert increase(before) == {"bad_file_ref": 3.0, "bad_url": 1.0}


def test_telegram_renderer_never_sends_a_uri_or_path_as_photo() -> None:
    before = counts()
    codec = TelegramCodec(bot_id=TG_BOT, token=TG_TOKEN)
    reply = Reply(
        segments=[
            ImageSegment.of("file", "file:///etc/passwd"),
            ImageSegment.of("file", "/etc/passwd"),
            share("javascript:alert(1)", "Click"),
            ImageSegment.of("file", "AgACAgQAAxkBAAINhGKvijUVSn2i3980bQ"),
        ]
    )
    calls = codec.render(reply, RenderTarget(scene_type="private", scene_id=TG_CHAT))
    assert [(c.path.rsplit("/", 1)[1], c.json_body) for c in calls] == [
        (
            "sendPhoto",
            {
                "chat_id": int(TG_CHAT),
                "photo": "AgACAgQAAxkBAAINhGKvijUVSn2i3980bQ",
                "caption": f"{UNAVAILABLE}{UNAVAILABLE}Click [link unavailable]",  # the text before it
                "parse_mode": "HTML",
            },
        ),
    ]
    assert increase(before) == {"bad_file_ref": 2.0, "bad_url": 1.0}


# --------------------------------------------------------------------------- end to end at delivery


def _job(platform: str, bot_id: str, scene_id: str, reply: Reply) -> DeliveryJob:
    return DeliveryJob(
        reply_id=uuid.uuid4().hex,
        session_key=f"{platform}:{bot_id}:private:{scene_id}",
        platform=platform,
        bot_id=bot_id,
        scene_type="private",
        scene_id=scene_id,
        reply=reply,
    )


async def _deliver(settings: DeliverySettings, *jobs: DeliveryJob) -> list[str]:
    sender = DeliverySender(settings, partition=0, owner="0:test")
    try:
        return [(await sender.deliver(job)).outcome for job in jobs]
    finally:
        await sender.close()


@pytest.fixture
def media_tree(tmp_path: Path) -> SimpleNamespace:
    """``media/ok.png`` inside the media dir; ``outside/secret.png`` beside it; ``media/link.png``
    a symlink to the outside file, ``media/outdir`` one to the outside directory."""
    media, outside = tmp_path / "media", tmp_path / "outside"
    media.mkdir()
    outside.mkdir()
    (media / "ok.png").write_bytes(png_bytes())
    (outside / "secret.png").write_bytes(png_bytes(2, 2))
    (media / "link.png").symlink_to(outside / "secret.png")
    (media / "outdir").symlink_to(outside, target_is_directory=True)
    return SimpleNamespace(root=tmp_path, media=media, outside=outside)


async def test_bot_media_dir_confines_path_media_at_delivery(
    media_tree: SimpleNamespace, fixtures_dir: Path
) -> None:
    before = counts()
    with PlatformApiServer(fixtures_dir) as api:
        bot = SimpleNamespace(
            platform="onebot11", self_id=OB_BOT, api_base=api.base_url, media_dir=str(media_tree.media)
        )
        settings = DeliverySettings(database_url=f"sqlite:///{media_tree.root / 'd.db'}", bots=[bot])
        reply = Reply(
            segments=[
                ImageSegment.of("path", "ok.png"),
                ImageSegment.of("path", str(media_tree.media / "ok.png")),
                ImageSegment.of("path", str(media_tree.outside / "secret.png")),
                ImageSegment.of("path", "../outside/secret.png"),
                ImageSegment.of("path", "link.png"),
                ImageSegment.of("path", "outdir/secret.png"),
                ImageSegment.of("path", f"{media_tree.media}/../outside/secret.png"),
            ]
        )
        outcomes = await _deliver(settings, _job("onebot11", OB_BOT, OB_USER, reply))
        inside = (media_tree.media / "ok.png").resolve().as_uri()
        assert outcomes == ["sent"]
        assert [(r.path, r.json) for r in api.requests] == [
            (
                "/send_private_msg",
                {
                    "user_id": int(OB_USER),
                    "message": [
                        {"type": "image", "data": {"file": inside}},
                        {"type": "image", "data": {"file": inside}},
                        {"type": "text", "data": {"text": UNAVAILABLE}},
                        {"type": "text", "data": {"text": UNAVAILABLE}},
                        {"type": "text", "data": {"text": UNAVAILABLE}},
                        {"type": "text", "data": {"text": UNAVAILABLE}},
                        {"type": "text", "data": {"text": UNAVAILABLE}},
                    ],
                },
            )
        ]
    assert increase(before) == {"outside_media_dir": 5.0}


async def test_media_dir_is_per_bot(media_tree: SimpleNamespace, fixtures_dir: Path) -> None:
    """Bot A has the media dir, bot B has none: the same ``path`` image is sent by A only."""
    before = counts()
    with PlatformApiServer(fixtures_dir) as api:
        bots = [
            SimpleNamespace(
                platform="onebot11", self_id="1", api_base=api.base_url, media_dir=str(media_tree.media)
            ),
            SimpleNamespace(platform="onebot11", self_id="2", api_base=api.base_url),
        ]
        settings = DeliverySettings(database_url=f"sqlite:///{media_tree.root / 'd.db'}", bots=bots)
        reply = Reply(segments=[ImageSegment.of("path", "ok.png")])
        outcomes = await _deliver(
            settings, _job("onebot11", "1", OB_USER, reply), _job("onebot11", "2", OB_USER, reply)
        )
        assert outcomes == ["sent", "sent"]
        assert [r.json["message"] for r in api.requests] == [
            [{"type": "image", "data": {"file": (media_tree.media / "ok.png").resolve().as_uri()}}],
            [{"type": "text", "data": {"text": UNAVAILABLE}}],
        ]
    assert increase(before) == {"outside_media_dir": 1.0}


async def test_file_refs_and_share_links_at_delivery_on_both_platforms(
    tmp_path: Path, fixtures_dir: Path, monkeypatch: Any
) -> None:
    """Hostile replies (``file:///etc/passwd``, ``/etc/passwd``,
    ``javascript:``) through the whole delivery: no platform call carries them."""
    monkeypatch.setenv("SR_TEST_TG_TOKEN", TG_TOKEN)
    before = counts()
    reply = Reply(
        segments=[
            ImageSegment.of("file", "file:///etc/passwd"),
            ImageSegment.of("file", "/etc/passwd"),
            share("javascript:alert(1)", "Click"),
        ]
    )
    with PlatformApiServer(fixtures_dir) as api:
        bots = [
            SimpleNamespace(platform="onebot11", self_id=OB_BOT, api_base=api.base_url),
            SimpleNamespace(
                platform="telegram", self_id=TG_BOT, api_base=api.base_url, token_env="SR_TEST_TG_TOKEN"
            ),
        ]
        settings = DeliverySettings(database_url=f"sqlite:///{tmp_path / 'd.db'}", bots=bots)
        outcomes = await _deliver(
            settings, _job("onebot11", OB_BOT, OB_USER, reply), _job("telegram", TG_BOT, TG_CHAT, reply)
        )
        assert outcomes == ["sent", "sent"]
        assert [(r.path, r.json) for r in api.requests] == [
            (
                "/send_private_msg",
                {
                    "user_id": int(OB_USER),
                    "message": [
                        {"type": "text", "data": {"text": UNAVAILABLE}},
                        {"type": "text", "data": {"text": UNAVAILABLE}},
                        {"type": "text", "data": {"text": "Click [link unavailable]"}},
                    ],
                },
            ),
            (
                f"/bot{TG_TOKEN}/sendMessage",
                {
                    "chat_id": int(TG_CHAT),
                    "text": f"{UNAVAILABLE}{UNAVAILABLE}Click [link unavailable]",
                    "parse_mode": "HTML",
                },
            ),
        ]
    assert increase(before) == {"bad_file_ref": 4.0, "bad_url": 2.0}

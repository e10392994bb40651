"""Outbound media checks (docs/decisions.md#security-media-bytes) and the leak check
(docs/decisions.md#security-leak-check), with counter deltas.

URL tests use a real HTTP server on 127.0.0.1; 10.0.0.1 is refused by the address check before
any connection is attempted (the test proves no socket is opened)."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from runtime.reply.leak import LeakPolicy, scan_reply
from runtime.reply.media import MediaPolicy, check_reply_media, resolve_media
from runtime.reply.segments import (
    AudioSegment,
    FileSegment,
    ImageSegment,
    Media,
    MentionSegment,
    Reply,
    ShareData,
    ShareSegment,
    TextSegment,
)

NA = "[attachment unavailable]"


class _Handler(BaseHTTPRequestHandler):
    files: ClassVar[dict[str, bytes]] = {}
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.hits.append(self.path)
        if self.path == "/redirect-private":
            self.send_response(302)
            self.send_header("Location", "http://10.0.0.1/x.png")
            self.end_headers()
            return
        body = self.files.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server(png: bytes) -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("H", (_Handler,), {"files": {"/a.png": png, "/big.png": png + b"\0" * 4096}, "hits": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def media_dir(tmp_path: Path, png: bytes) -> Path:
    d = tmp_path / "media"
    d.mkdir()
    (d / "pic.png").write_bytes(png)
    (d / "song.mp3").write_bytes(png)  # a PNG named .mp3
    (tmp_path / "secret.png").write_bytes(png)
    os.symlink(tmp_path / "secret.png", d / "escape.png")
    return d


async def test_path_media_sniffed_and_confined(media_dir: Path, png: bytes, deltas) -> None:
    policy = MediaPolicy(media_dir=media_dir)
    reply = Reply(
        segments=[
            TextSegment.of("看图 "),
            ImageSegment.of("path", "pic.png"),
            AudioSegment.of("path", "song.mp3"),  # PNG bytes in an audio segment
            ImageSegment.of("path", "../secret.png"),
            ImageSegment.of("path", "escape.png"),  # symlink pointing outside
            ImageSegment.of("path", "missing.png"),
            FileSegment.of("file", "platform-file-id"),  # opaque: passes through
        ]
    )
    out = await check_reply_media(reply, policy, "telegram")
    assert out.reply == Reply(
        segments=[
            TextSegment.of("看图 "),
            ImageSegment.of("path", "pic.png"),
            TextSegment.of(NA),
            TextSegment.of(NA),
            TextSegment.of(NA),
            TextSegment.of(NA),
            FileSegment.of("file", "platform-file-id"),
        ]
    )
    assert [(i, r) for i, r, _ in out.rejected] == [
        (2, "type_mismatch"),
        (3, "outside_media_dir"),
        (4, "outside_media_dir"),
        (5, "not_found"),
    ]
    pic = out.attachments[1]
    assert (pic.mime, pic.size, pic.data) == ("image/png", len(png), png)
    assert (out.attachments[6].data, out.attachments[6].size) == (None, None)
    assert deltas.media() == {"type_mismatch": 1, "outside_media_dir": 2, "not_found": 1}


async def test_oversized_and_base64(media_dir: Path, png: bytes, deltas) -> None:
    tiny = {"image": 100, "audio": 100, "video": 100, "file": 100}
    policy = MediaPolicy(media_dir=media_dir, limits={"tiny": tiny})
    b64 = base64.b64encode(png).decode()
    big = base64.b64encode(png + b"\0" * 100).decode()
    reply = Reply(
        segments=[
            ImageSegment.of("base64", b64),
            ImageSegment.of("base64", "not base64!"),
            ImageSegment.of("base64", big),
        ]
    )
    out = await check_reply_media(reply, policy, "tiny")
    assert out.reply == Reply(
        segments=[ImageSegment.of("base64", b64), TextSegment.of(NA), TextSegment.of(NA)]
    )
    assert [r for _, r, _ in out.rejected] == ["bad_base64", "too_large"]
    assert out.attachments[0].data == png
    (media_dir / "big.png").write_bytes(png + b"\0" * 100)
    small = await check_reply_media(Reply(segments=[ImageSegment.of("path", "big.png")]), policy, "tiny")
    assert small.reply == Reply.of_text(NA) and small.rejected[0][1] == "too_large"
    # the same file fits the default limit of a real platform
    fits = await check_reply_media(Reply(segments=[ImageSegment.of("path", "big.png")]), policy, "onebot11")
    assert fits.rejected == [] and fits.attachments[0].size == len(png) + 100
    assert policy.limit("telegram", "image") == 10 * 1024 * 1024
    assert deltas.media() == {"bad_base64": 1, "too_large": 2}


async def test_url_loopback_refused_by_default_allowed_by_config(server, png: bytes, deltas) -> None:
    base, handler = server
    reply = Reply(segments=[ImageSegment.of("url", f"{base}/a.png")])
    refused = await check_reply_media(reply, MediaPolicy(), "console")
    assert refused.reply == Reply.of_text(NA) and refused.rejected[0][1] == "forbidden_address"
    assert handler.hits == []  # refused before connecting
    allowed = MediaPolicy(allow_private_urls=True, limits={"console": {"image": 1000}})
    ok = await check_reply_media(
        Reply(segments=[ImageSegment.of("url", f"{base}/a.png"), ImageSegment.of("url", f"{base}/big.png")]),
        allowed,
        "console",
    )
    assert ok.reply == Reply(segments=[ImageSegment.of("url", f"{base}/a.png"), TextSegment.of(NA)])
    assert (ok.attachments[0].data, ok.attachments[0].mime) == (png, "image/png")
    assert [r for _, r, _ in ok.rejected] == ["too_large"]
    assert handler.hits == ["/a.png", "/big.png"]
    assert deltas.media() == {"forbidden_address": 1, "too_large": 1}


async def test_private_address_refused_without_traffic(server, monkeypatch, deltas) -> None:
    attempts: list[Any] = []
    real_connect = socket.socket.connect

    def spy_connect(self: socket.socket, address: Any) -> Any:
        attempts.append(address)
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", spy_connect)
    for url in ("http://10.0.0.1/x.png", "http://169.254.169.254/latest", "http://[::1]/x.png"):
        with pytest.raises(Exception) as info:
            await resolve_media("image", Media(kind="url", value=url), MediaPolicy(), "console")
        assert getattr(info.value, "reason", None) == "forbidden_address"
    assert attempts == []  # no connection attempted at all
    with pytest.raises(Exception) as info2:
        await resolve_media(
            "image", Media(kind="url", value="ftp://example.com/x.png"), MediaPolicy(), "console"
        )
    assert getattr(info2.value, "reason", None) == "bad_url"
    out = await check_reply_media(
        Reply(segments=[ImageSegment.of("url", "http://10.0.0.1/y.png")]), MediaPolicy(), "x"
    )
    assert out.reply == Reply.of_text(NA)
    assert attempts == []
    # the spy does see real connections: the allowed loopback fetch goes through it
    base, _ = server
    got = await resolve_media(
        "image", Media(kind="url", value=f"{base}/a.png"), MediaPolicy(allow_private_urls=True), "x"
    )
    assert got.mime == "image/png"
    assert [a[0] for a in attempts] == ["127.0.0.1"]
    assert deltas.media() == {"forbidden_address": 1}


async def test_redirect_to_private_address_is_refused(server, deltas) -> None:
    base, handler = server
    policy = MediaPolicy(allowed_hosts=frozenset({"127.0.0.1"}))  # only the test server is exempt
    out = await check_reply_media(
        Reply(segments=[ImageSegment.of("url", f"{base}/redirect-private")]), policy, "x"
    )
    assert out.reply == Reply.of_text(NA)
    assert out.rejected == [(0, "forbidden_address", "'10.0.0.1' resolves to non-public address 10.0.0.1")]
    assert handler.hits == ["/redirect-private"]
    assert deltas.media() == {"forbidden_address": 1}


async def test_dns_rebinding_is_refused_at_connect_time(server, monkeypatch, deltas) -> None:
    """The name resolves to a public address for the pre-check, then to loopback when connecting:
    the guarded connection re-checks and refuses, and no socket is ever opened."""
    base, handler = server
    port = int(base.rsplit(":", 1)[1])
    answers = iter(["93.184.216.34", "127.0.0.1"])
    loop = asyncio.get_running_loop()

    async def fake_getaddrinfo(self: Any, host: str, p: Any, **kw: Any) -> list[Any]:
        assert host == "media.example"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), p or 80))]

    attempts: list[Any] = []
    real_connect = socket.socket.connect
    monkeypatch.setattr(type(loop), "getaddrinfo", fake_getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", lambda self, a: attempts.append(a) or real_connect(self, a))
    with pytest.raises(Exception) as info:
        await resolve_media(
            "image", Media(kind="url", value=f"http://media.example:{port}/a.png"), MediaPolicy(), "x"
        )
    assert (getattr(info.value, "reason", None), attempts, handler.hits) == ("forbidden_address", [], [])
    assert str(info.value) == "forbidden_address: 'media.example' resolves to non-public address 127.0.0.1"
    assert deltas.media() == {}


# --------------------------------------------------------------------------- leak check

KEY = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def test_leak_redacts_nested_strings(deltas) -> None:
    policy = LeakPolicy.from_env(["BOT_TOKEN", "UNSET_VAR"], environ={"BOT_TOKEN": "tg-secret-value-42"})
    reply = Reply(
        segments=[
            TextSegment.of("all good"),
            ShareSegment(data=ShareData(url="https://x.example/?t=tg-secret-value-42", title="key " + KEY)),
            ImageSegment.of("url", "https://x.example/a.png?sig=tg-secret-value-42"),
            MentionSegment.of("20002"),
        ]
    )
    out = scan_reply(reply, policy)
    # a secret inside a reference (share URL, media value) makes it unusable: the whole segment
    # becomes the redaction text, never a broken URL
    assert out.reply == Reply(
        segments=[
            TextSegment.of("all good"),
            TextSegment.of("[redacted]"),
            TextSegment.of("[redacted]"),
            MentionSegment.of("20002"),
        ]
    )
    assert (out.hits, out.blocked, out.patterns) == (
        3,
        False,
        ["configured_secret", "openai_or_anthropic_key"],
    )
    assert deltas.leaks() == {"redact": 3}


def test_leak_blocks_when_configured_and_clean_reply_untouched(deltas) -> None:
    policy = LeakPolicy(secrets=["hunter2-hunter2"], action="block")
    clean = Reply.of_text("nothing to see")
    assert scan_reply(clean, policy).reply is clean
    out = scan_reply(Reply(segments=[TextSegment.of("AKIAABCDEFGHIJKLMNOP is the key")]), policy)
    assert (out.reply, out.blocked, out.patterns) == (
        Reply.of_text(policy.blocked_text),
        True,
        ["aws_access_key"],
    )
    assert deltas.leaks() == {"block": 1}


def test_leak_policy_from_config_collects_named_secrets(deltas) -> None:
    from runtime.config import parse_config

    config = parse_config(
        {
            "ai": {
                "providers": {
                    "local": {
                        "api": "openai-completions",
                        "base_url": "http://127.0.0.1:11434/v1",
                        "api_key_env": "LOCAL_LLM_KEY",
                        "models": [{"id": "qwen2.5"}],
                    }
                }
            },
            "bots": [{"platform": "telegram", "self_id": "1", "token_env": "TG_TOKEN"}],
        }
    )
    env = {
        "LOCAL_LLM_KEY": "local-llm-key-123",
        "TG_TOKEN": "telegram-token-456",
        "SESSIONRAY_ADMIN_TOKEN": "adm1n-token",
    }
    policy = LeakPolicy.from_config(config, environ=env)
    assert sorted(policy.secrets) == ["adm1n-token", "local-llm-key-123", "telegram-token-456"]
    out = scan_reply(Reply.of_text("k=local-llm-key-123 t=telegram-token-456"), policy)
    assert out.reply == Reply.of_text("k=[redacted] t=[redacted]")
    assert deltas.leaks() == {"redact": 1}

"""Bad input against the media checks (docs/decisions.md#security-media-fetch-guard) and the leak
check (docs/decisions.md#security-leak-check).

Every URL test runs with a socket guard that fails the test on any connection to a non-loopback
address, so a broken address check can never send traffic off this machine; loopback servers
stand in for everything that is fetched."""

# ruff: noqa: E501  (parametrized attack tables read best one case per line)

from __future__ import annotations

import gzip
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from runtime.reply.leak import LeakPolicy, scan_reply
from runtime.reply.media import (
    REJECT_REASONS,
    MediaPolicy,
    MediaRejected,
    check_reply_media,
    resolve_media,
)
from runtime.reply.segments import (
    FileSegment,
    ImageSegment,
    MarkdownSegment,
    Media,
    MentionSegment,
    Reply,
    ShareData,
    ShareSegment,
    TextSegment,
)

NA = "[attachment unavailable]"


@pytest.fixture
def no_remote_traffic(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record every socket connect; refuse (and fail on) anything that is not loopback."""
    attempts: list[Any] = []
    real = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        attempts.append(address)
        host = str(address[0]) if isinstance(address, tuple) else ""
        if not (host.startswith("127.") or host == "::1"):
            raise AssertionError(f"test tried to reach a non-loopback address {address!r}")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    return attempts


async def reject(kind: str, value: str, policy: MediaPolicy, segment: str = "image") -> tuple[str, str]:
    with pytest.raises(MediaRejected) as info:
        await resolve_media(segment, Media(kind=kind, value=value), policy, "x")  # type: ignore[arg-type]
    return info.value.reason, info.value.detail


# --------------------------------------------------------------------------- URLs


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        ("http://2130706433/a.png", "'2130706433' resolves to non-public address 127.0.0.1"),
        ("http://0177.0.0.1/a.png", "'0177.0.0.1' resolves to non-public address 127.0.0.1"),
        ("http://0x7f.1/a.png", "'0x7f.1' resolves to non-public address 127.0.0.1"),
        ("http://127.1/a.png", "'127.1' resolves to non-public address 127.0.0.1"),
        ("http://localhost/a.png", "'localhost' resolves to non-public address 127.0.0.1"),
        ("http://[::1]/a.png", "'::1' resolves to non-public address ::1"),
        ("http://[::ffff:127.0.0.1]/a.png", "'::ffff:127.0.0.1' resolves to non-public address ::ffff:7f00:1"),
        ("http://[2002:7f00:1::]/a.png", "'2002:7f00:1::' resolves to non-public address 2002:7f00:1::"),
        ("http://[64:ff9b::a00:1]/a.png", "'64:ff9b::a00:1' resolves to non-public address 64:ff9b::a00:1"),
        ("http://100.64.0.1/a.png", "'100.64.0.1' resolves to non-public address 100.64.0.1"),
        ("http://198.18.0.1/a.png", "'198.18.0.1' resolves to non-public address 198.18.0.1"),
        ("http://10.0.0.1/a.png", "'10.0.0.1' resolves to non-public address 10.0.0.1"),
        ("http://user:pw@127.0.0.1/a.png", "'127.0.0.1' resolves to non-public address 127.0.0.1"),
        ("http://[::]/a.png", "'::' resolves to non-public address ::"),
    ],
)  # fmt: skip
async def test_non_public_addresses_refused_before_connecting(
    url: str, detail: str, no_remote_traffic
) -> None:
    """Decimal/octal/hex IPv4, names that resolve to loopback, IPv4 inside IPv6 (mapped, 6to4,
    NAT64), carrier-grade NAT and benchmarking ranges: refused, and no socket is opened."""
    assert await reject("url", url, MediaPolicy()) == ("forbidden_address", detail)
    assert no_remote_traffic == []


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        ("http://[::1/a.png", "unparsable URL 'http://[::1/a.png': Invalid IPv6 URL"),
        ("http://h:99999/a.png", "unparsable URL 'http://h:99999/a.png': Port out of range 0-65535"),
        ("http://h:abc/a.png", "unparsable URL 'http://h:abc/a.png': Port could not be cast to integer value as 'abc'"),
        ("file:///etc/passwd", "only http(s) URLs with a host are fetched: 'file:///etc/passwd'"),
        ("data:image/png;base64,AAAA", "only http(s) URLs with a host are fetched: 'data:image/png;base64,AAAA'"),
    ],
)  # fmt: skip
async def test_malformed_urls_are_bad_url_not_a_crash(url: str, detail: str, no_remote_traffic) -> None:
    assert await reject("url", url, MediaPolicy()) == ("bad_url", detail)
    out = await check_reply_media(Reply(segments=[ImageSegment.of("url", url)]), MediaPolicy(), "x")
    assert out.reply == Reply.of_text(NA)
    assert no_remote_traffic == []


class _Server(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, Any]] = {}
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Accept-Encoding")))
        self.routes[self.path](self)

    def log_message(self, *args: Any) -> None:
        pass


def _redirect_to(location: str) -> Any:
    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return route


def _body(data: bytes, **headers: str) -> Any:
    def route(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        for k, v in headers.items():
            h.send_header(k.replace("_", "-"), v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return route


def _drip(h: BaseHTTPRequestHandler) -> None:
    """A body that trickles one byte every 20 ms (bounded: 150 bytes, ~3 s, stops on disconnect)."""
    h.send_response(200)
    h.send_header("Content-Length", "150")
    h.end_headers()
    try:
        for _ in range(150):
            h.wfile.write(b"\0")
            h.wfile.flush()
            time.sleep(0.02)
    except OSError:
        pass


@pytest.fixture
def site(png: bytes) -> Iterator[tuple[str, type[_Server]]]:
    handler = type("S", (_Server,), {"routes": {}, "seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    handler.routes.update(
        {
            "/a.png": _body(png),
            "/gz.png": _body(gzip.compress(png), Content_Encoding="gzip"),
            "/to-localhost": _redirect_to(f"http://localhost:{httpd.server_address[1]}/a.png"),
            "/to-decimal": _redirect_to(f"http://2130706433:{httpd.server_address[1]}/a.png"),
            "/to-file": _redirect_to("file:///etc/passwd"),
            "/drip": _drip,
        }
    )
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield base, handler
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/to-localhost", ("forbidden_address", "'localhost' resolves to non-public address 127.0.0.1")),
        ("/to-decimal", ("forbidden_address", "'2130706433' resolves to non-public address 127.0.0.1")),
        ("/to-file", ("bad_url", "only http(s) URLs with a host are fetched: 'file:///etc/passwd'")),
    ],
)
async def test_redirect_from_allowed_host_to_private_is_refused(
    site, no_remote_traffic, path, expected
) -> None:
    """Only 127.0.0.1 is exempt; a redirect to another spelling of loopback is checked afresh."""
    base, handler = site
    policy = MediaPolicy(allowed_hosts=frozenset({"127.0.0.1"}))
    assert await reject("url", base + path, policy) == expected
    assert [p for p, _ in handler.seen] == [path]  # the second hop was never requested


async def test_compressed_body_refused_and_identity_requested(site, png: bytes, no_remote_traffic) -> None:
    """No transparent decompression (a gzip bomb would expand past the limit in one chunk)."""
    base, handler = site
    policy = MediaPolicy(allow_private_urls=True)
    assert await reject("url", f"{base}/gz.png", policy) == (
        "fetch_failed",
        f"GET {base}/gz.png: compressed body (gzip)",
    )
    ok = await resolve_media("image", Media(kind="url", value=f"{base}/a.png"), policy, "x")
    assert (ok.data, ok.mime) == (png, "image/png")
    assert handler.seen == [("/gz.png", "identity"), ("/a.png", "identity")]


async def test_whole_fetch_timeout_bounds_a_trickling_body(site, no_remote_traffic) -> None:
    """Each byte arrives well within the per-read timeout; the whole-fetch bound still ends it."""
    base, _ = site
    policy = MediaPolicy(allow_private_urls=True, fetch_timeout_s=0.3)
    assert await reject("url", f"{base}/drip", policy, "file") == (
        "fetch_failed",
        f"GET {base}/drip: no complete answer within 0.3 s",
    )


# --------------------------------------------------------------------------- paths, base64


@pytest.fixture
def media(tmp_path: Path, png: bytes) -> Path:
    d = tmp_path / "media"
    (d / "sub").mkdir(parents=True)
    (d / "pic.png").write_bytes(png)
    (d / "empty.bin").write_bytes(b"")
    os.mkfifo(d / "pipe")
    (tmp_path / "outside.png").write_bytes(png)
    os.symlink(d / "hop2", d / "hop1")  # hop1 -> hop2 -> ../outside.png
    os.symlink(tmp_path / "outside.png", d / "hop2")
    os.symlink(d / "pic.png", d / "inside-link.png")
    return d


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("sub", ("not_found", "'sub' is not a regular file")),
        ("", ("not_found", "'' is not a regular file")),
        ("pipe", ("not_found", "'pipe' is not a regular file")),  # a FIFO never blocks the reader
        ("hop1", ("outside_media_dir", "'hop1' resolves outside the media directory")),
        ("pic.png\x00.mp3", ("not_found", "NUL character in media path 'pic.png\\x00.mp3'")),
        ("%2e%2e/outside.png", ("not_found", "no such media file '%2e%2e/outside.png'")),
        ("sub/../../outside.png", ("outside_media_dir", "'..' in media path 'sub/../../outside.png'")),
        ("..\\outside.png", ("outside_media_dir", "'..' in media path '..\\\\outside.png'")),
        ("empty.bin", ("empty", "the path attachment has no bytes")),
    ],
)
async def test_bad_paths(media: Path, value: str, expected: tuple[str, str]) -> None:
    assert await reject("path", value, MediaPolicy(media_dir=media), "file") == expected


async def test_absolute_paths_outside_are_refused_without_an_existence_oracle(
    media: Path, png: bytes
) -> None:
    policy = MediaPolicy(media_dir=media)
    existing, missing = str(media.parent / "outside.png"), str(media.parent / "nope.png")
    assert await reject("path", existing, policy) == (
        "outside_media_dir",
        f"{existing!r} is outside the media directory",
    )
    assert await reject("path", missing, policy) == (
        "outside_media_dir",
        f"{missing!r} is outside the media directory",
    )
    inside = await resolve_media("image", Media(kind="path", value=str(media / "pic.png")), policy, "x")
    link = await resolve_media("image", Media(kind="path", value="inside-link.png"), policy, "x")
    assert (inside.data, link.data) == (png, png)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", ("empty", "the base64 attachment has no bytes")),
        ("data:image/png;base64,iVBORw0KGgo=", ("bad_base64", "Only base64 data is allowed")),
        ("iVBORw0KGgo", ("bad_base64", "Incorrect padding")),
        ("iVBO Rw0K", ("bad_base64", "Only base64 data is allowed")),
        ("iVBO-_0K", ("bad_base64", "Only base64 data is allowed")),
        ("A" * 200, ("too_large", "about 150 bytes > limit 100")),  # refused before decoding
    ],
)
async def test_bad_base64(value: str, expected: tuple[str, str]) -> None:
    policy = MediaPolicy(limits={"x": {"image": 100, "audio": 100, "video": 100, "file": 100}})
    assert await reject("base64", value, policy) == expected


async def test_every_rejection_is_counted_by_a_bounded_reason(media: Path, deltas) -> None:
    reply = Reply(
        segments=[
            FileSegment.of("base64", ""),
            ImageSegment.of("path", "pipe"),
            ImageSegment.of("url", "http://[::1"),
            FileSegment.of("file", "opaque"),
        ]
    )
    out = await check_reply_media(reply, MediaPolicy(media_dir=media), "x")
    assert out.reply == Reply(
        segments=[
            TextSegment.of(NA),
            TextSegment.of(NA),
            TextSegment.of(NA),
            FileSegment.of("file", "opaque"),
        ]
    )
    assert {r for _, r, _ in out.rejected} <= set(REJECT_REASONS)
    assert deltas.media() == {"empty": 1, "not_found": 1, "bad_url": 1}


# --------------------------------------------------------------------------- leak check

SECRET = "tg-Secret/Value+42"


def test_leak_secret_split_across_text_segments(deltas) -> None:
    policy = LeakPolicy(secrets=[SECRET])
    reply = Reply(
        segments=[
            TextSegment.of("token: tg-Sec"),
            MarkdownSegment.of("ret/Val"),
            TextSegment.of("ue+42 ok"),
            MentionSegment.of("1"),
            TextSegment.of("tg-Secret/"),  # split by a mention: the user never sees it joined
            TextSegment.of("x"),
        ]
    )
    out = scan_reply(reply, policy)
    assert out.reply == Reply(
        segments=[
            TextSegment.of("token: [redacted]"),
            MarkdownSegment.of(""),
            TextSegment.of(" ok"),
            MentionSegment.of("1"),
            TextSegment.of("tg-Secret/"),
            TextSegment.of("x"),
        ]
    )
    assert (out.hits, out.patterns) == (1, ["configured_secret"])
    assert deltas.leaks() == {"redact": 1}


def test_leak_case_variants_and_url_encoding(deltas) -> None:
    policy = LeakPolicy(secrets=[SECRET])
    reply = Reply(
        segments=[
            TextSegment.of("upper TG-SECRET/VALUE+42."),
            ShareSegment(data=ShareData(url="https://x.example/", title="t=tg-Secret%2FValue%2B42")),
            TextSegment.of("form tg-Secret%2FValue%2B42 and lower tg-secret%2fvalue%2b42"),
        ]
    )
    out = scan_reply(reply, policy)
    assert out.reply == Reply(
        segments=[
            TextSegment.of("upper [redacted]."),
            ShareSegment(data=ShareData(url="https://x.example/", title="t=[redacted]")),
            TextSegment.of("form [redacted] and lower [redacted]"),
        ]
    )
    assert deltas.leaks() == {"redact": 3}


def test_leak_in_mention_target_replaces_the_mention(deltas) -> None:
    """A mention of ``[redacted]`` would be sent to the platform as a user id: never."""
    policy = LeakPolicy(secrets=["9988776655443322"])
    out = scan_reply(Reply(segments=[TextSegment.of("hi "), MentionSegment.of("9988776655443322")]), policy)
    assert out.reply == Reply(segments=[TextSegment.of("hi "), TextSegment.of("[redacted]")])
    assert out.reply.mentions() == []
    assert deltas.leaks() == {"redact": 1}


def test_leak_split_secret_blocks_in_block_mode(deltas) -> None:
    policy = LeakPolicy(action="block")
    key = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
    out = scan_reply(Reply(segments=[TextSegment.of(key[:10]), TextSegment.of(key[10:])]), policy)
    assert (out.reply, out.blocked, out.patterns) == (
        Reply.of_text(policy.blocked_text),
        True,
        ["openai_or_anthropic_key"],
    )
    assert deltas.leaks() == {"block": 1}


async def test_tls_goes_to_the_vetted_ip_with_the_host_name_as_sni(no_remote_traffic) -> None:
    """The guarded backend connects to the resolved, checked IP; TLS still names the URL's host
    (SNI in the ClientHello), so certificate checks are against the name, not the IP."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    port = listener.getsockname()[1]
    hello: list[bytes] = []

    def accept_one() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            hello.append(conn.recv(4096))  # the ClientHello; then hang up

    t = threading.Thread(target=accept_one, daemon=True)
    t.start()
    try:
        reason, detail = await reject(
            "url", f"https://localhost:{port}/a.png", MediaPolicy(allow_private_urls=True)
        )
    finally:
        t.join(10)
        listener.close()
    assert reason == "fetch_failed" and detail.startswith(f"GET https://localhost:{port}/a.png: ")
    assert hello[0][:1] == b"\x16" and b"localhost" in hello[0]  # a TLS handshake naming the host
    assert ("127.0.0.1", port) in no_remote_traffic


def test_leak_zero_width_characters_do_not_hide_a_secret(deltas) -> None:
    key = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
    hidden = "\u200b".join(key[:12]) + "\u00ad" + key[12:]  # ZWSP between letters, a soft hyphen
    out = scan_reply(Reply(segments=[TextSegment.of(f"key: {hidden}!")]), LeakPolicy(secrets=[SECRET]))
    assert (out.reply, out.patterns) == (Reply.of_text("key: [redacted]!"), ["openai_or_anthropic_key"])
    assert deltas.leaks() == {"redact": 1}

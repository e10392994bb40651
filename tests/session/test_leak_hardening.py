"""The leak check reads text the way a client shows it (docs/decisions.md#security-leak-check):
full-width forms, HTML numeric/named entities, spaced out, invisible or combining characters
between the characters, reversed and base64 spellings of a configured secret are redacted; short
secrets keep the literal-only rule; ordinary text stays untouched."""

from __future__ import annotations

import base64

import pytest

from runtime.reply.leak import LeakPolicy, scan_reply, scan_text
from runtime.reply.segments import MarkdownSegment, Reply, TextSegment

SECRET = "AdminTok-9f3Kq7Zx"
POLICY = LeakPolicy(secrets=[SECRET, "short7x"], min_secret_chars=6)


def _fullwidth(s: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in s)


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        (_fullwidth(SECRET), "[redacted]"),
        ("key: " + _fullwidth(SECRET[:8]) + SECRET[8:] + " ok", "key: [redacted] ok"),
        ("".join(f"&#{ord(c)};" for c in SECRET[:10]) + SECRET[10:], "[redacted]"),
        ("<b>" + "".join(f"&#x{ord(c):X};" for c in SECRET) + "</b>", "<b>[redacted]</b>"),
        (SECRET.replace("-", "&hyphen;"), "[redacted]"),
        (SECRET.replace("-", "\u2212"), "[redacted]"),
        ("it is " + " ".join(SECRET) + ".", "it is [redacted]."),
        ("\n".join(SECRET), "[redacted]"),
        ("\u200b".join(SECRET), "[redacted]"),
        ("\u034f".join(SECRET) + "\u061c", "[redacted]\u061c"),
        ("backwards: " + SECRET[::-1], "backwards: [redacted]"),
        (base64.b64encode(SECRET.encode()).decode(), "[redacted]g="),
        (
            "b64: " + base64.b64encode(b"the key is " + SECRET.encode() + b"!").decode(),
            "b64: dGhlIGtleSBpcyB[redacted]CE=",
        ),
        (base64.urlsafe_b64encode(b"xy" + SECRET.encode()).decode(), "eHl[redacted]A=="),
    ],
)
def test_disguised_secret_is_redacted(text: str, redacted: str) -> None:
    assert scan_text(text, POLICY) == (redacted, ["configured_secret"])


@pytest.mark.parametrize(
    "text",
    [
        "Administrators took 9 tokens; it is fine",
        "s h o r t 7 x",  # a secret under 8 chars matches only literally (today's rule)
        "x7trohs",
        base64.b64encode(b"short7x").decode(),
        "&amp; &lt;b&gt; ＡＢＣ ordinary text",
        "AdminTok 9f3 is not the whole secret",
    ],
)
def test_ordinary_text_and_short_secret_spellings_are_left_alone(text: str) -> None:
    assert scan_text(text, POLICY) == (text, [])


def test_a_short_secret_still_matches_literally() -> None:
    assert scan_text("pw SHORT7X here", POLICY) == ("pw [redacted] here", ["configured_secret"])


def test_a_full_width_secret_split_over_segments_is_blocked() -> None:
    reply = Reply(
        segments=[
            TextSegment.of("token " + _fullwidth(SECRET[:6])),
            MarkdownSegment.of(_fullwidth(SECRET[6:])),
        ]
    )
    out = scan_reply(reply, LeakPolicy(secrets=[SECRET], action="block"))
    assert (out.reply, out.hits, out.blocked, out.patterns) == (
        Reply.of_text("[reply withheld: it contained a secret]"),
        1,
        True,
        ["configured_secret"],
    )


def test_key_formats_are_found_in_entity_and_full_width_spellings() -> None:
    key = "AKIAABCDEFGHIJKLMNOP"
    entity = "".join(f"&#{ord(c)};" for c in key)
    assert scan_text(f"aws {entity} and {_fullwidth(key)}", LeakPolicy()) == (
        "aws [redacted] and [redacted]",
        ["aws_access_key"],
    )


@pytest.mark.parametrize("module", ["runtime.reply.textnorm", "runtime.session.commands"])
def test_docstring_examples(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert (result.failed, result.attempted > 0) == (0, True)


def test_from_config_collects_the_console_api_token() -> None:
    """Review S3 #6: every worker has ``$SESSIONRAY_CONSOLE_API_TOKEN`` in its environment, so the
    policy built from config withholds it too (with or without a console bot configured), once."""
    from types import SimpleNamespace

    config = SimpleNamespace(
        ai=SimpleNamespace(providers={"p": SimpleNamespace(api_key_env="P_KEY")}),
        bots=[SimpleNamespace(access_token_env="OB_TOKEN", secret_env=None, token_env=None)],
        server=SimpleNamespace(admin_token_env="SESSIONRAY_CONSOLE_API_TOKEN"),
    )
    environ = {
        "P_KEY": "sk-provider-value",
        "OB_TOKEN": "onebot-token-1",
        "SESSIONRAY_CONSOLE_API_TOKEN": "cOnSoLe-T0ken-xyz",
    }
    policy = LeakPolicy.from_config(config, environ=environ)
    assert policy.secrets == ["sk-provider-value", "onebot-token-1", "cOnSoLe-T0ken-xyz"]
    bare = LeakPolicy.from_config(
        SimpleNamespace(), environ={"SESSIONRAY_CONSOLE_API_TOKEN": "cOnSoLe-T0ken-xyz"}
    )
    assert (bare.secrets, scan_text("token is cOnSoLe-T0ken-xyz.", bare)) == (
        ["cOnSoLe-T0ken-xyz"],
        ("token is [redacted].", ["configured_secret"]),
    )
    assert LeakPolicy.from_config(SimpleNamespace(), environ={}).secrets == []


def test_the_secret_half_of_a_telegram_token_is_a_secret_too() -> None:
    """A Telegram bot token is ``<bot id>:<secret>``; the secret half alone must not leave either,
    while the public bot id (short) stays readable."""
    token = "7012345678:AAHtgSECRETtokenvalue_abcdef123456"
    policy = LeakPolicy.from_env(["TG_TOKEN"], environ={"TG_TOKEN": token})
    text = "half: AAHtgSECRETtokenvalue_abcdef123456 and id 7012345678"
    assert scan_text(text, policy) == ("half: [redacted] and id 7012345678", ["configured_secret"])

"""Differential test: our CQ-code parser (runtime/platforms/cqcode.py) reads every CQ string —
well-formed or not — into the same segments as aiocqhttp, the OneBot v11 SDK whose grammar
docs/platforms.md claims (docs/decisions.md#platform-cq-lenient). ``aiocqhttp`` is a dev dependency;
its ``Message`` parses a CQ string into ``MessageSegment`` dicts ``{"type", "data"}``."""

from __future__ import annotations

import random
from typing import Any

import pytest
from aiocqhttp.message import Message

from runtime.platforms.cqcode import parse_cq, to_cq

HAND_MADE = [
    "",
    "plain",
    "&#91;x&#93;&amp;#91;",
    "[CQ:image,file=a[1.jpg]",  # an unescaped [ in a value is part of the value
    "[CQ:image,file=a[b[c.jpg]",
    "[CQ:face,id=[]",
    "[CQ:a,b=[CQ:c,d=e]]",
    "[CQ:image,file=a]1.jpg]",
    "[CQ:face,id=]]",
    "[CQ:face,id=14,]",
    "[CQ:rps,]",
    "[CQ:rps]",
    "[CQ:]",
    "[CQ:,a=1]",
    "[CQ:at,qq]",
    "[CQ:at,qq=]",
    "[CQ:image,file=a,b.jpg]",
    "[CQ:at, qq=10001]",
    "[CQ:表情,id=1]",
    "[CQ:face,ключ=1]",
    "[cq:face,id=1]",
    "x[CQ:face,id=1",
    "[[CQ:face,id=1]]",
    "[CQ:face,id=1,id=2]",
    "[CQ:face,=1]",
    "[CQ:face,id==1]",
    "[CQ:face,a=b=c]",
    "[CQ:face,id=1,,]",
    "[CQ:face,,id=1]",
    "[CQ:face,,]",
    "[CQ:face id=1]",
    "[CQ:face,id=1 ]",
    "[CQ:face,id=\n1]",
    "[CQ:face\n,id=1]",
    "[CQ:face,a=1,b]",
    "[CQ:a,b=[CQ:c,d]",
    "[CQ:a[CQ:face,id=1]",
    "[CQ:[CQ:face,id=1]",
    "[CQ:a.b-c_d,x.y-z_=1]",
    "[CQ:share,url=https://e.com/?a=1&#44;2,title=T&amp;C][CQ:dice]b&#44;",
    "&#91;第一部分&#93;[CQ:image,file=123.jpg]图片之后的部分，表情：[CQ:face,id=123]",
]

TOKENS = ["[CQ:", "[", "]", ",", "=", "&#91;", "&#93;", "&#44;", "&amp;", "&", " ", "\n",
          "face", "id", "1", "a.b", "表", "[CQ:face,id=1]", "[CQ:at,qq=", ",]"]  # fmt: skip
"""Pieces whose random concatenations hit the grammar's edges (a code's every delimiter)."""


def generated(count: int, seed: int) -> list[str]:
    """``count`` strings of 1–12 random :data:`TOKENS` each (a fixed ``seed``: the same set every run)."""
    rng = random.Random(seed)
    return ["".join(rng.choices(TOKENS, k=rng.randint(1, 12))) for _ in range(count)]


def aiocqhttp_segments(message: str) -> list[dict[str, Any]]:
    return [{"type": seg["type"], "data": dict(seg["data"])} for seg in Message(message)]


@pytest.mark.parametrize("message", HAND_MADE)
def test_hand_made_cq_strings_parse_as_aiocqhttp_parses_them(message: str) -> None:
    assert parse_cq(message) == aiocqhttp_segments(message)


def test_generated_cq_strings_parse_as_aiocqhttp_parses_them() -> None:
    strings = generated(4000, seed=27)
    assert sum("[CQ:" in s for s in strings) > 2000  # most of them try a code
    differ = [s for s in strings if parse_cq(s) != aiocqhttp_segments(s)]
    assert differ == []
    parsed = [s for s in strings if any(seg["type"] != "text" for seg in parse_cq(s))]
    assert len(parsed) > 500  # and plenty of them parse one


def test_an_unescaped_bracket_in_a_value_is_part_of_the_value() -> None:
    assert parse_cq("see [CQ:image,file=a[1.jpg] ok") == [
        {"type": "text", "data": {"text": "see "}},
        {"type": "image", "data": {"file": "a[1.jpg"}},
        {"type": "text", "data": {"text": " ok"}},
    ]
    segments = [{"type": "image", "data": {"file": "a[1],b.jpg"}}]  # what we send is escaped
    assert to_cq(segments) == "[CQ:image,file=a&#91;1&#93;&#44;b.jpg]"
    assert parse_cq(to_cq(segments)) == segments == aiocqhttp_segments(to_cq(segments))


def test_a_failed_code_with_codes_in_its_values_stays_text_in_one_pass() -> None:
    """A code that fails late (``,,``) after values holding ``[CQ:`` starts is all text — the
    codes inside its values fail at the same place (the module's linear-pass argument). aiocqhttp
    rescans from each start (quadratic: ~5 s for 2,000 starts), so it is compared on 200."""
    small = "[CQ:a,b=x" * 200 + ",,]"
    assert parse_cq(small) == [{"type": "text", "data": {"text": small}}] == aiocqhttp_segments(small)
    failed = "[CQ:a,b=x" * 100_000 + ",,]"  # ~1 MB: one pass
    face = {"type": "face", "data": {"id": "1"}}
    assert parse_cq(failed + "[CQ:face,id=1]") == [{"type": "text", "data": {"text": failed}}, face]

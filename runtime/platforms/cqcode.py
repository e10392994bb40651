"""OneBot v11 CQ-code strings ⇄ OneBot message-segment arrays.

Wire format (OneBot v11 spec, ``message/string.md``): plain text with embedded codes
``[CQ:<type>,<key>=<value>,...]``. Escaping:

* in plain text: ``&`` → ``&amp;``, ``[`` → ``&#91;``, ``]`` → ``&#93;``;
* inside a code's values additionally ``,`` → ``&#44;``.

Example (the spec's)::

    &#91;第一部分&#93;[CQ:image,file=123.jpg]图片之后的部分，表情：[CQ:face,id=123]

parses to ``[{"type": "text", "data": {"text": "[第一部分]"}}, {"type": "image", "data": {"file":
"123.jpg"}}, {"type": "text", "data": {"text": "图片之后的部分，表情："}}, {"type": "face", "data":
{"id": "123"}}]`` — the same array as the spec's array-form example. All values parse as strings.

Leniency (docs/decisions.md#platform-cq-lenient): a code that does not parse stays **literal text**,
as the OneBot v11 SDKs that bot authors use read CQ strings (NoneBot2's OneBot v11 adapter and
aiocqhttp use the same grammar), so one odd code never costs the whole event. A code parses when

* its type name is ``[A-Za-z0-9_.-]+`` (ASCII letters, digits, ``_ . -``; no spaces, no other
  Unicode),
* each parameter is ``,key=value`` with a key of the same characters and a value without ``,``
  or ``]`` (the spec escapes them inside values; the value may be empty; an unescaped ``[`` is
  part of the value, as aiocqhttp and NoneBot2 read it: ``[CQ:image,file=a[1.jpg]`` is an image
  of ``a[1.jpg``), and
* one trailing ``,`` before ``]`` is allowed (``[CQ:face,id=14,]``, ``[CQ:rps,]``).

This is aiocqhttp's grammar, malformed cases included (tests/platforms/test_cqcode_aiocqhttp.py
compares the two). So ``[CQ:at,qq]`` (no ``=``), ``[CQ:image,file=a,b.jpg]`` (an unescaped ``,`` in a value),
``[CQ:at, qq=10001]`` (a stray space: the spec says a code has none) and ``[CQ:表情,id=1]`` are
kept as the text they are. A repeated key keeps its last value.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["escape", "parse_cq", "to_cq", "unescape"]

_NAME = r"[A-Za-z0-9_.-]+"
_ATTEMPT = re.compile(rf"\[CQ:(?:({_NAME})((?:,{_NAME}=[^,\]]*)*+),?+(\])?)?+")
"""One ``[CQ:`` and as far as the code grammar reaches from it, never backtracking: group 1 the
type, group 2 its ``,key=value`` parameters (maybe empty), group 3 the closing ``]`` — present only
when the whole code parsed. Without group 3 the reached span is literal text, and no ``[CQ:``
inside it can start a code: such a ``[CQ:`` lies in a value of this attempt, so it either stops
before the value's end or, from that ``,``, follows this attempt's parse to the same failure. So
parsing resumes after the span, and no character is scanned twice (linear)."""


def escape(text: str, *, in_value: bool = False) -> str:
    """Escape ``text`` for a CQ string (``in_value``: also escape ``,`` for a code parameter)."""
    out = text.replace("&", "&amp;").replace("[", "&#91;").replace("]", "&#93;")
    return out.replace(",", "&#44;") if in_value else out


def unescape(text: str) -> str:
    """Reverse :func:`escape` (``&amp;`` last, so ``&amp;#91;`` stays ``&#91;``)."""
    return text.replace("&#91;", "[").replace("&#93;", "]").replace("&#44;", ",").replace("&amp;", "&")


def _params(params: str) -> dict[str, str]:
    """The ``,key=value`` parameters of one code (as matched by :data:`_CODE`, so every item has
    an ``=``) as a dict, values unescaped."""
    data: dict[str, str] = {}
    for item in params[1:].split(","):
        key, _, value = item.partition("=")
        data[key] = unescape(value) if "&" in value else value
    return data


def parse_cq(message: str) -> list[dict[str, Any]]:
    """Parse a CQ-code string into OneBot segments ``[{"type", "data"}]`` (values are strings).

    Adjacent plain text becomes one ``text`` segment; empty text between codes is omitted; a code
    that does not parse is part of the text (module docstring). Never raises on any string.
    Linear in the length of ``message`` (docs/decisions.md#platform-linear-parsing: one left-to-right
    pass of :data:`_ATTEMPT`; a repeated parameter string is parsed once), about 2 µs per code.
    """
    segments: list[dict[str, Any]] = []
    parsed: dict[str, dict[str, str]] = {}
    text: list[str] = []  # literal pieces since the last code
    pos = 0
    for attempt in _ATTEMPT.finditer(message):
        code_type, params, closed = attempt.groups()
        if closed is None:  # not a code: its span stays text
            continue
        text.append(message[pos : attempt.start()])
        pos = attempt.end()
        _flush_text(text, segments)
        data = parsed.get(params) if params else {}
        if data is None:
            data = parsed[params] = _params(params)
        segments.append({"type": code_type, "data": data.copy()})
    text.append(message[pos:])
    _flush_text(text, segments)
    return segments


def _flush_text(pieces: list[str], segments: list[dict[str, Any]]) -> None:
    """Append the joined ``pieces`` as one unescaped ``text`` segment (none when empty); clear them."""
    text = "".join(pieces)
    pieces.clear()
    if text:
        segments.append({"type": "text", "data": {"text": unescape(text) if "&" in text else text}})


def to_cq(segments: list[dict[str, Any]]) -> str:
    """Serialize OneBot segments into a CQ-code string (inverse of :func:`parse_cq`)."""
    parts: list[str] = []
    for seg in segments:
        data = seg.get("data") or {}
        if seg["type"] == "text":
            parts.append(escape(str(data.get("text", ""))))
            continue
        params = "".join(f",{k}={escape(str(v), in_value=True)}" for k, v in data.items())
        parts.append(f"[CQ:{seg['type']}{params}]")
    return "".join(parts)

"""Unicode look-alike folding shared by the checks that read text the way a person (or a model)
does: the forged ``[sender:…]`` check (:mod:`runtime.reply.sender`) and the outbound leak check
(:mod:`runtime.reply.leak`) (docs/decisions.md#security-sender-prefix,
docs/decisions.md#security-leak-check).

A reader does not see characters, it sees shapes. ``［ｓｅｎｄｅｒ：`` reads as ``[sender:``, a
zero-width space or U+034F (combining grapheme joiner) between two letters reads as nothing,
``&#65;`` reads as ``A`` once a client renders HTML. This module gives the two views those checks
need:

* :func:`invisible_chars` — characters that render as nothing or only modify their neighbour:
  every Unicode format (``Cf``), nonspacing and enclosing mark (``Mn``/``Me``), plus the Hangul
  fillers and the Braille blank;
* :func:`lookalikes` — for ASCII characters, every character whose NFKC form, case-folded, is that
  character (full-width, mathematical, circled, super/subscript letters…), plus a short list of
  common Cyrillic/Greek/small-capital homoglyphs and CJK bracket/colon forms;
* :func:`normalized_view` — a text rewritten character by character (HTML entities decoded,
  NFKC applied, invisible characters and optionally whitespace dropped) together with, for each
  output character, the span of the input it came from, so a hit found in the view can be cut
  out of the original text.

The tables cover planes 0 and 1 and the tag/variation-selector block (U+E0000–U+E0FFF); they are
built once per process on first use (about 0.1 s).
"""

from __future__ import annotations

import functools
import html
import re
import unicodedata

__all__ = ["invisible_chars", "lookalikes", "normalized_view"]

_SCANNED = (range(0x20000), range(0xE0000, 0xE1000))
_EXTRA_INVISIBLE = "\u115f\u1160\u3164\uffa0\u2800"
"""Hangul choseong/jungseong fillers, Hangul filler, half-width Hangul filler, Braille blank:
letters or symbols by category, blank on screen."""

_HOMOGLYPHS: dict[str, str] = {
    "s": "ѕЅꜱ",
    "e": "еЕҽᴇ",
    "n": "ոɴ",
    "d": "ԁᴅ",
    "r": "гʀ",
    "a": "аА",
    "o": "оОοΟ",
    "c": "сС",
    "p": "рР",
    "x": "хХ",
    "[": "【〔〖〘〚⟦﹝⁅❲⦋⦍⦏",
    "]": "】〕〗〙〛⟧﹞⁆❳⦌⦎⦐",
    ":": "∶꞉˸׃ː",
}
"""Look-alikes NFKC does not fold (Cyrillic/Greek letters, small capitals, CJK and math brackets,
ratio sign and other colon shapes)."""


@functools.cache
def _tables() -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    invisible: set[str] = set(_EXTRA_INVISIBLE)
    folds: dict[str, set[str]] = {}
    for block in _SCANNED:
        for cp in block:
            ch = chr(cp)
            if unicodedata.category(ch) in ("Cf", "Mn", "Me"):
                invisible.add(ch)
            elif cp < 0x80 or unicodedata.decomposition(ch):
                folded = unicodedata.normalize("NFKC", ch).casefold()
                if len(folded) == 1 and folded.isascii():
                    folds.setdefault(folded, set()).add(ch)
    for target, extra in _HOMOGLYPHS.items():
        folds.setdefault(target, set()).update(extra)
    return frozenset(invisible), {k: frozenset(v) for k, v in folds.items()}


def invisible_chars() -> frozenset[str]:
    """Every character that renders as nothing on its own (see the module docstring)."""
    return _tables()[0]


def lookalikes(ch: str) -> frozenset[str]:
    """Every character a reader takes for the ASCII character ``ch`` (``ch`` itself, its other
    case, NFKC-equivalent forms and the listed homoglyphs).

    >>> sorted(lookalikes(":"))
    [':', 'ː', '˸', '׃', '∶', '꞉', '︓', '﹕', '：']

    Raises:
        ValueError: ``ch`` is not one ASCII character.
    """
    if len(ch) != 1 or not ch.isascii():
        raise ValueError(f"lookalikes: expected one ASCII character, got {ch!r}")
    return _tables()[1].get(ch.casefold(), frozenset({ch}))


_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});?")


_DASHES = frozenset("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d")
"""Hyphen and dash shapes read as ``-`` (``&hyphen;``, ``&dash;``, ``&minus;`` decode to them)."""


@functools.lru_cache(maxsize=8192)
def _fold(ch: str) -> str:
    """One non-ASCII character as a reader sees it: NFKC, dashes as ``-``, invisible ones as ``""``."""
    out = []
    for f in unicodedata.normalize("NFKC", ch):
        if f in _DASHES:
            out.append("-")
        elif f not in invisible_chars():
            out.append(f)
    return "".join(out)


def normalized_view(
    text: str, *, drop_space: bool = False, decode_entities: bool = True
) -> tuple[str, list[tuple[int, int]]]:
    """Rewrite ``text`` as a reader sees it and keep where each character came from.

    Per input character (or HTML entity, when ``decode_entities``): entities are decoded
    (``&#65;`` / ``&#x41;`` / ``&amp;`` → one character), NFKC is applied (``Ａ`` → ``A``,
    ``ﬁ`` → ``fi``), dashes become ``-``, :func:`invisible_chars` are dropped, and whitespace too
    when ``drop_space``. Case is kept. Linear in ``len(text)``.

    Returns:
        ``(view, spans)``: ``spans[i] = (start, end)`` is the slice of ``text`` that produced
        ``view[i]`` (an entity's whole ``&…;``; an NFKC expansion shares one span).

    >>> normalized_view("Ａ&#66; C\u200b&hyphen;", drop_space=True)
    ('ABC-', [(0, 1), (1, 6), (7, 8), (9, 17)])
    """
    out: list[str] = []
    spans: list[tuple[int, int]] = []

    def run(a: int, b: int) -> None:  # plain characters text[a:b]
        for i in range(a, b):
            ch = text[i]
            if ch < "\x80":
                if not (drop_space and ch.isspace()):
                    out.append(ch)
                    spans.append((i, i + 1))
                continue
            for f in _fold(ch):
                if not (drop_space and f.isspace()):
                    out.append(f)
                    spans.append((i, i + 1))

    pos = 0
    if decode_entities and "&" in text:
        for m in _ENTITY.finditer(text):
            decoded = html.unescape(m.group())
            if decoded == m.group():
                continue  # not an entity a browser would decode
            run(pos, m.start())
            for ch in decoded:
                for f in ch if ch < "\x80" else _fold(ch):
                    if not (drop_space and f.isspace()):
                        out.append(f)
                        spans.append((m.start(), m.end()))
            pos = m.end()
    run(pos, len(text))
    return "".join(out), spans

"""Telegram HTML text building: styled runs, entity nesting rules, and splitting in UTF-16 units.

Telegram's ``parse_mode: "HTML"`` (Bot API "Formatting options") accepts ``<b> <i> <u> <s>
<code> <pre> <a href> <blockquote> <tg-spoiler>`` and needs only ``&``, ``<`` and ``>`` escaped
in text (``"`` too inside attribute values). Text is kept as a list of :class:`Run` (plain text +
the :class:`Tag` list around it, outermost first) until the end.

Nesting (Bot API "Message entities can be nested …"): bold, italic, underline, strikethrough and
spoiler may contain and be part of any entity except ``code``/``pre``; blockquotes do not nest; all
other entities do not contain each other. :func:`normalize` enforces this on every run: a
``code``/``pre`` run drops the formatting around it (so ``**a `b` c**`` is ``<b>a </b><code>b
</code><b> c</b>``: the bold closes and reopens around the code), but inside a link or a blockquote
the code is rendered as plain text instead (the link and the one blockquote of a quote block stay
whole); a link inside a link and a blockquote inside a blockquote keep only the outer one.
:func:`to_html` serializes runs as a tree: runs sharing an outer tag stay inside one element (a
quote block with a bold first line is one ``<blockquote>``), and two links never merge.

Lengths are counted as Telegram counts them: in **UTF-16 code units** (:func:`utf16_len`; an emoji
outside the BMP is 2). :func:`split_runs` cuts a text longer than the limit (4,096 for a message,
1,024 for a caption) only between grapheme clusters (``regex`` ``\\X``: a ZWJ emoji sequence, a
flag or a letter with combining marks is never cut), never inside a link (a mention stays one
link), and prefers, within the last half of a piece, a line break outside any entity, then a line
break, then a space outside any entity, then a space; a piece cut inside formatting re-opens its
tags. Whitespace-only pieces are dropped.
"""

from __future__ import annotations

import bisect
import html
import itertools
from dataclasses import dataclass

import regex

from runtime.reply.media import share_url_problem

__all__ = [
    "BLOCKQUOTE",
    "BOLD",
    "CAPTION_LIMIT",
    "CODE",
    "ITALIC",
    "SPOILER",
    "STRIKE",
    "TELEGRAM_TEXT_LIMIT",
    "Run",
    "Tag",
    "href_allowed",
    "link",
    "link_tag",
    "normalize",
    "pre_tag",
    "runs_length",
    "split_runs",
    "to_html",
    "utf16_len",
]

TELEGRAM_TEXT_LIMIT = 4096
"""Bot API: message text is 1-4096 characters (UTF-16 code units) after entities parsing."""

CAPTION_LIMIT = 1024
"""Bot API: a media caption is 0-1024 characters (UTF-16 code units) after entities parsing."""


@dataclass(frozen=True)
class Tag:
    """One HTML element around a run: ``kind`` is ``b`` | ``i`` | ``s`` | ``spoiler`` | ``code`` |
    ``pre`` | ``a`` | ``blockquote``; ``open``/``close`` are its literal tags. ``ident`` tells two
    links apart (equal tags are one element when adjacent, so each link gets its own ident)."""

    kind: str
    open: str
    close: str
    ident: int = 0


BOLD = Tag("b", "<b>", "</b>")
ITALIC = Tag("i", "<i>", "</i>")
STRIKE = Tag("s", "<s>", "</s>")
SPOILER = Tag("spoiler", "<tg-spoiler>", "</tg-spoiler>")
CODE = Tag("code", "<code>", "</code>")
BLOCKQUOTE = Tag("blockquote", "<blockquote>", "</blockquote>")

_MONO = frozenset({"code", "pre"})
_LINK_IDS = itertools.count(1)


@dataclass(frozen=True)
class Run:
    """A piece of visible text and the tags around it, outermost first."""

    text: str
    tags: tuple[Tag, ...] = ()


def pre_tag(lang: str = "") -> Tag:
    """A ``pre`` block, with ``<code class="language-…">`` inside when ``lang`` is given."""
    if not lang:
        return Tag("pre", "<pre>", "</pre>")
    return Tag("pre", f'<pre><code class="language-{html.escape(lang, quote=True)}">', "</code></pre>")


def href_allowed(url: str) -> bool:
    """True for link targets Telegram should get: ``http(s)`` URLs with a host and no spaces or
    control characters (:func:`runtime.reply.media.share_url_problem`), and ``tg://`` links. Anything
    else (``javascript:``, ``data:``, ``file:``, relative) is not sent as a link."""
    if url[:5].lower() == "tg://":
        return len(url) > 5 and share_url_problem("https://" + url[5:]) is None
    return share_url_problem(url) is None


def link_tag(href: str) -> Tag | None:
    """A fresh ``<a href>`` tag (attribute-escaped), or None when :func:`href_allowed` refuses ``href``."""
    if not href_allowed(href):
        return None
    return Tag("a", f'<a href="{html.escape(href, quote=True)}">', "</a>", next(_LINK_IDS))


def link(text: str, href: str) -> Run:
    """A link run; plain text when :func:`href_allowed` refuses ``href``."""
    tag = link_tag(href)
    return Run(text, () if tag is None else (tag,))


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units (characters outside the BMP count 2), as Telegram counts."""
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def runs_length(runs: list[Run]) -> int:
    """Visible length of ``runs`` in UTF-16 code units."""
    return sum(utf16_len(r.text) for r in runs)


def _fix_tags(tags: tuple[Tag, ...]) -> tuple[Tag, ...]:
    """One run's tags made valid for Telegram (module docstring): blockquote outermost, no
    duplicates, one link, one blockquote, ``code``/``pre`` alone (or dropped inside a link/quote)."""
    kinds = {t.kind for t in tags}
    mono = [t for t in tags if t.kind in _MONO]
    if mono and not kinds & {"a", "blockquote"}:
        return (mono[0],)
    out: list[Tag] = []
    seen: set[str] = set()
    for t in sorted(tags, key=lambda t: t.kind != "blockquote"):  # stable: blockquote first
        if t.kind in _MONO or t.kind in seen:
            continue
        seen.add(t.kind)
        out.append(t)
    return tuple(out)


def normalize(runs: list[Run]) -> list[Run]:
    """Runs with valid nesting (:func:`_fix_tags`) and without empty texts."""
    return [Run(r.text, _fix_tags(r.tags)) for r in runs if r.text]


def to_html(runs: list[Run]) -> str:
    """Serialize runs (after :func:`normalize`) to Telegram HTML. Consecutive runs sharing their
    outer tags stay inside the same elements; text is HTML-escaped."""
    out: list[str] = []
    stack: list[Tag] = []
    for r in normalize(runs):
        keep = 0
        while keep < min(len(stack), len(r.tags)) and stack[keep] == r.tags[keep]:
            keep += 1
        out.extend(t.close for t in reversed(stack[keep:]))
        out.extend(t.open for t in r.tags[keep:])
        stack = list(r.tags)
        out.append(html.escape(r.text, quote=False))
    out.extend(t.close for t in reversed(stack))
    return "".join(out)


# --------------------------------------------------------------------------- splitting

_GRAPHEME = regex.compile(r"\X", regex.DOTALL)


class _Text:
    """The concatenated text of normalized runs with grapheme boundaries and UTF-16 offsets."""

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs
        self.text = "".join(r.text for r in runs)
        self.starts = list(itertools.accumulate((len(r.text) for r in runs[:-1]), initial=0))
        self.bounds = [0] + [m.end() for m in _GRAPHEME.finditer(self.text)]  # code point offsets
        units = [0]
        for a, b in itertools.pairwise(self.bounds):
            units.append(units[-1] + utf16_len(self.text[a:b]))
        self.units = units  # UTF-16 offset of each boundary

    def tags_at(self, pos: int) -> tuple[Tag, ...]:
        """Tags of the character at code point offset ``pos``."""
        return self.runs[bisect.bisect_right(self.starts, pos) - 1].tags

    def score(self, b: int) -> int:
        """How good a cut at code point offset ``b`` is: 4 (after a line break, outside every
        entity) … 1 (after a space, inside formatting), 0 (elsewhere), -1 inside a link."""
        shared = set(self.tags_at(b - 1)) & set(self.tags_at(b))
        if any(t.kind == "a" for t in shared):
            return -1
        ch = self.text[b - 1]
        if ch == "\n":
            return 4 if not shared else 3
        if ch.isspace():
            return 2 if not shared else 1
        return 0

    def cut(self, i: int, limit: int) -> int:
        """Index of the boundary ending the piece that starts at boundary ``i`` (see module docstring)."""
        base = self.units[i]
        j = bisect.bisect_right(self.units, base + limit) - 1  # furthest boundary that fits
        if j == len(self.bounds) - 1:
            return j
        if j == i:  # one grapheme cluster longer than the limit: cut it (nothing else fits)
            return i + 1
        best, best_score = j, -2
        for k in range(j, i, -1):
            s = self.score(self.bounds[k])
            if s > 0 and self.units[k] - base < limit // 2:
                s = 0  # too short a piece for a nicer cut
            if s > best_score:
                best, best_score = k, s
                if s == 4:
                    break
        return best

    def piece(self, a: int, b: int) -> list[Run]:
        """The runs between code point offsets ``a`` and ``b``."""
        out: list[Run] = []
        for r, start in zip(self.runs, self.starts, strict=True):
            lo, hi = max(a, start), min(b, start + len(r.text))
            if lo < hi:
                out.append(Run(r.text[lo - start : hi - start], r.tags))
        return out


def split_runs(runs: list[Run], limit: int = TELEGRAM_TEXT_LIMIT) -> list[list[Run]]:
    """Split runs into pieces of at most ``limit`` UTF-16 code units each (module docstring);
    pieces that are empty or whitespace only are left out.

    Raises:
        ValueError: ``limit`` < 2 (a character outside the BMP needs 2 units).
    """
    if limit < 2:
        raise ValueError("limit must be >= 2")
    text = _Text(normalize(runs))
    if not text.runs:
        return []
    pieces: list[list[Run]] = []
    i = 0
    while i < len(text.bounds) - 1:
        j = text.cut(i, limit)
        a, b = text.bounds[i], text.bounds[j]
        if j == i + 1 and text.units[j] - text.units[i] > limit:  # an over-long cluster: code points
            b = a + limit // 2  # at most 2 units each
            text.bounds.insert(j, b)
            text.units.insert(j, text.units[i] + utf16_len(text.text[a:b]))
        if text.text[a:b].strip():
            pieces.append(text.piece(a, b))
        i = j
    return pieces

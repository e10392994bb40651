"""Telegram HTML text building: styled runs, Markdown → runs, and splitting at 4,096 characters.

Telegram's ``parse_mode: "HTML"`` (Bot API "Formatting options") accepts ``<b> <i> <u> <s>
<code> <pre> <a href> <blockquote> <tg-spoiler>`` and needs only ``&``, ``<`` and ``>`` escaped
in text (``"`` too inside attribute values).

Text is kept as a list of :class:`Run` (plain text + the tags around it) until the end, so a
long message can be split anywhere on a **character** boundary (never inside a tag, an HTML
entity, or a multi-byte character) and every piece is still balanced HTML: each piece re-opens
and closes its runs' tags. The limit counts visible characters (Python code points), as Telegram's
"1-4096 characters after entities parsing".

Markdown support (a deliberate subset; anything else stays literal text): ATX headings (bold),
``**bold**`` / ``__bold__``, ``*italic*`` / ``_italic_``, ``~~strike~~``, ``||spoiler||``,
inline ``code``, fenced code blocks (``<pre><code class="language-x">``), ``[text](url)`` links,
``![alt](url)`` images (a link: Markdown images never replace ``image`` segments,
docs/decisions.md#reply-segments), ``- item`` / ``* item`` bullets (``•``), and ``> quote`` lines
(``<blockquote>``).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

__all__ = ["TELEGRAM_TEXT_LIMIT", "Run", "link", "markdown_runs", "runs_length", "split_runs", "to_html"]

TELEGRAM_TEXT_LIMIT = 4096
"""Bot API: message text is 1-4096 characters after entities parsing."""

Tag = tuple[str, str]


@dataclass(frozen=True)
class Run:
    """A piece of visible text and the HTML tags (open, close) around it, outermost first."""

    text: str
    tags: tuple[Tag, ...] = ()


def link(text: str, href: str) -> Run:
    """A ``<a href>`` run (the URL is attribute-escaped)."""
    return Run(text, ((f'<a href="{html.escape(href, quote=True)}">', "</a>"),))


def runs_length(runs: list[Run]) -> int:
    """Visible length in characters (code points)."""
    return sum(len(r.text) for r in runs)


def to_html(runs: list[Run]) -> str:
    """Serialize runs to Telegram HTML; adjacent runs with the same tags are merged."""
    merged: list[Run] = []
    for r in runs:
        if not r.text:
            continue
        if merged and merged[-1].tags == r.tags:
            merged[-1] = Run(merged[-1].text + r.text, r.tags)
        else:
            merged.append(r)
    out: list[str] = []
    for r in merged:
        out.append("".join(t[0] for t in r.tags))
        out.append(html.escape(r.text, quote=False))
        out.append("".join(t[1] for t in reversed(r.tags)))
    return "".join(out)


def split_runs(runs: list[Run], limit: int = TELEGRAM_TEXT_LIMIT) -> list[list[Run]]:
    """Split runs into pieces of at most ``limit`` visible characters, cutting on character
    boundaries (a run may be cut in two; each half keeps its tags).

    Raises:
        ValueError: ``limit`` < 1.
    """
    if limit < 1:
        raise ValueError("limit must be >= 1")
    pieces: list[list[Run]] = [[]]
    room = limit
    for r in runs:
        text = r.text
        while text:
            if room == 0:
                pieces.append([])
                room = limit
            head, text = text[:room], text[room:]
            pieces[-1].append(Run(head, r.tags))
            room -= len(head)
    return [p for p in pieces if p]


# --------------------------------------------------------------------------- Markdown → runs

_B = ("<b>", "</b>")
_I = ("<i>", "</i>")
_S = ("<s>", "</s>")
_SP = ("<tg-spoiler>", "</tg-spoiler>")
_CODE = ("<code>", "</code>")
_QUOTE = ("<blockquote>", "</blockquote>")

_INLINE = re.compile(
    r"(?P<code>`[^`\n]+`)"
    r"|(?P<img>!\[(?P<img_alt>[^\]\n]*)\]\((?P<img_url>[^)\s]+)\))"
    r"|(?P<link>\[(?P<link_text>[^\]\n]+)\]\((?P<link_url>[^)\s]+)\))"
    r"|(?P<bold>\*\*(?P<bold_a>.+?)\*\*|__(?P<bold_b>.+?)__)"
    r"|(?P<strike>~~(?P<strike_t>.+?)~~)"
    r"|(?P<spoiler>\|\|(?P<spoiler_t>.+?)\|\|)"
    r"|(?P<italic>(?<![\w*])\*(?P<it_a>[^*\s](?:[^*\n]*[^*\s])?)\*(?![\w*])"
    r"|(?<![\w_])_(?P<it_b>[^_\s](?:[^_\n]*[^_\s])?)_(?![\w_]))"
)
_FENCE = re.compile(r"^```([\w+#.-]*)[ \t]*$")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.*?)[ \t#]*$")
_BULLET = re.compile(r"^([ \t]*)[-*+][ \t]+(.*)$")
_QUOTE_LINE = re.compile(r"^>[ \t]?(.*)$")


def _inline(text: str, tags: tuple[Tag, ...]) -> list[Run]:
    """Inline Markdown of one line → runs."""
    runs: list[Run] = []
    pos = 0
    for m in _INLINE.finditer(text):
        if m.start() > pos:
            runs.append(Run(text[pos : m.start()], tags))
        if m.group("code"):
            runs.append(Run(m.group("code")[1:-1], (*tags, _CODE)))
        elif m.group("img"):
            alt = m.group("img_alt") or m.group("img_url")
            runs.append(Run(alt, (*tags, link("", m.group("img_url")).tags[0])))
        elif m.group("link"):
            runs.extend(_inline(m.group("link_text"), (*tags, link("", m.group("link_url")).tags[0])))
        elif m.group("bold"):
            runs.extend(_inline(m.group("bold_a") or m.group("bold_b"), (*tags, _B)))
        elif m.group("strike"):
            runs.extend(_inline(m.group("strike_t"), (*tags, _S)))
        elif m.group("spoiler"):
            runs.extend(_inline(m.group("spoiler_t"), (*tags, _SP)))
        else:
            runs.extend(_inline(m.group("it_a") or m.group("it_b"), (*tags, _I)))
        pos = m.end()
    if pos < len(text):
        runs.append(Run(text[pos:], tags))
    return runs


def markdown_runs(source: str) -> list[Run]:
    """Convert Markdown to runs (the subset in the module docstring). Line breaks are kept."""
    runs: list[Run] = []
    lines = source.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        nl = "\n" if i < len(lines) - 1 else ""
        fence = _FENCE.match(line)
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            if end is not None:
                lang = fence.group(1)
                code_open = f'<code class="language-{html.escape(lang, quote=True)}">' if lang else "<code>"
                code_tag = (code_open, "</code>")
                body = "\n".join(lines[i + 1 : end])
                runs.append(Run(body, (("<pre>", "</pre>"), code_tag)))
                runs.append(Run("\n" if end < len(lines) - 1 else ""))
                i = end + 1
                continue
        heading = _HEADING.match(line)
        bullet = _BULLET.match(line)
        quote = _QUOTE_LINE.match(line)
        if heading:
            runs.extend(_inline(heading.group(1), (_B,)))
        elif bullet:
            runs.append(Run(bullet.group(1) + "• "))
            runs.extend(_inline(bullet.group(2), ()))
        elif quote:
            runs.extend(_inline(quote.group(1), (_QUOTE,)))
            if nl and _QUOTE_LINE.match(lines[i + 1]):
                runs.append(Run("\n", (_QUOTE,)))
                i += 1
                continue
        else:
            runs.extend(_inline(line, ()))
        if nl:
            runs.append(Run(nl))
        i += 1
    return [r for r in runs if r.text]

"""Markdown → Telegram HTML runs (:class:`runtime.platforms.tg_html.Run`).

A deliberate subset; anything else stays literal text:

* blocks: ATX headings (bold), fenced code blocks (``<pre>``, with ``<code class="language-x">``
  when the fence names a language), ``- item`` / ``* item`` / ``+ item`` bullets (``•``), and
  ``> quote`` lines: consecutive quote lines are **one** ``<blockquote>`` (a heading or a bullet
  inside a quote line keeps its formatting);
* inline: ``**bold**`` / ``__bold__``, ``*italic*`` / ``_italic_``, ``~~strike~~``,
  ``||spoiler||``, inline ``code``, ``[text](url)`` links and ``![alt](url)`` images (a link:
  Markdown images never replace ``image`` segments, docs/decisions.md#reply-segments).

Link URLs may contain balanced parentheses (``[Foo](https://en.wikipedia.org/wiki/Foo_(bar))``
keeps ``(bar)``) and may be followed by a ``"title"`` (dropped). Only ``http(s)`` and ``tg://``
targets become links (:func:`runtime.platforms.tg_html.href_allowed`); for any other
(``javascript:``, ``data:``, relative) the link text is kept as plain text. Nesting that Telegram
forbids (code inside bold, a link or a quote) is fixed later by
:func:`runtime.platforms.tg_html.normalize`.
"""

from __future__ import annotations

import re

import regex

from runtime.platforms.tg_html import (
    BLOCKQUOTE,
    BOLD,
    CODE,
    ITALIC,
    SPOILER,
    STRIKE,
    Run,
    Tag,
    link_tag,
    pre_tag,
)

__all__ = ["markdown_runs"]

_URL = r"(?:[^()\s]|(?&paren))+"  # balanced parentheses allowed
_TITLE = r"(?:[ \t]+\"[^\"\n]*\")?"  # an optional "title", dropped
_INLINE = regex.compile(
    r"(?(DEFINE)(?P<paren>\((?:[^()\s]|(?&paren))*\)))"
    r"(?P<code>`[^`\n]+`)"
    rf"|(?P<img>!\[(?P<img_alt>[^\]\n]*)\]\((?P<img_url>{_URL}){_TITLE}\))"
    rf"|(?P<link>\[(?P<link_text>[^\]\n]+)\]\((?P<link_url>{_URL}){_TITLE}\))"
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
    """Inline Markdown of one line → runs, inside ``tags``."""
    runs: list[Run] = []
    pos = 0
    for m in _INLINE.finditer(text):
        if m.start() > pos:
            runs.append(Run(text[pos : m.start()], tags))
        if m.group("code"):
            runs.append(Run(m.group("code")[1:-1], (*tags, CODE)))
        elif m.group("img"):
            url = m.group("img_url")
            a = link_tag(url)
            runs.append(Run(m.group("img_alt") or url, tags if a is None else (*tags, a)))
        elif m.group("link"):
            a = link_tag(m.group("link_url"))
            runs.extend(_inline(m.group("link_text"), tags if a is None else (*tags, a)))
        elif m.group("bold"):
            runs.extend(_inline(m.group("bold_a") or m.group("bold_b"), (*tags, BOLD)))
        elif m.group("strike"):
            runs.extend(_inline(m.group("strike_t"), (*tags, STRIKE)))
        elif m.group("spoiler"):
            runs.extend(_inline(m.group("spoiler_t"), (*tags, SPOILER)))
        else:
            runs.extend(_inline(m.group("it_a") or m.group("it_b"), (*tags, ITALIC)))
        pos = m.end()
    if pos < len(text):
        runs.append(Run(text[pos:], tags))
    return runs


def _line(line: str, tags: tuple[Tag, ...]) -> list[Run]:
    """One line that is not a fence: heading, bullet or plain inline text, inside ``tags``."""
    heading = _HEADING.match(line)
    if heading:
        return _inline(heading.group(1), (*tags, BOLD))
    bullet = _BULLET.match(line)
    if bullet:
        return [Run(bullet.group(1) + "• ", tags), *_inline(bullet.group(2), tags)]
    return _inline(line, tags)


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
                runs.append(Run("\n".join(lines[i + 1 : end]), (pre_tag(fence.group(1)),)))
                runs.append(Run("\n" if end < len(lines) - 1 else ""))
                i = end + 1
                continue
        quote = _QUOTE_LINE.match(line)
        if quote:
            runs.extend(_line(quote.group(1), (BLOCKQUOTE,)))
            if nl and _QUOTE_LINE.match(lines[i + 1]):
                runs.append(Run("\n", (BLOCKQUOTE,)))  # the next quote line continues this block
                i += 1
                continue
        else:
            runs.extend(_line(line, ()))
        if nl:
            runs.append(Run(nl))
        i += 1
    return [r for r in runs if r.text]

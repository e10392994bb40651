"""What the model reads for an inbound message's non-text segments
(docs/decisions.md#platform-placeholders).

The inbound ``text`` (:class:`runtime.platforms.base.InboundMessage`) holds only text and mentions;
a QQ face, a dice or a Telegram sticker sent alone would reach the model as an empty user message.
:func:`model_lines` gives one line per non-text canonical segment, in order, appended to the text
of the turn's user message; :func:`model_text` joins them and is never empty. Forms:

* ``image``/``audio``/``video``/``file`` with a reference → its media reference line,
  ``[image url=https://…]`` (:func:`runtime.reply.provenance.inbound_media_lines`);
* a Telegram sticker (an ``image`` whose data has ``sticker``: its emoji, maybe ``""``) →
  ``[sticker 😀 file=<file_id>]`` (``[sticker file=<file_id>]`` without an emoji);
* media without a reference (inline data) → ``[image]``, ``[sticker]`` …;
* ``face {id}`` → ``[face 14]``; ``dice`` / ``rps`` → ``[dice]`` / ``[rps]``;
* ``forward {forward_id}`` → ``[forward <forward_id>]``;
* ``share {url, title}`` → ``[share <title> <url>]`` (``[share <url>]`` without a title);
* ``text``, ``mention``, ``reply`` → no line (text and mentions are the text; a quote is not
  content);
* any other type → ``[<type>]``.

A message that still has nothing to show (a ``reply`` alone, a Telegram location or poll: no
canonical segment) reads :data:`NO_TEXT`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.llm.types import NO_TEXT
from runtime.reply.provenance import inbound_media_lines

__all__ = ["NO_TEXT", "model_lines", "model_text"]

_MEDIA = frozenset({"image", "audio", "video", "file"})
_SILENT = frozenset({"text", "mention", "reply"})


def _line(seg: dict[str, Any]) -> str | None:
    """The line of one canonical segment (module table), ``None`` for text, mention and reply."""
    if not isinstance(seg, dict):  # a third-party codec's odd segment: no line, never an error
        return None
    kind = seg.get("type")
    data = seg.get("data")
    data = data if isinstance(data, dict) else {}
    if not isinstance(kind, str) or kind in _SILENT:
        return None
    if kind in _MEDIA:
        sticker = data.get("sticker")
        label = f"sticker {sticker}".rstrip() if isinstance(sticker, str) else kind
        refs = inbound_media_lines([{"type": label, "data": data}])
        return refs[0] if refs else f"[{label}]"
    if kind == "face":
        return f"[face {data.get('id', '')}]"
    if kind == "forward":
        return f"[forward {data.get('forward_id', '')}]"
    if kind == "share":
        parts = ("share", data.get("title"), data.get("url"))
        return "[" + " ".join(str(p) for p in parts if p not in (None, "")) + "]"
    return f"[{kind}]"


def model_lines(segments: Sequence[dict[str, Any]]) -> list[str]:
    """One line per non-text segment of ``segments`` (canonical dicts), in order (module table)."""
    return [line for line in map(_line, segments) if line is not None]


def model_text(text: str, segments: Sequence[dict[str, Any]]) -> str:
    """``text`` and the :func:`model_lines` of ``segments``, one per line; :data:`NO_TEXT` when
    both are empty (whitespace-only text counts as empty)."""
    joined = "\n".join(p for p in (text, *model_lines(segments)) if p)
    return joined if joined.strip() else NO_TEXT

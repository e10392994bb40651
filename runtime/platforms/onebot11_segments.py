"""OneBot v11 message segments ⇄ canonical segments (the mapping half of
:mod:`runtime.platforms.onebot11`, whose module docstring has the table)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.platforms.base import MalformedEvent, count_degraded
from runtime.platforms.common import MediaPathError, media_filename, media_unavailable, resolve_media_path
from runtime.reply.media import file_ref_problem, refused_share_text
from runtime.reply.segments import (
    AudioSegment,
    DiceSegment,
    FaceSegment,
    FileSegment,
    ForwardSegment,
    ImageSegment,
    MarkdownSegment,
    MentionSegment,
    Reply,
    ReplySegment,
    RpsSegment,
    ShareSegment,
    TextSegment,
    VideoSegment,
)

__all__ = ["PLATFORM", "from_onebot_segments", "plain_text", "to_onebot_segments"]

PLATFORM = "onebot11"
_MEDIA_TYPES = {"image": "image", "audio": "record", "video": "video", "file": "file"}
_MEDIA_TYPES_IN = {"image": "image", "record": "audio", "video": "video", "file": "file"}


def from_onebot_segments(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Map OneBot v11 segments to canonical segments.

    ``at`` → ``mention``; ``image``/``record``/``video``/``file`` → ``image``/``audio``/``video``/
    ``file`` with ``media: {kind: "url", value: url}`` when an http(s) URL is known, else
    ``{kind: "file", value: file}`` (an opaque platform reference); ``reply {id}`` →
    ``reply {message_id}``; ``forward {id}`` → ``forward {forward_id}``; ``face`` id as string;
    ``dice``/``rps`` → empty data; ``share`` keeps url/title; ``mface`` (a market sticker) → the
    text ``[sticker <summary>]`` (``[sticker]`` without one). Any other type (``json``, ``xml``,
    ``poke``…) becomes a ``text`` segment ``[<type>]`` (a placeholder,
    docs/decisions.md#platform-degrade-explicitly: the transcript and the model see that something
    was sent; its payload is not interpreted).

    Raises:
        MalformedEvent: a segment is not ``{"type": str, "data": object}`` (``data: null`` or a
            missing ``data`` included), or a value the mapping reads is not a string (ids: a
            string or an integer; ``text`` must be a string).
    """
    out: list[dict[str, Any]] = []
    for seg in segments:
        if not isinstance(seg, dict) or not isinstance(seg.get("type"), str):
            raise MalformedEvent(f"OneBot segment must be an object with a string 'type': {seg!r:.80}")
        data = seg.get("data")
        if not isinstance(data, dict):
            raise MalformedEvent(f"OneBot segment 'data' must be an object: {seg!r:.80}")
        t = seg["type"]
        if t == "text":
            out.append({"type": "text", "data": {"text": _str_field(data, "text", t, ids=False)}})
        elif t == "at":
            out.append({"type": "mention", "data": {"target": _str_field(data, "qq", t)}})
        elif t in _MEDIA_TYPES_IN:
            url = _str_field(data, "url", t, ids=False)
            ref = _str_field(data, "file", t, ids=False)
            if url.startswith(("http://", "https://")):
                media = {"kind": "url", "value": url}
            elif ref.startswith(("http://", "https://")):
                media = {"kind": "url", "value": ref}
            else:
                media = {"kind": "file", "value": ref}
            out.append({"type": _MEDIA_TYPES_IN[t], "data": {"media": media}})
        elif t == "reply":
            out.append({"type": "reply", "data": {"message_id": _str_field(data, "id", t)}})
        elif t == "forward":
            out.append({"type": "forward", "data": {"forward_id": _str_field(data, "id", t)}})
        elif t == "face":
            out.append({"type": "face", "data": {"id": _str_field(data, "id", t)}})
        elif t in ("dice", "rps"):
            out.append({"type": t, "data": {}})
        elif t == "share":
            share = {"url": _str_field(data, "url", t, ids=False)}
            share["title"] = _str_field(data, "title", t, ids=False)
            out.append({"type": "share", "data": share})
        elif t == "mface":  # a market sticker (NapCat, Lagrange, LLOneBot): its summary is "[嘿嘿]"
            summary = _str_field(data, "summary", t, ids=False).strip().strip("[]")
            out.append({"type": "text", "data": {"text": f"[sticker {summary}]" if summary else "[sticker]"}})
        else:
            out.append({"type": "text", "data": {"text": f"[{t}]"}})
    return out


def _str_field(data: dict[str, Any], key: str, seg_type: str, *, ids: bool = True) -> str:
    """``data[key]`` of a OneBot segment as a string (``""`` when absent or null); with ``ids`` an
    integer (never a boolean) is accepted too and written in decimal.

    Raises:
        MalformedEvent: any other type, naming the segment type and key.
    """
    value = data.get(key)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if ids and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    kind = "a string or an integer" if ids else "a string"
    raise MalformedEvent(f"OneBot {seg_type} segment data.{key} must be {kind}, got {value!r:.60}")


def plain_text(segments: list[dict[str, Any]]) -> str:
    """Plain text of canonical segments: text verbatim, mentions as ``@<id>`` (followed by a space
    when text follows without one, as QQ clients show it), no media."""
    parts: list[str] = []
    after_mention = False
    for seg in segments:
        if seg["type"] == "text":
            text = seg["data"]["text"]
            if after_mention and text and not text[0].isspace():
                parts.append(" ")
            parts.append(text)
            after_mention = False
        elif seg["type"] == "mention":
            parts.append("@" + seg["data"]["target"])
            after_mention = True
    return "".join(parts)


def to_onebot_segments(
    reply: Reply, media_dir: Path | None, *, forward_api: bool = False
) -> list[dict[str, Any]]:
    """Map a reply's segments to OneBot v11 segments (table in the module docstring).

    ``markdown`` is degraded (sent as text, counted in SEGMENTS_DEGRADED), and so is ``forward``
    unless ``forward_api`` (then it stays a ``forward {id}`` segment, which :meth:`OneBot11Codec.render`
    sends through the forward-message API, never inside ``send_*_msg``). A
    ``path`` medium outside the media directory, or a ``file`` reference that is a URI or a path
    (``runtime.reply.media.file_ref_problem``), becomes the "attachment unavailable" text; a ``share``
    link that is not http(s) becomes "<title> [link unavailable]" (both counted in MEDIA_REJECTED).
    """
    out: list[dict[str, Any]] = []
    for seg in reply.segments:
        if isinstance(seg, TextSegment):
            out.append({"type": "text", "data": {"text": seg.data.text}})
        elif isinstance(seg, MarkdownSegment):
            count_degraded(PLATFORM, "markdown")
            out.append({"type": "text", "data": {"text": seg.data.content}})
        elif isinstance(seg, MentionSegment):
            out.append({"type": "at", "data": {"qq": seg.data.target}})
        elif isinstance(seg, ImageSegment | AudioSegment | VideoSegment | FileSegment):
            media = seg.data.media
            if media.kind == "base64":
                ref = "base64://" + media.value
            elif media.kind == "path":
                try:
                    ref = resolve_media_path(media.value, media_dir).as_uri()
                except MediaPathError as exc:
                    out.append({"type": "text", "data": {"text": media_unavailable(PLATFORM, seg.type, exc)}})
                    continue
            else:
                problem = file_ref_problem(media.value) if media.kind == "file" else None
                if problem is not None:  # a URI or a path would be read by the implementation
                    bad = MediaPathError(problem, "bad_file_ref")
                    out.append({"type": "text", "data": {"text": media_unavailable(PLATFORM, seg.type, bad)}})
                    continue
                ref = media.value
            data: dict[str, Any] = {"file": ref}
            if isinstance(seg, FileSegment):
                data["name"] = media_filename(media.kind, media.value)
            out.append({"type": _MEDIA_TYPES[seg.type], "data": data})
        elif isinstance(seg, ReplySegment):
            out.append({"type": "reply", "data": {"id": seg.data.message_id}})
        elif isinstance(seg, ForwardSegment):
            if forward_api:
                out.append({"type": "forward", "data": {"id": seg.data.forward_id}})
            else:
                count_degraded(PLATFORM, "forward")
                out.append({"type": "text", "data": {"text": f"[forward {seg.data.forward_id}]"}})
        elif isinstance(seg, FaceSegment):
            out.append({"type": "face", "data": {"id": str(seg.data.id)}})
        elif isinstance(seg, DiceSegment | RpsSegment):
            out.append({"type": seg.type, "data": {}})
        elif isinstance(seg, ShareSegment):
            refused = refused_share_text(PLATFORM, seg)
            if refused is not None:
                out.append({"type": "text", "data": {"text": refused}})
                continue
            out.append({"type": "share", "data": {"url": seg.data.url, "title": seg.data.title}})
    return out

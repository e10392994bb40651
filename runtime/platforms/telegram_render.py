"""Telegram outbound: a :class:`~runtime.reply.segments.Reply` → Bot API calls, in chat order.

The reply is cut into *chunks*: text (consecutive text / markdown / mention / share / degraded
segments, as :class:`~runtime.platforms.tg_html.Run` lists), media runs (consecutive image / audio /
video / file segments) and dice. Whitespace-only text is dropped, so media separated only by blank
text form one run. Then:

* **Captions.** A media run takes as its caption the text right after it if that fits
  :data:`~runtime.platforms.tg_html.CAPTION_LIMIT` (1,024 UTF-16 code units as displayed), else the
  text right before it if that fits and no other run took it (text first, then media: the caption). The
  caption is Telegram HTML (``caption`` + ``parse_mode: "HTML"``) on the run's first item. Text
  that is nobody's caption is sent as ``sendMessage`` pieces
  (:func:`~runtime.platforms.tg_html.split_runs`: 4,096 UTF-16 units each).
* **Albums.** Within a media run, consecutive items that Telegram may group (photos with videos,
  documents with documents, audios with audios: Bot API ``sendMediaGroup``) go out as
  ``sendMediaGroup`` calls of 2-10 items (more than 10 → several albums); a lone item goes as
  ``sendPhoto`` / ``sendVideo`` / ``sendAudio`` / ``sendDocument``. The order of the items is kept.
* Media by URL or ``file_id`` are sent in JSON; ``base64``/``path`` media are uploaded as
  multipart (in an album each upload is a file field ``media<n>`` named by ``attach://media<n>``).
* ``dice`` → ``sendDice``. The first call carries ``reply_parameters`` (a ``reply`` segment, or in
  groups the answered message).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filetype

from runtime.platforms.base import ApiCall, MultipartFile, RenderTarget, count_degraded
from runtime.platforms.common import MediaPathError, media_filename, media_unavailable, read_media_path
from runtime.platforms.telegram_inbound import PLATFORM
from runtime.platforms.tg_html import CAPTION_LIMIT, Run, link, runs_length, split_runs, to_html
from runtime.platforms.tg_markdown import markdown_runs
from runtime.reply.media import file_ref_problem, refused_share_text
from runtime.reply.segments import (
    AudioSegment,
    DiceSegment,
    FaceSegment,
    FileSegment,
    ForwardSegment,
    ImageSegment,
    MarkdownSegment,
    Media,
    MentionSegment,
    Reply,
    ReplySegment,
    RpsSegment,
    Segment,
    ShareSegment,
    TextSegment,
    VideoSegment,
)

__all__ = ["ALBUM_MAX", "MAX_MESSAGE_ID", "TelegramRenderer", "native_message_id"]

MAX_MESSAGE_ID = 2**63 - 1
"""Largest message id a quote may name (Bot API ids are positive integers)."""

ALBUM_MAX = 10
"""Bot API ``sendMediaGroup``: 2-10 items per album."""

SEND = {"image": ("sendPhoto", "photo"), "audio": ("sendAudio", "audio"),
        "video": ("sendVideo", "video"), "file": ("sendDocument", "document")}  # fmt: skip
"""Segment type → (single-item method, its media field = the ``InputMedia`` type)."""

_ALBUM_CLASS = {"image": "visual", "video": "visual", "audio": "audio", "file": "document"}
"""Items of one class may share an album (Bot API: documents and audios only with their own kind)."""


def native_message_id(ref: str, chat_id: str | None = None) -> int | None:
    """The Bot API ``message_id`` to quote for a message reference, or ``None`` (do not quote).

    ``ref`` is ``"<chat_id>:<message_id>"`` (the per-bot unique form of
    :attr:`InboundMessage.message_id` and of sent ids) or a bare ``"<message_id>"``. A quote can
    only name a message of the chat being answered: with ``chat_id`` given, a reference into
    another chat gives ``None``; so does anything that is not a positive integer id up to
    :data:`MAX_MESSAGE_ID` (a model-written ``reply`` segment may hold any string; a bad quote
    would make Telegram refuse the whole send)."""
    chat, sep, tail = ref.rpartition(":")
    if sep and chat_id is not None and chat != chat_id:
        return None
    if not (tail.isascii() and tail.isdigit()):
        return None
    value = int(tail)
    return value if 0 < value <= MAX_MESSAGE_ID else None


def _chat_id(raw: str) -> int | str:
    """Numeric chat ids (negative for groups) go as integers; ``@channelname`` stays a string."""
    try:
        return int(raw)
    except ValueError:
        return raw


@dataclass(frozen=True)
class MediaItem:
    """One attachment to send: segment type, its reference, and the bytes to upload (None: by reference)."""

    seg_type: str
    media: Media
    upload: MultipartFile | None


@dataclass
class _Text:
    runs: list[Run]
    caption: bool = False  # taken as a media run's caption


@dataclass
class _MediaRun:
    items: list[MediaItem]
    caption: list[Run] | None = None


class _Dice:
    pass


_Chunk = _Text | _MediaRun | _Dice


def _text_runs(seg: Segment) -> list[Run] | None:
    """Runs of a text-like segment (degraded types counted), None for media, dice and reply."""
    if isinstance(seg, TextSegment):
        return [Run(seg.data.text)]
    if isinstance(seg, MarkdownSegment):
        return markdown_runs(seg.data.content)
    if isinstance(seg, MentionSegment):
        return [link("@" + seg.data.target, f"tg://user?id={seg.data.target}")]
    if isinstance(seg, ShareSegment):
        refused = refused_share_text(PLATFORM, seg)  # javascript:, data:, … never become a link
        if refused is not None:
            return [Run(refused)]
        count_degraded(PLATFORM, "share")
        return [link(seg.data.title or seg.data.url, seg.data.url)]
    if isinstance(seg, FaceSegment):
        count_degraded(PLATFORM, "face")
        return [Run(f"[face {seg.data.id}]")]
    if isinstance(seg, RpsSegment):
        count_degraded(PLATFORM, "rps")
        return [Run("[rock-paper-scissors]")]
    if isinstance(seg, ForwardSegment):
        count_degraded(PLATFORM, "forward")
        return [Run(f"[forward {seg.data.forward_id}]")]
    return None


def _blank(text: _Text) -> bool:
    return not "".join(r.text for r in text.runs).strip()


def _assign_captions(chunks: list[_Chunk]) -> None:
    """Give each media run its caption (module docstring), marking the text taken."""
    for k, chunk in enumerate(chunks):
        if not isinstance(chunk, _MediaRun):
            continue
        after = chunks[k + 1] if k + 1 < len(chunks) else None
        before = chunks[k - 1] if k > 0 else None
        for candidate in (after, before):
            free = isinstance(candidate, _Text) and not candidate.caption
            if free and isinstance(candidate, _Text) and runs_length(candidate.runs) <= CAPTION_LIMIT:
                candidate.caption = True
                chunk.caption = candidate.runs
                break


def _groups(items: list[MediaItem]) -> list[list[MediaItem]]:
    """Consecutive items of one album class, at most :data:`ALBUM_MAX` per group, in order."""
    groups: list[list[MediaItem]] = []
    for item in items:
        last = groups[-1] if groups else None
        if last and len(last) < ALBUM_MAX and _ALBUM_CLASS[last[0].seg_type] == _ALBUM_CLASS[item.seg_type]:
            last.append(item)
        else:
            groups.append([item])
    return groups


def _form(fields: dict[str, Any]) -> dict[str, str]:
    """Multipart text fields: strings as they are, anything else as JSON."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}


class TelegramRenderer:
    """Builds the Bot API calls of a reply (module docstring).

    Args:
        make_call: ``(method, kind, **ApiCall fields) -> ApiCall`` (adds the bot's API base and token).
        media_dir: Directory that ``path`` media must lie under (None: no ``path`` media).
    """

    def __init__(self, make_call: Callable[..., ApiCall], media_dir: Path | None) -> None:
        self._call = make_call
        self.media_dir = media_dir

    def render(
        self, reply: Reply, target: RenderTarget, attachments: Mapping[int, Any] | None = None
    ) -> list[ApiCall]:
        """Turn a reply into Bot API calls in order.

        Args:
            reply: The validated reply.
            target: Chat and the message being answered.
            attachments: Optional bytes already read by ``runtime.reply.media.check_reply_media``
                (segment index → object with ``.data``/``.mime``), reused for uploads.

        An attachment that cannot be read (``path`` outside the media directory, bad base64, a
        ``file`` reference that is a URI or a path) becomes the "attachment unavailable" text, and
        a ``share`` link that is not http(s) "<title> [link unavailable]"; both counted in
        MEDIA_REJECTED.
        """
        chat_id = _chat_id(target.scene_id)
        quoted = [s.data.message_id for s in reply.segments if isinstance(s, ReplySegment)]
        quote: str | None = quoted[0] if quoted else None
        if quote is None and target.scene_type != "private" and target.reply_to:
            quote = target.reply_to
        native = native_message_id(quote, target.scene_id) if quote is not None else None
        chunks = self._chunks(reply, attachments or {})
        _assign_captions(chunks)
        calls: list[ApiCall] = []

        def base() -> dict[str, Any]:
            first = not calls and native is not None  # only the first message quotes
            return {"chat_id": chat_id, **({"reply_parameters": {"message_id": native}} if first else {})}

        for chunk in chunks:
            if isinstance(chunk, _Dice):
                calls.append(self._call("sendDice", "dice", json_body=base()))
            elif isinstance(chunk, _Text):
                if not chunk.caption:
                    for piece in split_runs(chunk.runs):
                        body = {**base(), "text": to_html(piece), "parse_mode": "HTML"}
                        calls.append(self._call("sendMessage", "message", json_body=body))
            else:
                caption = chunk.caption
                for group in _groups(chunk.items):
                    calls.append(self._media_call(group, base(), caption))
                    caption = None
        return calls

    def _chunks(self, reply: Reply, attachments: Mapping[int, Any]) -> list[_Chunk]:
        """Segments → text / media run / dice chunks; whitespace-only text left out."""
        chunks: list[_Chunk] = []
        for index, seg in enumerate(reply.segments):
            runs = _text_runs(seg)
            item: MediaItem | None = None
            if isinstance(seg, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                media = seg.data.media
                try:
                    item = MediaItem(seg.type, media, self._upload(seg.type, media, attachments.get(index)))
                except MediaPathError as exc:
                    runs = [Run(media_unavailable(PLATFORM, seg.type, exc))]
            last = chunks[-1] if chunks else None
            if runs is not None:
                if isinstance(last, _Text):
                    last.runs.extend(runs)
                else:
                    chunks.append(_Text(list(runs)))
            elif item is not None:
                if isinstance(last, _Text) and _blank(last):
                    chunks.pop()
                    last = chunks[-1] if chunks else None
                if isinstance(last, _MediaRun):
                    last.items.append(item)
                else:
                    chunks.append(_MediaRun([item]))
            elif isinstance(seg, DiceSegment):
                chunks.append(_Dice())
        return [c for c in chunks if not (isinstance(c, _Text) and _blank(c))]

    def _upload(self, seg_type: str, media: Media, resolved: Any) -> MultipartFile | None:
        """The file to upload for ``base64``/``path`` media (None for ``url``/``file``: sent by reference).

        Raises:
            MediaPathError: unreadable ``path`` (outside the media directory, missing), bad base64,
                or a ``file`` reference that is a URI or a path (``bad_file_ref``; a local Bot API
                server would read ``file://`` values from its disk).
        """
        if media.kind == "file":
            problem = file_ref_problem(media.value)
            if problem is not None:
                raise MediaPathError(problem, "bad_file_ref")
        if media.kind in ("url", "file"):
            return None
        field = SEND[seg_type][1]
        data: bytes | None = getattr(resolved, "data", None)
        mime: str | None = getattr(resolved, "mime", None)
        if data is None:
            if media.kind == "base64":
                try:
                    data = base64.b64decode(media.value, validate=True)
                except ValueError as exc:
                    raise MediaPathError(f"bad base64: {exc}", "bad_base64") from None
            else:
                data = read_media_path(media.value, self.media_dir)
        if mime is None:
            guess = filetype.guess(data)
            mime = guess.mime if guess is not None else "application/octet-stream"
        name = media_filename(media.kind, media.value)
        if name == "file":
            ext = filetype.get_type(mime=mime)
            name = f"{field}.{ext.extension}" if ext is not None else field
        return MultipartFile(filename=name, content_type=mime, data=data)

    def _media_call(self, group: list[MediaItem], base: dict[str, Any], caption: list[Run] | None) -> ApiCall:
        """One ``send<Type>`` (a single item) or ``sendMediaGroup`` call, the caption on the first
        item; JSON when nothing is uploaded, else multipart."""
        extra = {"caption": to_html(caption), "parse_mode": "HTML"} if caption else {}
        if len(group) == 1:
            item = group[0]
            method, field = SEND[item.seg_type]
            if item.upload is None:
                return self._call(method, field, json_body={**base, field: item.media.value, **extra})
            return self._call(method, field, form=_form({**base, **extra}), files={field: item.upload})
        media: list[dict[str, Any]] = []
        files: dict[str, MultipartFile] = {}
        for n, item in enumerate(group):
            entry: dict[str, Any] = {"type": SEND[item.seg_type][1], "media": item.media.value}
            if item.upload is not None:
                files[f"media{n}"] = item.upload
                entry["media"] = f"attach://media{n}"
            media.append({**entry, **(extra if n == 0 else {})})
        if not files:
            return self._call("sendMediaGroup", "media_group", json_body={**base, "media": media})
        return self._call("sendMediaGroup", "media_group", form=_form({**base, "media": media}), files=files)

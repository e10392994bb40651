"""The IM reply contract: :class:`Reply` and its 13 segment types
(docs/decisions.md#reply-segments).

An IM agent's final answer is an ordered list of platform message segments::

    {"segments": [
        {"type": "markdown", "data": {"content": "**Result**\\n"}},
        {"type": "text", "data": {"text": "please "}},
        {"type": "mention", "data": {"target": "123456789"}},
        {"type": "image", "data": {"media": {"kind": "url", "value": "https://example.com/r.png"}}}
    ]}

These pydantic models are the single source of truth: the JSON Schema sent to providers is
generated from them (:meth:`Reply.model_json_schema`), never hand-written
(docs/decisions.md#reply-schema-from-types). Every object is closed
(``additionalProperties: false``) and lists every field as required, so strict structured-output
providers accept it (OpenAI strict ``json_schema``, Anthropic tool ``input_schema``, Gemini
``responseSchema``; the discriminated union is emitted as ``anyOf`` without OpenAPI
``discriminator``, defaults are not emitted).

Validation is strict (docs/decisions.md#reply-strict-validation): no type coercion (a numeric
``mention.target`` is invalid; ``face.id`` may be a string or an integer), no stripping of Markdown
fences, no extraction of JSON from prose, and a whole-reply verdict: one invalid segment invalidates
the reply. :meth:`Reply.model_validate_json` is the strict validation entry point and raises
``pydantic.ValidationError``. ``{"segments": []}`` means "no reply this turn".

Segment table:

=========================== ====================================== ==========================
type                        data (all fields required)             use
=========================== ====================================== ==========================
``text``                    ``{text: str}``                        plain text
``markdown``                ``{content: str}``                     headings, lists, code…
``mention``                 ``{target: str}``                      @ a real platform user id
``image|audio|video|file``  ``{media: {kind, value}}``             attachments
``reply``                   ``{message_id: str}``                  quote a platform message
``forward``                 ``{forward_id: str}``                  an existing forward ref
``face``                    ``{id: str | int}``                    platform emoji/face
``dice`` / ``rps``          ``{}``                                 dice, rock-paper-scissors
``share``                   ``{url: str, title: str}``             link share
=========================== ====================================== ==========================

``Media.kind`` is ``url`` (a link), ``path`` (a local path under the media directory),
``base64`` (inline bytes) or ``file`` (an opaque platform file reference that passes through).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import ExtraValues
from pydantic.json_schema import DEFAULT_REF_TEMPLATE, GenerateJsonSchema, JsonSchemaMode

from runtime.reply.json_schema import StrictJsonSchema, strict_json_schema
from runtime.reply.strict_json import json_contract_problem, json_invalid_error

__all__ = [
    "SEGMENT_TYPES",
    "AudioSegment",
    "DiceSegment",
    "EmptyData",
    "FaceData",
    "FaceSegment",
    "FileSegment",
    "ForwardData",
    "ForwardSegment",
    "ImageSegment",
    "MarkdownData",
    "MarkdownSegment",
    "Media",
    "MediaData",
    "MediaKind",
    "MediaSegment",
    "MentionData",
    "MentionSegment",
    "Reply",
    "ReplyData",
    "ReplySegment",
    "RpsSegment",
    "Segment",
    "ShareData",
    "ShareSegment",
    "TextData",
    "TextSegment",
    "VideoSegment",
]

MediaKind: TypeAlias = Literal["url", "path", "base64", "file"]
"""How ``Media.value`` is to be read: a URL, a local path, inline base64, or an opaque platform ref."""


class _Closed(BaseModel):
    """Base of every contract object: closed, strict (no coercion), immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @classmethod
    def model_json_schema(
        cls,
        by_alias: bool | None = True,
        ref_template: str = DEFAULT_REF_TEMPLATE,
        schema_generator: type[GenerateJsonSchema] = StrictJsonSchema,
        mode: JsonSchemaMode = "validation",
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Return the strict-provider JSON Schema of this model (generator: :class:`StrictJsonSchema`;
        a fresh copy of a cached value when called with the defaults)."""
        defaults = (by_alias, ref_template, schema_generator, mode) == (
            True, DEFAULT_REF_TEMPLATE, StrictJsonSchema, "validation"
        )  # fmt: skip
        if defaults and not kwargs:
            return strict_json_schema(cls)
        return super().model_json_schema(
            by_alias=by_alias,
            ref_template=ref_template,
            schema_generator=schema_generator,
            mode=mode,
            **kwargs,
        )


# --------------------------------------------------------------------------- data objects


class TextData(_Closed):
    """``text`` segment data."""

    text: str
    """Plain text, sent as is (``@name`` in it never notifies anyone)."""


class MarkdownData(_Closed):
    """``markdown`` segment data; the raw Markdown goes to the platform's renderer."""

    content: str
    """Markdown source (code fences inside the string are fine)."""


class MentionData(_Closed):
    """``mention`` segment data."""

    target: str
    """The platform user id as a JSON string (a number is invalid: no coercion)."""


class Media(_Closed):
    """An attachment reference: ``kind`` says how to read ``value``."""

    kind: MediaKind
    """``url`` | ``path`` | ``base64`` | ``file``."""
    value: str
    """The URL, the path (relative to the media directory), the base64 bytes, or the platform ref."""


class MediaData(_Closed):
    """``image``/``audio``/``video``/``file`` segment data."""

    media: Media


class ReplyData(_Closed):
    """``reply`` segment data (quote a platform message)."""

    message_id: str


class ForwardData(_Closed):
    """``forward`` segment data (an existing platform forward reference)."""

    forward_id: str


class FaceData(_Closed):
    """``face`` segment data: a platform emoji id, string or integer."""

    id: str | int


class EmptyData(_Closed):
    """``dice``/``rps`` segment data: the empty object ``{}``."""


class ShareData(_Closed):
    """``share`` segment data: a link card."""

    url: str
    title: str


# --------------------------------------------------------------------------- segments


class TextSegment(_Closed):
    """Plain text."""

    type: Literal["text"] = "text"
    data: TextData

    @classmethod
    def of(cls, text: str) -> TextSegment:
        """Build ``{"type": "text", "data": {"text": text}}``."""
        return cls(data=TextData(text=text))


class MarkdownSegment(_Closed):
    """Markdown rendered by the platform chain."""

    type: Literal["markdown"] = "markdown"
    data: MarkdownData

    @classmethod
    def of(cls, content: str) -> MarkdownSegment:
        """Build ``{"type": "markdown", "data": {"content": content}}``."""
        return cls(data=MarkdownData(content=content))


class MentionSegment(_Closed):
    """@ a platform user by id (never guessed from a nickname:
    docs/decisions.md#reply-mention-identity)."""

    type: Literal["mention"] = "mention"
    data: MentionData

    @classmethod
    def of(cls, target: str) -> MentionSegment:
        """Build ``{"type": "mention", "data": {"target": target}}``."""
        return cls(data=MentionData(target=target))


class _MediaSegmentMixin:
    @classmethod
    def of(cls, kind: MediaKind, value: str) -> Any:
        """Build ``{"type": <t>, "data": {"media": {"kind": kind, "value": value}}}``."""
        return cls(data=MediaData(media=Media(kind=kind, value=value)))  # type: ignore[call-arg]


class ImageSegment(_MediaSegmentMixin, _Closed):
    """An image attachment."""

    type: Literal["image"] = "image"
    data: MediaData


class AudioSegment(_MediaSegmentMixin, _Closed):
    """A voice/audio attachment."""

    type: Literal["audio"] = "audio"
    data: MediaData


class VideoSegment(_MediaSegmentMixin, _Closed):
    """A video attachment."""

    type: Literal["video"] = "video"
    data: MediaData


class FileSegment(_MediaSegmentMixin, _Closed):
    """A generic file attachment."""

    type: Literal["file"] = "file"
    data: MediaData


class ReplySegment(_Closed):
    """Quote (reply to) a platform message."""

    type: Literal["reply"] = "reply"
    data: ReplyData


class ForwardSegment(_Closed):
    """An existing platform forward reference."""

    type: Literal["forward"] = "forward"
    data: ForwardData


class FaceSegment(_Closed):
    """A platform face/emoji."""

    type: Literal["face"] = "face"
    data: FaceData


class DiceSegment(_Closed):
    """A platform dice roll."""

    type: Literal["dice"] = "dice"
    data: EmptyData

    @classmethod
    def of(cls) -> DiceSegment:
        """Build ``{"type": "dice", "data": {}}``."""
        return cls(data=EmptyData())


class RpsSegment(_Closed):
    """A platform rock-paper-scissors."""

    type: Literal["rps"] = "rps"
    data: EmptyData

    @classmethod
    def of(cls) -> RpsSegment:
        """Build ``{"type": "rps", "data": {}}``."""
        return cls(data=EmptyData())


class ShareSegment(_Closed):
    """A link share card."""

    type: Literal["share"] = "share"
    data: ShareData


MediaSegment: TypeAlias = ImageSegment | AudioSegment | VideoSegment | FileSegment
"""The four segment types that carry a :class:`Media`."""

Segment: TypeAlias = Annotated[
    TextSegment
    | MarkdownSegment
    | MentionSegment
    | ImageSegment
    | AudioSegment
    | VideoSegment
    | FileSegment
    | ReplySegment
    | ForwardSegment
    | FaceSegment
    | DiceSegment
    | RpsSegment
    | ShareSegment,
    Field(discriminator="type"),
]
"""One message segment: a discriminated union on ``type`` (13 types)."""

SEGMENT_TYPES: tuple[str, ...] = (
    "text", "markdown", "mention", "image", "audio", "video", "file",
    "reply", "forward", "face", "dice", "rps", "share",
)  # fmt: skip
"""The 13 segment type names, in the order of docs/decisions.md#reply-segments."""


class Reply(_Closed):
    """An IM agent's final answer: an ordered list of segments (docs/decisions.md#reply-segments).

    ``Reply.model_validate_json(raw)`` is the strict validation entry point (raises
    ``pydantic.ValidationError``); ``Reply.model_json_schema()`` is the schema sent to
    providers. ``Reply(segments=[])`` means "no reply": nothing is sent.
    """

    schema_name: ClassVar[str] = "segments"
    segments: list[Segment]
    """Segments in send order; text, mentions and media may interleave freely."""

    @classmethod
    def model_validate_json(
        cls,
        json_data: str | bytes | bytearray,
        *,
        strict: bool | None = None,
        extra: ExtraValues | None = None,
        context: Any | None = None,
        by_alias: bool | None = None,
        by_name: bool | None = None,
    ) -> Reply:
        """Strictly validate a raw model answer (docs/decisions.md#reply-strict-validation):
        pydantic's strict JSON validation plus
        :func:`runtime.reply.strict_json.json_contract_problem` (duplicate keys,
        ``NaN``/``Infinity``, overflowing numbers are rejected; pydantic alone would let the last
        duplicate win).

        Raises:
            pydantic.ValidationError: anything invalid; a pre-check failure is one ``json_invalid``
                error at the root.
        """
        raw = bytes(json_data) if isinstance(json_data, bytearray) else json_data
        problem = json_contract_problem(raw)
        if problem is not None:
            raise json_invalid_error(cls.__name__, raw, problem)
        return super().model_validate_json(
            raw, strict=strict, extra=extra, context=context, by_alias=by_alias, by_name=by_name
        )

    @classmethod
    def of_text(cls, text: str) -> Reply:
        """Return a reply made of one ``text`` segment (used for host messages)."""
        return cls(segments=[TextSegment.of(text)])

    def is_empty(self) -> bool:
        """True for ``{"segments": []}`` ("no reply this turn")."""
        return not self.segments

    def mentions(self) -> list[str]:
        """Return the ``mention`` targets in order."""
        return [s.data.target for s in self.segments if isinstance(s, MentionSegment)]

    def preview_text(self) -> str:
        """Render a human-readable preview (console, logs, streaming preview).

        Text and Markdown are shown verbatim, a mention as ``@<id>``, media as
        ``[image: <kind>]``, other segments as ``[<type>]``. Never shows JSON.
        """
        parts: list[str] = []
        for s in self.segments:
            if isinstance(s, TextSegment):
                parts.append(s.data.text)
            elif isinstance(s, MarkdownSegment):
                parts.append(s.data.content)
            elif isinstance(s, MentionSegment):
                parts.append(f"@{s.data.target}")
            elif isinstance(s, ImageSegment | AudioSegment | VideoSegment | FileSegment):
                parts.append(f"[{s.type}: {s.data.media.kind}]")
            elif isinstance(s, ShareSegment):
                parts.append(f"[share: {s.data.title} {s.data.url}]")
            elif isinstance(s, FaceSegment):
                parts.append(f"[face: {s.data.id}]")
            else:
                parts.append(f"[{s.type}]")
        return "".join(parts)

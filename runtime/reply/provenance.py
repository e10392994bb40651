"""Media provenance of IM replies: use references that exist in the context or came from tools;
never invent attachment addresses (docs/decisions.md#reply-media-provenance).

A reply's ``url``, ``path`` or ``file`` media value must be a **whole reference** found in the
session's context — the inbound messages (their media references are written into the user
message by :func:`inbound_media_lines`), pre-turn tool results, tool results of earlier turns or
of this turn (text *and* ``details``) — or start with one of the operator's allowlisted URL
prefixes (``ai.media_url_allowlist``, for hosts serving the bot's own assets). ``base64`` media
carry their bytes inline and are not references. The model's own earlier messages do not count:
an address it invented once does not become real by repetition.

What counts as a reference of the context (:func:`context_references`):

* every string leaf of a tool result's ``details``, of a custom record's data and of a text block
  that is a JSON document, taken whole;
* every ``http(s)`` URL in free text, taken up to the next whitespace, quote or bracket (trailing
  sentence punctuation dropped);
* every token of free text between whitespace, quotes and brackets (so a file id or a path
  written in prose counts), the value of a ``key=value`` token, and the value of an inbound
  media line ``[image url=…]``;
* a ``data:`` URL counts by the SHA-256 **digest of its decoded bytes** (as do image blocks of user
  and tool messages), so a reply's data URL matches when it carries the same bytes.

A prefix, a suffix or any other part of a reference is not a reference: with
``https://example.com/cat.png`` in the context, ``https://example.com/c``, ``cat.png`` and ``e``
are rejected.

A violation is a contract violation handled like an invalid reply by :mod:`runtime.reply.im_reply`
(one format-correction call, then the fixed failure message): :class:`ProvenanceIdentity` extends
:class:`~runtime.reply.mentions.MentionIdentity` so its ``check`` runs both rules, and the turn runner
builds it with :func:`reply_identity`. Each rejection counts
``sessionray_media_provenance_rejected_total{kind}``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from runtime import metrics
from runtime.llm.growth import ContextGrowth
from runtime.llm.types import (
    AgentMessage,
    CustomMessage,
    ImageContent,
    TextContent,
    ToolResultMessage,
    UserMessage,
)
from runtime.reply.mentions import MentionIdentity

__all__ = [
    "CHECKED_KINDS",
    "IdentityFold",
    "LazyProvenance",
    "MediaProvenance",
    "ProvenanceIdentity",
    "context_references",
    "data_url_digest",
    "inbound_media_lines",
    "reply_identity",
]

CHECKED_KINDS = ("url", "path", "file")
"""Media kinds that are references (``base64`` is inline data)."""


def inbound_media_lines(segments: Sequence[dict[str, Any]]) -> list[str]:
    """One line per inbound media segment, ``[image url=https://...]``, to append to the user
    message so the model sees (and may reuse) the references it was given."""
    out = []
    for seg in segments:
        media = (seg.get("data") or {}).get("media") if isinstance(seg, dict) else None
        if isinstance(media, dict) and media.get("kind") in CHECKED_KINDS and media.get("value"):
            out.append(f"[{seg.get('type')} {media['kind']}={media['value']}]")
    return out


_URL_RE = re.compile(r"https?://[^\s\"'<>\[\]{}`|\\^]+", re.IGNORECASE)
_DATA_URL_RE = re.compile(r"data:[^,\s\"'<>]*;base64,([A-Za-z0-9+/_-]+=*)", re.IGNORECASE)
_MEDIA_LINE_RE = re.compile(r"^\[\w+ (?:url|path|file)=(.+)\]$", re.MULTILINE)
_TOKEN_SPLIT = re.compile(r"[\s\"'<>\[\]{}`]+")
_KEY_VALUE = re.compile(r"[A-Za-z_]\w*=(.+)")
_TRAILING = ".,;:!?)"


def data_url_digest(value: str) -> str | None:
    """The hex SHA-256 of a ``data:…;base64,…`` URL's decoded bytes, or ``None`` when ``value`` is
    not a base64 data URL (or its payload does not decode)."""
    m = _DATA_URL_RE.fullmatch(value.strip())
    return _digest(m.group(1)) if m else None


def _digest(b64: str) -> str | None:
    try:
        raw = base64.b64decode(b64.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return None
    return hashlib.sha256(raw).hexdigest() if raw else None


def _leaves(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _leaves(v)


def _free_text_refs(text: str, refs: set[str], digests: set[str]) -> None:
    """Add the references written in ``text`` (see the module docstring) to ``refs``/``digests``."""
    for m in _DATA_URL_RE.finditer(text):
        if (d := _digest(m.group(1))) is not None:
            digests.add(d)
    refs.update(m.group(1).strip() for m in _MEDIA_LINE_RE.finditer(text))
    refs.update(m.group(0).rstrip(_TRAILING) for m in _URL_RE.finditer(text))
    for token in _TOKEN_SPLIT.split(text):
        for t in (token, token.rstrip(_TRAILING).lstrip("(")):
            if t:
                refs.add(t)
                if (kv := _KEY_VALUE.fullmatch(t)) is not None:
                    refs.add(kv.group(1))


def _text_refs(text: str, refs: set[str], digests: set[str]) -> None:
    """A text block: a JSON document's string leaves whole, then the text as free text."""
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            for leaf in _leaves(json.loads(stripped)):
                _leaf_refs(leaf, refs, digests)
        except ValueError:
            pass
    _free_text_refs(text, refs, digests)


def _leaf_refs(leaf: str, refs: set[str], digests: set[str]) -> None:
    """A structured string value: the whole value, its digest if it is a data URL, and the
    references written inside it."""
    if leaf.strip():
        refs.add(leaf.strip())
    if (d := data_url_digest(leaf)) is not None:
        digests.add(d)
    _free_text_refs(leaf, refs, digests)


def context_references(
    messages: Iterable[AgentMessage], extra: Iterable[str] = ()
) -> tuple[set[str], set[str]]:
    """``(references, digests)`` of the context: user messages, tool results (text, image blocks
    and ``details``) and custom records, plus ``extra`` free texts (e.g. the current inbound's
    media lines). Assistant messages are skipped: the model's own words are no source."""
    refs: set[str] = set()
    digests: set[str] = set()
    for message in messages:
        if isinstance(message, UserMessage | ToolResultMessage):
            blocks = (
                [TextContent(text=message.content)] if isinstance(message.content, str) else message.content
            )
            for b in blocks:
                if isinstance(b, TextContent):
                    _text_refs(b.text, refs, digests)
                elif isinstance(b, ImageContent) and (d := _digest(b.data)) is not None:
                    digests.add(d)
            if isinstance(message, ToolResultMessage) and message.details is not None:
                for leaf in _leaves(message.details):
                    _leaf_refs(leaf, refs, digests)
        elif isinstance(message, CustomMessage):
            for leaf in _leaves(message.data):
                _leaf_refs(leaf, refs, digests)
    for text in extra:
        _free_text_refs(text, refs, digests)
    return refs, digests


def _segment_media(reply: Any) -> Iterator[tuple[Any, Any]]:
    """``(segment, media)`` of each segment of ``reply`` that carries media, in order."""
    for seg in getattr(reply, "segments", []):
        media = getattr(getattr(seg, "data", None), "media", None)
        if media is not None:
            yield seg, media


@dataclass(frozen=True)
class MediaProvenance:
    """Where a reply's media references may come from.

    Attributes:
        references: Whole references of the context (:func:`context_references`).
        digests: Hex SHA-256 digests of the data URLs and image blocks of the context.
        allowlist: URL prefixes accepted without appearing in the context.
    """

    references: frozenset[str] = frozenset()
    digests: frozenset[str] = frozenset()
    allowlist: tuple[str, ...] = ()

    @classmethod
    def from_messages(
        cls, messages: Iterable[AgentMessage], allowlist: Iterable[str] = (), extra: Iterable[str] = ()
    ) -> MediaProvenance:
        """Collect the context's references (user, tool results incl. ``details``, custom records)
        plus those of the ``extra`` free texts (e.g. the current inbound's media lines)."""
        refs, digests = context_references(messages, extra)
        return cls(frozenset(refs), frozenset(digests), tuple(p for p in allowlist if p))

    def allowed(self, kind: str, value: str) -> bool:
        """Whether a media value of ``kind`` is known (always true for ``base64``): the exact
        value is a reference of the context, a ``url`` starts with an allowlisted prefix, or a
        ``data:`` URL's decoded bytes have a digest of the context."""
        if kind not in CHECKED_KINDS:
            return True
        if not value:
            return False
        if kind == "url" and any(value.startswith(p) for p in self.allowlist):
            return True
        if value in self.references:
            return True
        digest = data_url_digest(value) if kind == "url" else None
        return digest is not None and digest in self.digests

    def check(self, reply: Any) -> str | None:
        """Return an error naming the first invented media reference of ``reply``, or ``None``."""
        for seg, media in _segment_media(reply):
            if self.allowed(media.kind, media.value):
                continue
            metrics.MEDIA_PROVENANCE_REJECTED.inc(kind=media.kind)
            shown = media.value if len(media.value) <= 200 else media.value[:200] + "…"
            return (
                f"{seg.type} media {media.kind} {shown!r} does not come from this conversation or a "
                "tool result; attach only references you were given (never invent addresses), or drop it"
            )
        return None


class LazyProvenance:
    """The :class:`MediaProvenance` of ``messages``, read from them only when a reply carries a
    media reference to check (most replies carry none; reading the references of a long context
    costs ≈ 11 µs a message, and keeping them costs several times its text:
    docs/decisions.md#agent-incremental-convert)."""

    def __init__(self, messages: Sequence[AgentMessage], allowlist: Iterable[str] = ()) -> None:
        self._messages = tuple(messages)
        self._allowlist = tuple(allowlist)
        self._built: MediaProvenance | None = None

    @property
    def built(self) -> MediaProvenance:
        """The provenance itself (read on first use)."""
        if self._built is None:
            self._built = MediaProvenance.from_messages(self._messages, self._allowlist)
            self._messages = ()
        return self._built

    def allowed(self, kind: str, value: str) -> bool:
        """:meth:`MediaProvenance.allowed`."""
        return self.built.allowed(kind, value)

    def check(self, reply: Any) -> str | None:
        """:meth:`MediaProvenance.check`; a reply without a checked media reference passes unread."""
        if any(media.kind in CHECKED_KINDS for _, media in _segment_media(reply)):
            return self.built.check(reply)
        return None


@dataclass(frozen=True)
class ProvenanceIdentity(MentionIdentity):
    """A :class:`MentionIdentity` whose ``check`` also enforces media provenance."""

    provenance: MediaProvenance | LazyProvenance | None = None

    def check(self, reply: Any) -> str | None:
        """Mention identity first, then media provenance."""
        problem = super().check(reply)
        if problem is None and self.provenance is not None:
            problem = self.provenance.check(reply)
        return problem


def reply_identity(
    sender_id: str | None, messages: Sequence[AgentMessage], allowlist: Iterable[str] = ()
) -> ProvenanceIdentity:
    """The identity a turn's reply is validated against: mention targets (``MentionIdentity``
    rules) and media provenance over ``messages`` (the whole context seen by the turn)."""
    return IdentityFold().with_media(sender_id, messages, allowlist)


class IdentityFold:
    """A reply's identity over one session's growing context, kept across its turns
    (docs/decisions.md#agent-incremental-convert): the ids a mention may target are sets, so each
    call adds those of the messages added since the last call (``MentionIdentity.from_messages``
    read the whole context at every turn); a call whose messages do not extend the last call's
    reads all of them again. The media provenance is :class:`LazyProvenance`: read, from the
    whole list, only for a reply with a media reference."""

    def __init__(self) -> None:
        self._growth = ContextGrowth()
        self._known: frozenset[str] = frozenset()
        self._lookup: frozenset[str] = frozenset()

    def mentions(self, sender_id: str | None, messages: Sequence[AgentMessage]) -> MentionIdentity:
        """What ``MentionIdentity.from_messages(sender_id, messages)`` gives."""
        restart, new = self._growth.new(messages)
        if restart:
            self._known, self._lookup = frozenset(), frozenset()
        ids = MentionIdentity.from_messages(None, new)
        self._known, self._lookup = self._known | ids.known_ids, self._lookup | ids.lookup_ids
        return MentionIdentity(sender_id=sender_id, known_ids=self._known, lookup_ids=self._lookup)

    def with_media(
        self, sender_id: str | None, messages: Sequence[AgentMessage], allowlist: Iterable[str] = ()
    ) -> ProvenanceIdentity:
        """What :func:`reply_identity` gives: :meth:`mentions` and the media provenance."""
        ids = self.mentions(sender_id, messages)
        return ProvenanceIdentity(
            sender_id=sender_id,
            known_ids=ids.known_ids,
            lookup_ids=ids.lookup_ids,
            provenance=LazyProvenance(messages, allowlist),
        )

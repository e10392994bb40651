"""Media provenance of IM replies: use references that exist in the context or came from tools;
never invent attachment addresses (docs/decisions.md#reply-media-provenance).

A reply's ``url``, ``path`` or ``file`` media value must appear in the session's context — the
inbound messages (their media references are written into the user message by
:func:`inbound_media_lines`), pre-turn tool results, tool results of earlier turns or of this turn
(text *and* ``details``) — or start with one of the operator's allowlisted URL prefixes
(``ai.media_url_allowlist``, for hosts serving the bot's own assets). ``base64`` media carry their
bytes inline and are not references. The model's own earlier messages do not count: an address it
invented once does not become real by repetition.

A violation is a contract violation handled like an invalid reply by :mod:`runtime.reply.im_reply`
(one format-correction call, then the fixed failure message): :class:`ProvenanceIdentity` extends
:class:`~runtime.reply.mentions.MentionIdentity` so its ``check`` runs both rules, and the turn runner
builds it with :func:`reply_identity`. Each rejection counts
``sessionray_media_provenance_rejected_total{kind}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime import metrics
from runtime.llm.types import AgentMessage, CustomMessage, TextContent, ToolResultMessage, UserMessage
from runtime.reply.mentions import MentionIdentity

__all__ = ["CHECKED_KINDS", "MediaProvenance", "ProvenanceIdentity", "inbound_media_lines", "reply_identity"]

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


def _texts(message: AgentMessage) -> Iterable[str]:
    if isinstance(message, UserMessage):
        if isinstance(message.content, str):
            yield message.content
        else:
            yield from (b.text for b in message.content if isinstance(b, TextContent))
    elif isinstance(message, ToolResultMessage):
        yield from (b.text for b in message.content if isinstance(b, TextContent))
        if message.details is not None:
            yield json.dumps(message.details, ensure_ascii=False, default=str)
    elif isinstance(message, CustomMessage):
        yield json.dumps(message.data, ensure_ascii=False, default=str)


@dataclass(frozen=True)
class MediaProvenance:
    """Where a reply's media references may come from.

    Attributes:
        corpus: Every user/tool/custom text of the context, joined (references are found as
            substrings, so a URL inside JSON or prose counts).
        allowlist: URL prefixes accepted without appearing in the context.
    """

    corpus: str = ""
    allowlist: tuple[str, ...] = ()

    @classmethod
    def from_messages(
        cls, messages: Iterable[AgentMessage], allowlist: Iterable[str] = (), extra: Iterable[str] = ()
    ) -> MediaProvenance:
        """Collect the context's texts (user, tool results incl. ``details``, custom records) plus
        ``extra`` strings (e.g. the current inbound's media lines)."""
        parts = [t for m in messages for t in _texts(m)]
        parts += list(extra)
        return cls("\n".join(parts), tuple(p for p in allowlist if p))

    def allowed(self, kind: str, value: str) -> bool:
        """Whether a media value of ``kind`` is known (always true for ``base64``)."""
        if kind not in CHECKED_KINDS:
            return True
        if kind == "url" and any(value.startswith(p) for p in self.allowlist):
            return True
        return bool(value) and value in self.corpus

    def check(self, reply: Any) -> str | None:
        """Return an error naming the first invented media reference of ``reply``, or ``None``."""
        for seg in getattr(reply, "segments", []):
            media = getattr(getattr(seg, "data", None), "media", None)
            if media is None or self.allowed(media.kind, media.value):
                continue
            metrics.MEDIA_PROVENANCE_REJECTED.inc(kind=media.kind)
            return (
                f"{seg.type} media {media.kind} {media.value!r} does not come from this conversation or a "
                "tool result; attach only references you were given (never invent addresses), or drop it"
            )
        return None


@dataclass(frozen=True)
class ProvenanceIdentity(MentionIdentity):
    """A :class:`MentionIdentity` whose ``check`` also enforces media provenance."""

    provenance: MediaProvenance | None = None

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
    base = MentionIdentity.from_messages(sender_id, messages)
    return ProvenanceIdentity(
        sender_id=base.sender_id,
        known_ids=base.known_ids,
        lookup_ids=base.lookup_ids,
        provenance=MediaProvenance.from_messages(messages, allowlist),
    )

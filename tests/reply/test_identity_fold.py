"""The reply identity kept across a session's turns (docs/decisions.md#agent-incremental-convert):
at every call what a reading of the whole context gives, from the new messages only."""

from __future__ import annotations

import base64
from typing import Any

from runtime.llm.types import (
    AgentMessage,
    AssistantMessage,
    CustomMessage,
    ImageContent,
    TextContent,
    ToolResultMessage,
    UserMessage,
)
from runtime.reply.mentions import MentionIdentity
from runtime.reply.provenance import IdentityFold, LazyProvenance, ProvenanceIdentity, reply_identity

PNG = base64.b64encode(b"\x89PNG fake bytes").decode()

GROWTH: list[AgentMessage] = [
    UserMessage(content="hi\n[image url=https://qq.example/in/1.jpg]", sender={"id": "u1"}),
    AssistantMessage(content=[TextContent(text="https://invented.example/x.png")]),
    ToolResultMessage(
        tool_call_id="c1",
        tool_name="members",
        content=[TextContent(text="found")],
        details={"member_ids": ["u7", 8], "url": "https://cdn.example/a.png"},
    ),
    CustomMessage(custom_type="im_inbound", data={"message_id": "m2", "file": "file-id-9"}),
    UserMessage(content=[ImageContent(data=PNG, mime_type="image/png")], sender={"id": "u2"}),
    UserMessage(content="see f=report.pdf", sender={"id": "u3"}),
]


def seen(identity: Any) -> tuple[Any, ...]:
    base = (identity.sender_id, identity.known_ids, identity.lookup_ids)
    if isinstance(identity, ProvenanceIdentity):
        p = identity.provenance
        p = p.built if isinstance(p, LazyProvenance) else p
        assert p is not None
        return (*base, p.references, p.digests, p.allowlist)
    return base


def test_each_call_gives_what_the_whole_context_gives_and_reads_only_the_new_messages() -> None:
    mentions, media = IdentityFold(), IdentityFold()
    for n in range(1, len(GROWTH) + 1):
        context = GROWTH[:n]
        assert seen(mentions.mentions("u1", context)) == seen(MentionIdentity.from_messages("u1", context))
        got = media.with_media("u9", context, ("https://assets.example/",))
        assert isinstance(got, ProvenanceIdentity)
        assert seen(got) == seen(reply_identity("u9", context, ("https://assets.example/",)))
    assert mentions._growth.taken == media._growth.taken == len(GROWTH)
    assert got.provenance is not None and got.provenance.allowed("url", "https://cdn.example/a.png")
    assert not got.provenance.allowed("url", "https://invented.example/x.png")  # the model's own words
    assert got.known_ids == {"u1", "u2", "u3"} and got.lookup_ids == {"u7", "8"}


def test_a_list_that_is_not_an_extension_reads_all_again() -> None:
    fold = IdentityFold()
    fold.mentions("u1", GROWTH)
    shorter = [GROWTH[0], GROWTH[5]]  # e.g. after a compaction: u2's message and the tool are gone
    assert seen(fold.mentions("u1", shorter)) == seen(MentionIdentity.from_messages("u1", shorter))
    assert fold.mentions("u1", shorter).lookup_ids == frozenset()
    with_media = fold.with_media("u1", shorter)  # with media: the references of all of them
    assert seen(with_media) == seen(reply_identity("u1", shorter))
    assert fold._growth.taken == len(GROWTH) + 2  # the new start read the two messages


def test_the_media_references_are_read_only_for_a_reply_with_media() -> None:
    from runtime.reply.segments import Reply

    identity = IdentityFold().with_media("u1", GROWTH)
    assert isinstance(identity, ProvenanceIdentity) and isinstance(identity.provenance, LazyProvenance)
    assert identity.check(Reply.of_text("no media here")) is None
    assert identity.provenance._built is None  # not read

    def image(url: str) -> Reply:
        segment = {"type": "image", "data": {"media": {"kind": "url", "value": url}}}
        return Reply.model_validate({"segments": [segment]})

    problem = identity.check(image("https://x.example/y.png"))
    assert problem is not None and "does not come from this conversation" in problem
    assert identity.check(image("https://cdn.example/a.png")) is None
    assert identity.provenance._built is not None

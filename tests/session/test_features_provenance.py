"""Media provenance: an invented image URL is rejected (correction call, then the fixed failure
message) while one from a tool result, the inbound or the allowlist passes
(docs/decisions.md#reply-media-provenance)."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from typing import Any

from providers.faux import faux_assistant_message, faux_text, register_faux_provider
from runtime.llm.types import (
    AssistantMessage,
    CustomMessage,
    ImageContent,
    TextContent,
    ToolResultMessage,
    UserMessage,
)
from runtime.reply.capability import CapabilityCache
from runtime.reply.im_reply import ImReplyConfig, ImReplyContract
from runtime.reply.provenance import MediaProvenance, data_url_digest, inbound_media_lines, reply_identity
from runtime.reply.segments import Reply

FAIL = "Sorry, that did not work."
TOOL_URL = "https://cdn.example/generated/cat-42.png"


def image_reply(value: str, kind: str = "url") -> str:
    return json.dumps(
        {
            "segments": [
                {"type": "text", "data": {"text": "here"}},
                {"type": "image", "data": {"media": {"kind": kind, "value": value}}},
            ]
        }
    )


def context() -> list[Any]:
    return [
        UserMessage(content="draw a cat\n[image url=https://qq.example/in/1.jpg]", sender={"id": "u1"}),
        AssistantMessage(content=[TextContent(text="https://invented.example/earlier.png")]),
        ToolResultMessage(
            tool_call_id="c1", tool_name="draw", content=[TextContent(text="done")], details={"url": TOOL_URL}
        ),
    ]


async def finalize(text: str, correction: str | None, allowlist: tuple[str, ...] = ()) -> Any:
    faux = register_faux_provider(
        [faux_assistant_message([faux_text(correction)])] if correction is not None else [],
        provider="prov-faux",
    )
    contract = ImReplyContract(
        faux.get_model(), config=ImReplyConfig(failure_text=FAIL), cache=CapabilityCache()
    )
    identity = reply_identity("u1", context(), allowlist)
    outcome = await contract.finalize(faux_assistant_message([faux_text(text)]), identity)
    return outcome, faux


async def test_url_from_a_tool_result_passes(metric: Callable[..., float]) -> None:
    outcome, faux = await finalize(image_reply(TOOL_URL), None)
    assert (outcome.outcome, outcome.reply) == ("first_try", Reply.model_validate_json(image_reply(TOOL_URL)))
    assert faux.call_count == 0
    assert metric("sessionray_media_provenance_rejected_total", kind="url") == 0.0


async def test_invented_url_is_corrected_then_fails(metric: Callable[..., float]) -> None:
    invented = "https://invented.example/earlier.png"  # only the model itself said it before
    outcome, faux = await finalize(image_reply(invented), image_reply(invented))
    assert (outcome.outcome, outcome.reply) == ("failed", Reply.of_text(FAIL))
    assert outcome.reason == (
        f"image media url {invented!r} does not come from this conversation or a tool result; attach only "
        "references you were given (never invent addresses), or drop it; correction still invalid: "
        f"image media url {invented!r} does not come from this conversation or a tool result; attach only "
        "references you were given (never invent addresses), or drop it"
    )
    # exactly one format-correction call (docs/decisions.md#reply-one-correction)
    assert faux.call_count == 1
    assert metric("sessionray_media_provenance_rejected_total", kind="url") == 2.0


async def test_invented_url_corrected_into_a_known_one() -> None:
    outcome, _ = await finalize(
        image_reply("https://nope.example/x.png"), image_reply("https://qq.example/in/1.jpg")
    )
    assert (outcome.outcome, outcome.reply) == (
        "corrected",
        Reply.model_validate_json(image_reply("https://qq.example/in/1.jpg")),
    )


async def test_allowlisted_prefix_passes_and_other_kinds() -> None:
    outcome, _ = await finalize(
        image_reply("https://assets.bot.example/logo.png"), None, ("https://assets.bot.example/",)
    )
    assert outcome.outcome == "first_try"
    prov = MediaProvenance.from_messages(context(), extra=["[file file=abc-123]"])
    assert [
        prov.allowed("base64", "iVBORw0KGgo="),
        prov.allowed("file", "abc-123"),
        prov.allowed("file", "abc-999"),
        prov.allowed("path", "generated/cat-42.png"),  # a part of a URL is no path of the context
        prov.allowed("path", "/etc/passwd"),
        prov.allowed("url", ""),
    ] == [True, True, False, False, False, False]


def test_inbound_media_lines() -> None:
    segments = [
        {"type": "text", "data": {"text": "look"}},
        {"type": "image", "data": {"media": {"kind": "url", "value": "https://qq.example/in/1.jpg"}}},
        {"type": "file", "data": {"media": {"kind": "file", "value": "tg-file-7"}}},
        {"type": "image", "data": {"media": {"kind": "base64", "value": "AAAA"}}},
    ]
    assert inbound_media_lines(segments) == [
        "[image url=https://qq.example/in/1.jpg]",
        "[file file=tg-file-7]",
    ]


def test_only_whole_references_pass() -> None:
    known = "https://example.com/cat.png"
    prov = MediaProvenance.from_messages([UserMessage(content=f"look at {known}, it is cute")])
    assert prov.allowed("url", known)
    rejected = [
        ("url", "https://example.com/c"),  # a prefix of the known URL
        ("url", "https://example.com/"),
        ("url", "example.com/cat.png"),
        ("url", known + "x"),
        ("path", "cat.png"),
        ("file", "1"),
        ("file", "e"),
        ("path", "https://example.com/cat.pn"),
    ]
    assert [(k, v) for k, v in rejected if prov.allowed(k, v)] == []


def test_references_in_prose_json_and_details() -> None:
    payload = base64.b64encode(b"\x89PNG fake bytes").decode()
    messages = [
        ToolResultMessage(
            tool_call_id="c1",
            tool_name="lookup",
            content=[TextContent(text='{"items": [{"file_id": "AgADBAAD-xyz", "path": "out/my cat.png"}]}')],
            details={"nested": {"link": "https://cdn.example/a.png?size=1&v=2"}},
        ),
        ToolResultMessage(
            tool_call_id="c2",
            tool_name="shot",
            content=[TextContent(text="saved to renders/7.jpg. Also see (https://x.example/y.gif).")],
        ),
        UserMessage(content=[TextContent(text="mine"), ImageContent(data=payload, mime_type="image/png")]),
        CustomMessage(custom_type="pre_tool_results", data={"results": {"p": "id=tgfile-55"}}),
    ]
    prov = MediaProvenance.from_messages(messages, extra=["[image path=in box/1.png]"])
    assert [
        prov.allowed("file", "AgADBAAD-xyz"),
        prov.allowed("path", "out/my cat.png"),  # a JSON string leaf, taken whole
        prov.allowed("url", "https://cdn.example/a.png?size=1&v=2"),
        prov.allowed("path", "renders/7.jpg"),  # prose, sentence punctuation dropped
        prov.allowed("url", "https://x.example/y.gif"),
        prov.allowed("file", "tgfile-55"),  # the value of a key=value token
        prov.allowed("path", "in box/1.png"),  # an inbound media line
        prov.allowed("url", f"data:image/png;base64,{payload}"),  # same bytes as the image block
        prov.allowed("url", "data:image/png;base64," + base64.b64encode(b"other").decode()),
        prov.allowed("file", "1"),  # "size=1" inside a URL is no key=value token
        prov.allowed("path", "out/my cat"),  # part of a leaf with a space
    ] == [True, True, True, True, True, True, True, True, False, False, False]
    assert (
        data_url_digest(f"data:image/png;base64,{payload}")
        == hashlib.sha256(b"\x89PNG fake bytes").hexdigest()
    )
    assert data_url_digest("https://example.com/a.png") is None


async def test_a_prefix_of_a_known_url_is_rejected_by_the_contract(metric: Callable[..., float]) -> None:
    outcome, faux = await finalize(image_reply("https://cdn.example/generated/cat"), None)
    assert (outcome.outcome, outcome.reply) == ("failed", Reply.of_text(FAIL))
    assert faux.call_count == 1  # the one correction call (no scripted answer: it fails)
    assert metric("sessionray_media_provenance_rejected_total", kind="url") == 1.0

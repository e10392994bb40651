"""Media provenance: an invented image URL is rejected (correction call, then the fixed failure
message) while one from a tool result, the inbound or the allowlist passes
(docs/decisions.md#reply-media-provenance)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from providers.faux import faux_assistant_message, faux_text, register_faux_provider
from runtime.llm.types import AssistantMessage, TextContent, ToolResultMessage, UserMessage
from runtime.reply.capability import CapabilityCache
from runtime.reply.im_reply import ImReplyConfig, ImReplyContract
from runtime.reply.provenance import MediaProvenance, inbound_media_lines, reply_identity
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
        prov.allowed("path", "generated/cat-42.png"),
        prov.allowed("path", "/etc/passwd"),
        prov.allowed("url", ""),
    ] == [True, True, False, True, False, False]


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

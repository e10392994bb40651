"""Bad input against the reply contract: JSON edge cases, closed objects at every level, the
strict-provider schema rules, and blank mention ids
(docs/decisions.md#reply-strict-validation)."""

# ruff: noqa: E501  (parametrized attack tables read best one case per line)

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from providers.faux import faux_assistant_message, faux_text
from runtime.reply.im_reply import ImReplyConfig, ImReplyContract
from runtime.reply.mentions import MentionIdentity
from runtime.reply.segments import Reply, TextSegment
from runtime.reply.strict_json import json_contract_problem
from runtime.reply.structured import run_structured, validate_raw

T = '{"type":"text","data":{"text":"a"}}'


def seg(body: str) -> str:
    return '{"segments":[' + body + "]}"


def first_error(raw: str) -> tuple[str, str]:
    """(location, message) of the first validation error of ``Reply.model_validate_json(raw)``."""
    with pytest.raises(ValidationError) as info:
        Reply.model_validate_json(raw)
    e = info.value.errors()[0]
    return ".".join(str(p) for p in e["loc"]), e["msg"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"segments":[],"segments":[' + T + "]}", ("", "Invalid JSON: duplicate key 'segments'")),
        (seg('{"type":"text","type":"mention","data":{"target":"1"}}'), ("", "Invalid JSON: duplicate key 'type'")),
        (seg('{"type":"text","data":{"text":"a","text":"b"}}'), ("", "Invalid JSON: duplicate key 'text'")),
        (seg('{"type":"face","data":{"id":NaN}}'), ("", "Invalid JSON: NaN is not valid JSON")),
        (seg('{"type":"face","data":{"id":-Infinity}}'), ("", "Invalid JSON: -Infinity is not valid JSON")),
        (seg('{"type":"face","data":{"id":1e400}}'), ("", "Invalid JSON: number 1e400 is out of range")),
        ("\ufeff" + seg(T), ("", "Invalid JSON: expected value at line 1 column 1")),
        ('{"segments":[' + T + ",]}", ("", "Invalid JSON: trailing comma at line 1 column 50")),
        ('{"segments":' + "[" * 3000 + "]" * 3000 + "}", ("", "Invalid JSON: recursion limit exceeded at line 1 column 213")),
        (seg('{"type":"text","data":{"text":"a\\ud800"}}'), ("", "Invalid JSON: unexpected end of hex escape at line 1 column 52")),
        (seg('{"type":"text","data":{"text":true}}'), ("segments.0.text.data.text", "Input should be a valid string")),
        (seg('{"type":"mention","data":{"target":1234567890123456789}}'), ("segments.0.mention.data.target", "Input should be a valid string")),
        (seg('{"type":"reply","data":{"message_id":42}}'), ("segments.0.reply.data.message_id", "Input should be a valid string")),
        # extra keys at every nesting level
        ('{"segments":[],"note":"x"}', ("note", "Extra inputs are not permitted")),
        (seg('{"type":"text","data":{"text":"a"},"meta":1}'), ("segments.0.text.meta", "Extra inputs are not permitted")),
        (seg('{"type":"share","data":{"url":"u","title":"t","image":"i"}}'), ("segments.0.share.data.image", "Extra inputs are not permitted")),
        (seg('{"type":"image","data":{"media":{"kind":"url","value":"u","mime":"image/png"}}}'), ("segments.0.image.data.media.mime", "Extra inputs are not permitted")),
        (seg('{"type":"dice","data":{"sides":6}}'), ("segments.0.dice.data.sides", "Extra inputs are not permitted")),
        # face.id: string or integer only
        (seg('{"type":"face","data":{"id":1.0}}'), ("segments.0.face.data.id.str", "Input should be a valid string")),
        (seg('{"type":"face","data":{"id":true}}'), ("segments.0.face.data.id.str", "Input should be a valid string")),
        (seg('{"type":"face","data":{"id":null}}'), ("segments.0.face.data.id.str", "Input should be a valid string")),
        # media kind outside the enum (case matters)
        (seg('{"type":"image","data":{"media":{"kind":"data","value":"u"}}}'), ("segments.0.image.data.media.kind", "Input should be 'url', 'path', 'base64' or 'file'")),
        (seg('{"type":"image","data":{"media":{"kind":"URL","value":"u"}}}'), ("segments.0.image.data.media.kind", "Input should be 'url', 'path', 'base64' or 'file'")),
        ('{"segments":[]} {"segments":[]}', ("", "Invalid JSON: trailing characters at line 1 column 17")),
        ("[]", ("", "Input should be an object")),
    ],
)  # fmt: skip
def test_reply_rejects_bad_json(raw: str, expected: tuple[str, str]) -> None:
    assert first_error(raw) == expected


def test_reply_accepts_unicode_escapes_and_bytes() -> None:
    raw = seg('{"type":"text","data":{"text":"\\u4f60\\u597d \\ud83d\\ude00"}}')
    assert Reply.model_validate_json(raw) == Reply(segments=[TextSegment.of("你好 😀")])
    assert Reply.model_validate_json(bytearray(raw.encode())) == Reply(segments=[TextSegment.of("你好 😀")])


class Score(BaseModel):
    score: float


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ('{"score": NaN}', "(root): Invalid JSON: NaN is not valid JSON"),
        ('{"score": Infinity}', "(root): Invalid JSON: Infinity is not valid JSON"),
        ('{"score": 1e999}', "(root): Invalid JSON: number 1e999 is out of range"),
        ('{"score": 1, "score": 2}', "(root): Invalid JSON: duplicate key 'score'"),
        ('{"score": "0.5"}', "score: Input should be a valid number"),
    ],
)
def test_generic_validation_rejects_non_standard_json(raw: str, error: str) -> None:
    """pydantic alone accepts NaN/Infinity/1e999 for a float and lets a duplicate key win."""
    assert validate_raw(Score, raw) == (None, error)
    assert validate_raw(Score, '{"score": 0.5}') == (Score(score=0.5), None)
    assert json_contract_problem("not json at all") is None  # syntax is pydantic's to report


async def test_generic_nan_goes_through_the_retry(faux, cache, deltas) -> None:
    faux.set_responses(
        [
            faux_assistant_message([faux_text('{"score": NaN}')]),
            faux_assistant_message([faux_text('{"score": 0.5}')]),
        ]
    )
    from runtime import Context, UserMessage

    out = await run_structured(
        faux.get_model(), Context(messages=[UserMessage(content="rate")]), Score, mode="prompt", cache=cache
    )
    assert (out.value, out.outcome, out.reason) == (
        Score(score=0.5),
        "corrected",
        "(root): Invalid JSON: NaN is not valid JSON",
    )
    assert deltas.structured() == {("prompt", "corrected"): 1}


async def test_duplicate_key_reply_goes_through_the_correction_call(faux, cache, deltas) -> None:
    """The ambiguous answer is never sent as "whatever key won"; it is corrected first."""
    good = seg('{"type":"text","data":{"text":"ok"}}')
    faux.set_responses([faux_assistant_message([faux_text(good)])])
    c = ImReplyContract(faux.get_model(), config=ImReplyConfig(failure_text="F"), cache=cache)
    bad = seg('{"type":"text","data":{"text":"safe"},"type":"mention","data":{"target":"1"}}')
    out = await c.finalize(faux_assistant_message([faux_text(bad)]), MentionIdentity(sender_id="1"))
    assert (out.reply, out.outcome, out.reason, faux.call_count) == (
        Reply(segments=[TextSegment.of("ok")]),
        "corrected",
        "(root): Invalid JSON: duplicate key 'type'",
        1,
    )
    assert deltas.structured() == {("native", "corrected"): 1}


# --------------------------------------------------------------------------- strict-provider rules

_ALLOWED_KEYWORDS = {
    "type", "properties", "required", "additionalProperties", "items", "anyOf", "enum", "const",
    "$ref", "$defs", "title", "description", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems",
}  # fmt: skip


def strict_violations(schema: dict[str, Any]) -> list[str]:
    """OpenAI strict ``json_schema`` rules (the strictest of the three providers): the root is an
    object; every object is closed and requires all its properties; only supported keywords (no
    oneOf/allOf/not/discriminator/default/patternProperties); ``$ref`` resolves into ``$defs``;
    nesting ≤ 5 object levels; ≤ 100 properties in all."""
    problems: list[str] = []
    defs = schema.get("$defs", {})
    props_total = 0

    def walk(node: Any, path: str, depth: int) -> None:
        nonlocal props_total
        if not isinstance(node, dict):
            problems.append(f"{path}: not a schema object")
            return
        for key in node:
            if key not in _ALLOWED_KEYWORDS:
                problems.append(f"{path}: unsupported keyword {key!r}")
        if "$ref" in node:
            name = str(node["$ref"]).removeprefix("#/$defs/")
            if name not in defs:
                problems.append(f"{path}: dangling $ref {node['$ref']}")
            else:
                walk(defs[name], f"{path}->{name}", depth)
            return
        if node.get("type") == "object":
            if depth > 5:
                problems.append(f"{path}: nested deeper than 5 object levels")
            props = node.get("properties")
            if not isinstance(props, dict):
                problems.append(f"{path}: object without properties")
                props = {}
            if node.get("additionalProperties") is not False:
                problems.append(f"{path}: additionalProperties is not false")
            if sorted(node.get("required", [])) != sorted(props):
                problems.append(f"{path}: required != all properties")
            props_total += len(props)
            for k, v in props.items():
                walk(v, f"{path}.{k}", depth + 1)
        if node.get("type") == "array":
            walk(node.get("items"), f"{path}[]", depth)
        for i, alt in enumerate(node.get("anyOf", [])):
            walk(alt, f"{path}|{i}", depth)

    if schema.get("type") != "object":
        problems.append("root: not an object")
    walk(schema, "root", 1)
    if props_total > 100:
        problems.append(f"{props_total} properties in all (> 100)")
    return problems


def test_reply_schema_passes_strict_provider_rules() -> None:
    assert strict_violations(Reply.model_json_schema()) == []


def test_strict_rule_checker_catches_open_objects() -> None:
    """The checker is not vacuous: a free-form dict (pydantic's ``dict[str, str]``) is refused."""

    class Loose(BaseModel):
        slots: dict[str, str]

    from runtime.reply.json_schema import strict_json_schema

    assert strict_violations(strict_json_schema(Loose)) == [
        "root: additionalProperties is not false",
        "root.slots: object without properties",
        "root.slots: additionalProperties is not false",
    ]


# --------------------------------------------------------------------------- mention identity


def test_blank_ids_never_allow_an_empty_mention() -> None:
    from runtime.llm.types import ToolResultMessage, UserMessage

    ident = MentionIdentity.from_messages(
        "",
        [
            UserMessage(content="hi", sender={"id": ""}),
            ToolResultMessage(
                tool_call_id="c", tool_name="find", details={"member_ids": ["", " ", 42, True, None]}
            ),
        ],
    )
    assert ident.allowed() == {"42"}
    empty = Reply.model_validate_json(seg('{"type":"mention","data":{"target":""}}'))
    assert ident.check(empty) == (
        "mention target '' is not a known user id (allowed: the sender, ids in this conversation, "
        "member-lookup results); never guess an id from a nickname"
    )

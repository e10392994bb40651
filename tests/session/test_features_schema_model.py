# ruff: noqa: E501  (one-line-per-case tables read better unwrapped)
"""The JSON Schema → pydantic converter: every supported feature and each unsupported one
(docs/decisions.md#tool-md-hard-fail)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from runtime.agent.schema_model import SchemaFeatureError, dump_params, schema_to_model


def obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required or list(props), **extra}


def accepts(schema: dict[str, Any], value: Any) -> Any:
    return dump_params(schema_to_model(schema).model_validate(value))


def rejects(schema: dict[str, Any], value: Any) -> None:
    with pytest.raises(ValidationError):
        schema_to_model(schema).model_validate(value)


# ------------------------------------------------------------------ supported, feature by feature

SUPPORTED: list[tuple[str, dict[str, Any], list[Any], list[Any]]] = [
    # (feature, property schema, accepted values, rejected values)
    ("type string", {"type": "string"}, ["x"], [1, None]),
    ("type integer", {"type": "integer"}, [3, "4"], ["x", 1.5]),
    ("type number", {"type": "number"}, [1.5, 2], ["x"]),
    ("type boolean", {"type": "boolean"}, [True, False], ["maybe", None]),
    ("type null", {"type": "null"}, [None], [0, "x"]),
    ("type list (nullable)", {"type": ["string", "null"]}, ["x", None], [[1]]),
    ("enum", {"enum": ["a", "b", 3]}, ["a", 3], ["c", 4]),
    ("const", {"const": "fixed"}, ["fixed"], ["other"]),
    ("minimum/maximum", {"type": "integer", "minimum": 1, "maximum": 3}, [1, 3], [0, 4]),
    ("exclusiveMinimum/Maximum", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, [0.5], [0, 1]),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, [10], [7]),
    ("minLength/maxLength", {"type": "string", "minLength": 2, "maxLength": 3}, ["ab", "abc"], ["a", "abcd"]),
    ("pattern", {"type": "string", "pattern": "^[a-z]+$"}, ["abc"], ["ABC", "a1"]),
    ("format date-time", {"type": "string", "format": "date-time"}, ["2026-11-30T12:00:00Z"], ["2026-11-30", "noon"]),
    ("format date", {"type": "string", "format": "date"}, ["2026-11-30"], ["30/11/2026"]),
    ("format time", {"type": "string", "format": "time"}, ["12:30:00"], ["half past"]),
    ("format email", {"type": "string", "format": "email"}, ["a@b.co"], ["a@b", "nope"]),
    ("format uri", {"type": "string", "format": "uri"}, ["https://x.org/a"], ["not a uri"]),
    ("format uuid", {"type": "string", "format": "uuid"}, ["12345678-1234-5678-1234-567812345678"], ["123"]),
    ("format ipv4", {"type": "string", "format": "ipv4"}, ["10.0.0.1"], ["10.0.0.300"]),
    ("format ipv6", {"type": "string", "format": "ipv6"}, ["::1"], ["10.0.0.1"]),
    ("array items", {"type": "array", "items": {"type": "integer"}}, [[1, 2], []], [["x"], "1"]),
    ("minItems/maxItems", {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}, [["a"]], [[], ["a", "b", "c"]]),
    ("array without items", {"type": "array"}, [[1, "a", None]], ["x"]),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]}, [5, "ab"], ["abc", None]),
    ("oneOf", {"oneOf": [{"type": "integer", "maximum": 10}, {"type": "integer", "minimum": 5}]}, [1, 20], [7]),
    ("nested object", obj({"x": {"type": "integer"}}), [{"x": 1}], [{"x": "a"}, {}]),
    ("map (additionalProperties schema)", {"type": "object", "additionalProperties": {"type": "integer"}}, [{"a": 1}], [{"a": "x"}]),
    ("free object", {"type": "object"}, [{"anything": [1]}], ["x"]),
    ("annotations", {"type": "string", "title": "T", "description": "d", "examples": ["e"], "deprecated": False,
                     "$comment": "c", "readOnly": False, "writeOnly": False}, ["x"], [1]),
]  # fmt: skip


@pytest.mark.parametrize(("feature", "prop", "good", "bad"), SUPPORTED, ids=[s[0] for s in SUPPORTED])
def test_supported_feature(feature: str, prop: dict[str, Any], good: list[Any], bad: list[Any]) -> None:
    schema = obj({"v": prop})
    for value in good:
        out = accepts(schema, {"v": value})
        expected = int(value) if prop.get("type") == "integer" and isinstance(value, str) else value
        assert out == {"v": expected}, feature
    for value in bad:
        rejects(schema, {"v": value})


def test_required_default_and_optional() -> None:
    schema = obj(
        {"a": {"type": "string"}, "b": {"type": "integer", "default": 7}, "c": {"type": "string"}},
        required=["a"],
    )
    assert accepts(schema, {"a": "x"}) == {"a": "x", "b": 7}  # c omitted (not sent, no default)
    assert accepts(schema, {"a": "x", "c": "y", "b": 1}) == {"a": "x", "b": 1, "c": "y"}
    rejects(schema, {"b": 1})  # a is required
    rejects(schema, {"a": "x", "c": None})  # optional is not nullable unless its type says so


def test_additional_properties_false_and_true() -> None:
    closed = obj({"a": {"type": "string"}}, additionalProperties=False)
    rejects(closed, {"a": "x", "extra": 1})
    opened = obj({"a": {"type": "string"}}, additionalProperties=True)
    assert accepts(opened, {"a": "x", "extra": 1}) == {"a": "x", "extra": 1}
    assert accepts(obj({"a": {"type": "string"}}), {"a": "x", "z": [1]}) == {
        "a": "x",
        "z": [1],
    }  # absent = true


def test_local_refs_and_defs() -> None:
    schema = {
        "type": "object",
        "$defs": {
            "Point": obj({"x": {"type": "number"}, "y": {"type": "number"}}, additionalProperties=False)
        },
        "definitions": {"Tag": {"type": "string", "enum": ["a", "b"]}},
        "properties": {
            "from": {"$ref": "#/$defs/Point"},
            "to": {"$ref": "#/$defs/Point", "description": "end"},
            "tags": {"type": "array", "items": {"$ref": "#/definitions/Tag"}},
        },
        "required": ["from", "to"],
    }
    value = {"from": {"x": 1, "y": 2}, "to": {"x": 3.5, "y": 0}, "tags": ["a"]}
    assert accepts(schema, value) == {"from": {"x": 1.0, "y": 2.0}, "to": {"x": 3.5, "y": 0.0}, "tags": ["a"]}
    rejects(schema, {"from": {"x": 1}, "to": {"x": 1, "y": 1}})
    rejects(schema, {"from": {"x": 1, "y": 1}, "to": {"x": 1, "y": 1}, "tags": ["c"]})


def test_property_names_that_are_not_identifiers() -> None:
    schema = obj(
        {"first-name": {"type": "string"}, "model_config": {"type": "integer"}, "class": {"type": "string"}}
    )
    assert accepts(schema, {"first-name": "a", "model_config": 1, "class": "c"}) == {
        "first-name": "a",
        "model_config": 1,
        "class": "c",
    }


def test_the_model_sees_the_authors_schema() -> None:
    schema = obj({"city": {"type": "string", "minLength": 1}}, additionalProperties=False)
    model = schema_to_model(schema)
    assert model.model_json_schema() == schema
    schema["properties"]["city"]["minLength"] = 5  # later edits of the caller's dict do not leak in
    assert model.model_json_schema()["properties"]["city"] == {"type": "string", "minLength": 1}


def test_parameters_must_be_an_object() -> None:
    with pytest.raises(SchemaFeatureError) as err:
        schema_to_model({"type": "string"}, source="t.tool.md", pointer="/parameters")
    assert str(err.value) == (
        "t.tool.md: /parameters: unsupported JSON Schema feature 'non-object parameters': "
        "tool arguments must be an object"
    )


# ------------------------------------------------------------------ unsupported: hard fail, named

UNSUPPORTED: list[tuple[dict[str, Any], str, str]] = [
    # (property schema, expected pointer under /parameters/properties/v, feature)
    ({"type": "object", "patternProperties": {"^a": {"type": "string"}}}, "/patternProperties", "patternProperties"),
    ({"type": "string", "if": {"maxLength": 1}, "then": {"pattern": "a"}}, "/if", "if"),
    ({"type": "object", "dependentSchemas": {"a": {}}}, "/dependentSchemas", "dependentSchemas"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "/dependentRequired", "dependentRequired"),
    ({"allOf": [{"type": "string"}]}, "/allOf", "allOf"),
    ({"not": {"type": "string"}}, "/not", "not"),
    ({"type": "array", "uniqueItems": True}, "/uniqueItems", "uniqueItems"),
    ({"type": "array", "prefixItems": [{"type": "string"}]}, "/prefixItems", "prefixItems"),
    ({"type": "array", "contains": {"type": "string"}}, "/contains", "contains"),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, "/propertyNames", "propertyNames"),
    ({"type": "object", "minProperties": 1}, "/minProperties", "minProperties"),
    ({"type": "string", "nullable": True}, "/nullable", "nullable"),
    ({"type": "string", "format": "hostname"}, "/format", "format hostname"),
    ({"type": "string", "x-custom": 1}, "/x-custom", "x-custom"),
    ({"type": "tuple"}, "/type", "type tuple"),
    ({"$ref": "https://example.com/schema.json"}, "/$ref", "non-local $ref"),
    ({"$ref": "#/$defs/Nope"}, "/$ref", "$ref target missing"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}},
     "/additionalProperties", "additionalProperties schema with properties"),
    ({"type": "array", "items": [{"type": "string"}]}, "/items", "items (tuple form)"),
    ({"type": "number", "exclusiveMinimum": True}, "/exclusiveMinimum", "exclusiveMinimum (boolean form)"),
    ({"type": "string", "pattern": "(?<!unclosed"}, "/pattern", "pattern"),
    ({"description": "no type"}, "", "missing type"),
    ({"enum": [{"a": 1}]}, "/enum", "non-scalar enum value"),
]  # fmt: skip


@pytest.mark.parametrize(("prop", "where", "feature"), UNSUPPORTED, ids=[u[2] for u in UNSUPPORTED])
def test_unsupported_feature_fails_naming_file_pointer_feature(
    prop: dict[str, Any], where: str, feature: str
) -> None:
    with pytest.raises(SchemaFeatureError) as err:
        schema_to_model(obj({"v": prop}), source="tools/x.tool.md", pointer="/parameters")
    pointer = "/parameters/properties/v" + where
    assert (err.value.source, err.value.pointer, err.value.feature) == ("tools/x.tool.md", pointer, feature)
    assert str(err.value).startswith(
        f"tools/x.tool.md: {pointer}: unsupported JSON Schema feature {feature!r}"
    )


def test_ref_cycle_fails_with_the_chain() -> None:
    schema = {
        "type": "object",
        "$defs": {
            "Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Link"}}},
            "Link": {"type": "object", "properties": {"node": {"$ref": "#/$defs/Node"}}},
        },
        "properties": {"root": {"$ref": "#/$defs/Node"}},
    }
    with pytest.raises(SchemaFeatureError) as err:
        schema_to_model(schema, source="a.tool.md", pointer="/parameters")
    assert str(err.value) == (
        "a.tool.md: /parameters/$defs/Link/properties/node/$ref: unsupported JSON Schema feature "
        "'$ref cycle': #/$defs/Node -> #/$defs/Link -> #/$defs/Node"
    )


def test_nested_defs_are_rejected() -> None:
    with pytest.raises(SchemaFeatureError) as err:
        schema_to_model(obj({"v": {"type": "object", "$defs": {}}}), source="s")
    assert (err.value.pointer, err.value.feature) == ("/properties/v/$defs", "$defs")

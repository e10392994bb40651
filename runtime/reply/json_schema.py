"""Strict JSON Schema from pydantic models, for structured-output providers.

:func:`strict_json_schema` is what every tier sends (OpenAI strict ``json_schema``, a forced
tool's parameters, the prompt tier's instructions): every property required, no defaults, no
``discriminator``, one-value literals as ``enum``. :func:`inline_json_schema_refs` removes ``$ref``
for providers whose dialect has none (`docs/decisions.md#reply-schema-from-types`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

__all__ = ["StrictJsonSchema", "inline_json_schema_refs", "strict_json_schema"]


class StrictJsonSchema(GenerateJsonSchema):
    """JSON Schema generator for strict structured-output providers.

    Differences from pydantic's default: every property is listed in ``required`` (defaults
    are not emitted), tagged unions are plain ``anyOf`` without the OpenAPI ``discriminator``
    keyword (OpenAI strict mode rejects ``oneOf``/``discriminator``), and a one-value literal is
    ``enum: [v]`` rather than ``const``.
    Closedness (``additionalProperties: false``) comes from ``extra="forbid"`` on the models.
    """

    def field_is_required(self, field: Any, total: bool) -> bool:
        return True

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        out = super().model_schema(schema)
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("required", [])
        return out

    def literal_schema(self, schema: core_schema.LiteralSchema) -> JsonSchemaValue:
        out = super().literal_schema(schema)
        if "const" in out:  # a one-value enum is understood by every strict provider
            out["enum"] = [out.pop("const")]
        return out

    def tagged_union_schema(self, schema: core_schema.TaggedUnionSchema) -> JsonSchemaValue:
        out = super().tagged_union_schema(schema)
        out.pop("discriminator", None)
        if "oneOf" in out:
            out["anyOf"] = out.pop("oneOf")
        return out


def strict_json_schema(output_type: type[BaseModel]) -> dict[str, Any]:
    """Return ``output_type``'s JSON Schema in the strict-provider form (see :class:`StrictJsonSchema`).

    Args:
        output_type: Any pydantic model class.

    Returns:
        A fresh copy of the JSON Schema dict (may contain ``$defs``/``$ref``); generation is cached
        per type (it costs milliseconds, and a structured call needs it every time).
    """
    schema: dict[str, Any] = json.loads(_cached_schema(output_type))
    return schema


@functools.lru_cache(maxsize=256)
def _cached_schema(output_type: type[BaseModel]) -> str:
    return json.dumps(
        BaseModel.model_json_schema.__func__(output_type, schema_generator=StrictJsonSchema)  # type: ignore[attr-defined]
    )


def inline_json_schema_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of ``schema`` with every local ``{"$ref": "#/$defs/X"}`` replaced by the
    definition and ``$defs`` removed (for providers whose schema dialect has no ``$ref``, such as
    older Gemini ``responseSchema``).

    Raises:
        ValueError: the schema is recursive (a definition refers to itself).
    """
    defs = schema.get("$defs", {})

    def walk(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.removeprefix("#/$defs/")
                if name in seen:
                    raise ValueError(f"recursive schema definition {name!r} cannot be inlined")
                extra = {k: v for k, v in node.items() if k != "$ref"}
                return {**walk(defs[name], (*seen, name)), **walk(extra, seen)}
            return {k: walk(v, seen) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v, seen) for v in node]
        return node

    result: dict[str, Any] = walk(schema, ())
    return result

"""JSON Schema → pydantic model converter for tool parameters: an unsupported
schema feature is a hard fail at start-up (docs/decisions.md#tool-md-hard-fail).

:func:`schema_to_model` turns a tool's ``parameters`` JSON Schema into a pydantic model class whose
lax validation checks the model's arguments (:func:`runtime.agent.tools.validate_tool_call`) and whose
``model_json_schema()`` returns the author's schema unchanged (so the model sees exactly what was
written). Anything outside the supported subset raises :class:`SchemaFeatureError` naming the
source, the JSON pointer and the feature — never a silent loosening.

Supported subset (each one is tested in ``tests/session/test_features_schema_model.py``):

* ``type``: ``object``, ``string``, ``integer``, ``number``, ``boolean``, ``array``, ``null``, or a
  list of them (``["string", "null"]`` is how to write a nullable value);
* objects: ``properties``, ``required`` (a property that is not required and has no ``default`` may
  be omitted, but not sent as ``null`` unless its type allows it), ``additionalProperties``
  ``false`` (extra keys rejected), ``true``/absent (extra keys kept and passed to the handler) or a
  schema when there are no ``properties`` (a map ``{str: value}``);
* ``enum`` (strings, numbers, booleans, null) and ``const``;
* ``default``, ``description``, ``title`` and the annotations ``examples``, ``$schema``, ``$id``,
  ``$comment``, ``deprecated``, ``readOnly``, ``writeOnly`` (no effect on validation);
* numbers: ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum`` (numeric, draft
  2019+ form), ``multipleOf``;
* strings: ``minLength``, ``maxLength``, ``pattern`` (Python ``re`` search semantics), ``format``
  one of :data:`FORMATS` (values stay strings; the format is checked);
* arrays: ``items`` (one schema), ``minItems``, ``maxItems``;
* ``anyOf`` (any alternative) and ``oneOf`` (exactly one alternative must accept the value);
* ``$ref`` to ``#/$defs/<name>`` or ``#/definitions/<name>`` of the same document, without cycles.

Everything else fails, in particular: ``$ref`` cycles and non-local ``$ref``, ``allOf``, ``not``,
``if``/``then``/``else``, ``patternProperties``, ``dependentSchemas``, ``dependentRequired``,
``dependencies``, ``propertyNames``, ``unevaluated*``, ``prefixItems``, ``contains``,
``uniqueItems``, ``minProperties``/``maxProperties``, ``additionalProperties`` as a schema next to
``properties``, an unknown ``format``, OpenAPI's ``nullable``, and any unknown keyword.
"""

from __future__ import annotations

import copy
import ipaddress
import re
import uuid
from datetime import date, datetime, time
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, create_model
from pydantic.fields import FieldInfo

__all__ = ["FORMATS", "UNSUPPORTED", "SchemaFeatureError", "ToolArgs", "dump_params", "schema_to_model"]

UNSUPPORTED = (
    "allOf", "not", "if", "then", "else", "patternProperties", "dependentSchemas", "dependentRequired",
    "dependencies", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "prefixItems",
    "contains", "minContains", "maxContains", "uniqueItems", "minProperties", "maxProperties",
    "$dynamicRef", "$dynamicAnchor", "$anchor", "$recursiveRef", "nullable", "additionalItems",
    "contentEncoding", "contentMediaType", "contentSchema",
)  # fmt: skip
"""Keywords that are recognised and rejected with a specific message."""

_ANNOTATIONS = {
    "title",
    "description",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
}
_KNOWN = _ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "enum", "const", "default",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
    "maxLength", "pattern", "format", "items", "minItems", "maxItems", "anyOf", "oneOf", "$ref",
    "$defs", "definitions",
}  # fmt: skip
_TYPES = {"object", "string", "integer", "number", "boolean", "array", "null"}


def _check_format(fmt: str) -> Any:
    def check(value: str) -> str:
        try:
            if fmt == "date-time":
                datetime.fromisoformat(value.replace("Z", "+00:00"))
                if "T" not in value.upper():
                    raise ValueError
            elif fmt == "date":
                date.fromisoformat(value)
            elif fmt == "time":
                time.fromisoformat(value.replace("Z", "+00:00"))
            elif fmt == "email":
                if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", value):
                    raise ValueError
            elif fmt == "uri":
                if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:[^\s]+", value):
                    raise ValueError
            elif fmt == "uuid":
                uuid.UUID(value)
            elif fmt == "ipv4":
                ipaddress.IPv4Address(value)
            elif fmt == "ipv6":
                ipaddress.IPv6Address(value)
        except ValueError:
            raise ValueError(f"not a valid {fmt}: {value!r}") from None
        return value

    return check


FORMATS = ("date-time", "date", "time", "email", "uri", "uuid", "ipv4", "ipv6")
"""String formats that are checked (the value stays a ``str``)."""


class SchemaFeatureError(ValueError):
    """A JSON Schema feature the converter does not support (start-up hard fail,
    docs/decisions.md#tool-md-hard-fail).

    Attributes:
        source: Where the schema came from (a file path, ``mcp:<server>/<tool>``).
        pointer: JSON pointer of the offending keyword (e.g. ``/parameters/properties/a/if``).
        feature: The keyword or feature name (e.g. ``if``, ``$ref cycle``).
    """

    def __init__(self, source: str, pointer: str, feature: str, detail: str = "") -> None:
        self.source, self.pointer, self.feature = source, pointer, feature
        text = f"{source}: {pointer or '/'}: unsupported JSON Schema feature {feature!r}"
        super().__init__(f"{text}: {detail}" if detail else text)


class ToolArgs(BaseModel):
    """Base of converted models: ``model_json_schema()`` returns the source schema (top level)."""

    __source_schema__: dict[str, Any] | None = None
    __optional_fields__: frozenset[str] = frozenset()

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The author's schema (a deep copy) for the top model; pydantic's for nested ones."""
        if cls.__source_schema__ is not None:
            return copy.deepcopy(cls.__source_schema__)
        return super().model_json_schema(*args, **kwargs)


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


class _Converter:
    def __init__(self, root: dict[str, Any], source: str, base_pointer: str) -> None:
        self.root, self.source, self.base = root, source, base_pointer
        self.refs: dict[str, Any] = {}
        self.resolving: list[str] = []
        self.count = 0

    def fail(self, pointer: str, feature: str, detail: str = "") -> SchemaFeatureError:
        return SchemaFeatureError(self.source, self.base + pointer, feature, detail)

    # ------------------------------------------------------------------ entry
    def convert(self, schema: Any, ptr: str, name: str) -> tuple[Any, dict[str, Any]]:
        """Return ``(annotation, Field kwargs)`` for ``schema`` at ``ptr``."""
        if schema is True or schema == {}:
            return Any, {}
        if not isinstance(schema, dict):
            raise self.fail(ptr, "schema", f"expected an object, got {schema!r}")
        for key in schema:
            if key in UNSUPPORTED:
                raise self.fail(f"{ptr}/{_escape(key)}", key)
            if key not in _KNOWN:
                raise self.fail(f"{ptr}/{_escape(key)}", key, "unknown keyword")
        for defs in ("$defs", "definitions"):
            if defs in schema and ptr != "":
                raise self.fail(f"{ptr}/{defs}", defs, "only allowed at the top of the schema")
        kw: dict[str, Any] = {}
        if "description" in schema:
            kw["description"] = schema["description"]
        if "default" in schema:
            kw["default"] = schema["default"]
        ann = self._annotation(schema, ptr, name)
        return ann, kw

    def _annotation(self, schema: dict[str, Any], ptr: str, name: str) -> Any:
        if "$ref" in schema:
            extra = set(schema) - _ANNOTATIONS - {"$ref", "default"}
            if extra:
                raise self.fail(
                    f"{ptr}/$ref", "$ref with siblings", f"keywords next to $ref: {sorted(extra)}"
                )
            return self._ref(schema["$ref"], f"{ptr}/$ref")
        if "const" in schema:
            return self._literal([schema["const"]], f"{ptr}/const")
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise self.fail(f"{ptr}/enum", "enum", "expected a non-empty list")
            return self._literal(values, f"{ptr}/enum")
        for key in ("anyOf", "oneOf"):
            if key in schema:
                alts = schema[key]
                if not isinstance(alts, list) or not alts:
                    raise self.fail(f"{ptr}/{key}", key, "expected a non-empty list")
                if "type" in schema:
                    raise self.fail(
                        f"{ptr}/{key}", f"{key} with type", "put the type inside each alternative"
                    )
                anns = []
                for i, alt in enumerate(alts):
                    a, akw = self.convert(alt, f"{ptr}/{key}/{i}", f"{name}_{i}")
                    anns.append(Annotated[a, Field(**{k: v for k, v in akw.items() if k != "default"})])
                union: Any = Union[tuple(anns)] if len(anns) > 1 else anns[0]  # noqa: UP007
                if key == "oneOf":
                    return Annotated[union, BeforeValidator(_exactly_one([TypeAdapter(a) for a in anns]))]  # type: ignore[arg-type]
                return union
        types = schema.get("type")
        if types is None:
            if any(k in schema for k in ("properties", "additionalProperties", "required")):
                types = "object"
            else:
                raise self.fail(
                    ptr, "missing type", "every schema needs a type (or enum/const/anyOf/oneOf/$ref)"
                )
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not types:
            raise self.fail(f"{ptr}/type", "type", f"expected a type name or a list, got {types!r}")
        anns = []
        for t in types:
            if t not in _TYPES:
                raise self.fail(f"{ptr}/type", f"type {t}", f"known types: {sorted(_TYPES)}")
            anns.append(self._typed(t, schema, ptr, name))
        return Union[tuple(anns)] if len(anns) > 1 else anns[0]  # noqa: UP007

    def _literal(self, values: list[Any], ptr: str) -> Any:
        for v in values:
            if not (v is None or isinstance(v, str | int | float | bool)):
                raise self.fail(ptr, "non-scalar enum value", f"{v!r}")
        return Literal[tuple(values)]

    def _ref(self, ref: Any, ptr: str) -> Any:
        m = re.fullmatch(r"#/(\$defs|definitions)/([^/]+)", ref) if isinstance(ref, str) else None
        if m is None:
            raise self.fail(ptr, "non-local $ref", f"{ref!r}: only #/$defs/<name> or #/definitions/<name>")
        key = m.group(0)
        if key in self.refs:
            return self.refs[key]
        if key in self.resolving:
            chain = " -> ".join([*self.resolving[self.resolving.index(key) :], key])
            raise self.fail(ptr, "$ref cycle", chain)
        target = (self.root.get(m.group(1)) or {}).get(m.group(2))
        if target is None:
            raise self.fail(ptr, "$ref target missing", f"{ref!r} is not defined")
        self.resolving.append(key)
        ann, _ = self.convert(target, f"/{m.group(1)}/{_escape(m.group(2))}", re.sub(r"\W", "_", m.group(2)))
        self.resolving.pop()
        self.refs[key] = ann
        return ann

    # ------------------------------------------------------------------ per type
    def _typed(self, t: str, s: dict[str, Any], ptr: str, name: str) -> Any:
        if t == "null":
            return None
        if t == "boolean":
            return bool
        if t in ("integer", "number"):
            kw: dict[str, Any] = {}
            for key, arg in (("minimum", "ge"), ("maximum", "le"), ("exclusiveMinimum", "gt"),
                             ("exclusiveMaximum", "lt"), ("multipleOf", "multiple_of")):  # fmt: skip
                if key in s:
                    if isinstance(s[key], bool) or not isinstance(s[key], int | float):
                        raise self.fail(
                            f"{ptr}/{key}", f"{key} (boolean form)", "use the numeric draft 2019+ form"
                        )
                    kw[arg] = s[key]
            base: Any = int if t == "integer" else float
            return Annotated[base, Field(**kw)] if kw else base
        if t == "string":
            kw = {}
            if "minLength" in s:
                kw["min_length"] = s["minLength"]
            if "maxLength" in s:
                kw["max_length"] = s["maxLength"]
            if "pattern" in s:
                try:
                    re.compile(s["pattern"])
                except re.error as exc:
                    raise self.fail(
                        f"{ptr}/pattern", "pattern", f"not a Python regular expression: {exc}"
                    ) from None
                kw["pattern"] = s["pattern"]
            ann: Any = Annotated[str, Field(**kw)] if kw else str
            if "format" in s:
                if s["format"] not in FORMATS:
                    raise self.fail(f"{ptr}/format", f"format {s['format']}", f"supported: {list(FORMATS)}")
                ann = Annotated[ann, AfterValidator(_check_format(s["format"]))]
            return ann
        if t == "array":
            item: Any = Any
            if "items" in s:
                if not isinstance(s["items"], dict | bool):
                    raise self.fail(f"{ptr}/items", "items (tuple form)", "use one schema for all items")
                item, ikw = self.convert(s["items"], f"{ptr}/items", f"{name}_item")
                if "description" in ikw:
                    item = Annotated[item, Field(description=ikw["description"])]
            kw = {}
            if "minItems" in s:
                kw["min_length"] = s["minItems"]
            if "maxItems" in s:
                kw["max_length"] = s["maxItems"]
            return Annotated[list[item], Field(**kw)] if kw else list[item]
        return self._object(s, ptr, name)

    def _object(self, s: dict[str, Any], ptr: str, name: str) -> Any:
        props = s.get("properties")
        extra = s.get("additionalProperties", True)
        if props is None:
            if isinstance(extra, dict):
                value, _ = self.convert(extra, f"{ptr}/additionalProperties", f"{name}_value")
                return dict[str, value]  # type: ignore[valid-type]
            if extra is False:
                props = {}
            else:
                return dict[str, Any]
        if not isinstance(props, dict):
            raise self.fail(f"{ptr}/properties", "properties", "expected an object")
        if isinstance(extra, dict):
            raise self.fail(f"{ptr}/additionalProperties", "additionalProperties schema with properties")
        if not isinstance(extra, bool):
            raise self.fail(f"{ptr}/additionalProperties", "additionalProperties", f"{extra!r}")
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise self.fail(f"{ptr}/required", "required", "expected a list of property names")
        missing = [r for r in required if r not in props]
        if missing:
            raise self.fail(f"{ptr}/required", "required names an undefined property", f"{missing}")
        fields: dict[str, Any] = {}
        optional: set[str] = set()
        for i, (key, sub) in enumerate(props.items()):
            ann, kw = self.convert(sub, f"{ptr}/properties/{_escape(key)}", f"{name}_{key}")
            field_name = (
                key
                if key.isidentifier() and not key.startswith("_") and not hasattr(ToolArgs, key)
                else f"f{i}"
            )
            if key not in required and "default" not in kw:
                kw["default"] = None
                optional.add(field_name)
            elif key in required:
                kw.pop("default", None)
            fields[field_name] = (ann, Field(alias=key, **kw))
        self.count += 1
        model: type[ToolArgs] = create_model(
            re.sub(r"\W", "_", name) or "Args",
            __base__=ToolArgs,
            **fields,
        )
        model.model_config = ConfigDict(extra="forbid" if extra is False else "allow", populate_by_name=True)
        model.model_rebuild(force=True)
        model.__optional_fields__ = frozenset(optional)
        return model


def _exactly_one(adapters: list[TypeAdapter[Any]]) -> Any:
    def check(value: Any) -> Any:
        ok = 0
        for a in adapters:
            try:
                a.validate_python(value)
                ok += 1
            except ValueError:
                continue
        if ok != 1:
            raise ValueError(f"oneOf: {ok} alternatives accept this value, exactly one must")
        return value

    return check


def schema_to_model(
    schema: dict[str, Any], *, name: str = "Args", source: str = "<schema>", pointer: str = ""
) -> type[ToolArgs]:
    """Convert a tool's ``parameters`` JSON Schema into a pydantic model class.

    Args:
        schema: The JSON Schema; its top level must describe an object (tool arguments).
        name: Class name of the top model.
        source: Where it came from, used in error messages (file path, ``mcp:server/tool``).
        pointer: JSON pointer of ``schema`` inside its document (e.g. ``/parameters``), prefixed
            to every pointer in errors.

    Returns:
        A :class:`ToolArgs` subclass; ``model_json_schema()`` returns a copy of ``schema``.

    Raises:
        SchemaFeatureError: a feature outside the documented subset (names source, pointer, feature).
    """
    conv = _Converter(schema if isinstance(schema, dict) else {}, source, pointer)
    ann, _ = conv.convert(schema, "", name)
    if not (isinstance(ann, type) and issubclass(ann, ToolArgs)):
        if ann is Any or (isinstance(schema, dict) and schema.get("type") == "object"):
            # an object without properties: arguments are a free map
            ann = create_model(name, __base__=ToolArgs)
            ann.model_config = ConfigDict(extra="allow")
            ann.model_rebuild(force=True)
        else:
            raise SchemaFeatureError(
                source, pointer or "/", "non-object parameters", "tool arguments must be an object"
            )
    ann.__source_schema__ = copy.deepcopy(schema)
    result: type[ToolArgs] = ann
    return result


def dump_params(value: Any) -> Any:
    """JSON-able arguments of a converted model instance, keyed by the schema's property names.

    Optional properties the model did not send (and that have no ``default``) are left out;
    extra keys allowed by ``additionalProperties`` are kept.
    """
    if isinstance(value, BaseModel):
        cls = type(value)
        optional: frozenset[str] = getattr(cls, "__optional_fields__", frozenset())
        out: dict[str, Any] = {}
        for fname, info in cls.model_fields.items():
            if fname in optional and fname not in value.model_fields_set:
                continue
            out[_alias(info, fname)] = dump_params(getattr(value, fname))
        out.update({k: dump_params(v) for k, v in (value.__pydantic_extra__ or {}).items()})
        return out
    if isinstance(value, list | tuple):
        return [dump_params(v) for v in value]
    if isinstance(value, dict):
        return {k: dump_params(v) for k, v in value.items()}
    return value


def _alias(info: FieldInfo, fname: str) -> str:
    return info.alias or fname

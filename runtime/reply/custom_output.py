"""Custom output schemas: a session whose final answer is an instance of the operator's own schema
instead of IM segments (config ``ai.agent.output_schema``; docs/decisions.md#structured-custom-schema).

:class:`OutputSpec` is the answer type in both forms a provider and the validator need: a pydantic
class (strict validation) and its JSON Schema (what every tier sends). Build one with
:func:`spec_from_json_schema` (a JSON Schema object, e.g. read from a file) or
:func:`spec_from_model` (a pydantic class). Both enforce the rules of the IM reply schema, so a
strict provider accepts the schema and the validator never has to guess:

* every object is **closed** — ``additionalProperties: false`` (a JSON Schema object that does not
  say is closed here; one that allows extra keys is refused) or a typed map
  (``additionalProperties: {schema}`` without ``properties``); a pydantic model needs
  ``extra="forbid"``;
* every property is **required** (write an optional value as a nullable type,
  ``["string", "null"]``);
* the top level is an object.

:class:`CustomOutputContract` is :class:`~runtime.reply.im_reply.ImReplyContract` with that type:
same tiers (native → tool → prompt, with the shared capability cache and downgrade on evidence),
same strict validation (no coercion, no fence stripping, no JSON pulled out of prose), the same one
format-correction call — but no IM instructions in the prompt, no mention rules, and on failure
nothing at all (no failure text in the chat, ``value is None``). The validated instance is
``ReplyOutcome.value``; ``ReplyOutcome.reply`` is always empty (nothing is sent to the chat). What
happens to the value (HTTP callback, transcript) is the session's business
(:mod:`runtime.session.output_sink`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from runtime.agent.schema_model import SchemaFeatureError, ToolArgs, dump_params, schema_to_model
from runtime.llm.options import StreamOptions
from runtime.llm.types import Model
from runtime.reply.capability import CapabilityCache, Tier
from runtime.reply.im_reply import ImReplyConfig, ImReplyContract, ReplyOutcome
from runtime.reply.json_schema import strict_json_schema
from runtime.reply.mentions import MentionIdentity
from runtime.reply.segments import Reply
from runtime.reply.structured import Outcome, StreamFn, validate_raw

__all__ = [
    "CUSTOM_CORRECTION_PROMPT",
    "OUTPUT_TOOL",
    "CustomOutputContract",
    "OutputSchemaError",
    "OutputSpec",
    "schema_problems",
    "spec_from_json_schema",
    "spec_from_model",
]

OUTPUT_TOOL = "final_output"
"""Name of the output tool (``tool`` tier) and of the schema (``native`` tier) in a session."""

CUSTOM_CORRECTION_PROMPT = (
    "You repair the format of a JSON answer. You get an answer that does not follow the required "
    "JSON schema and the validation error. Return the same answer, with the same content, as one "
    "JSON object that follows the schema. Do not invent values that are not in the answer, do not "
    "add anything, do not call any tool other than the output tool when one is offered."
)
"""System prompt of the format-correction call of a custom schema."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class OutputSchemaError(ValueError):
    """A custom output schema cannot be used; the message names its source and every problem
    (JSON pointer + rule). Raised at start-up (docs/decisions.md#tool-md-hard-fail)."""


@dataclass(frozen=True)
class OutputSpec:
    """The answer type of a custom-schema session.

    Attributes:
        output_type: Pydantic class the answer is strictly validated as.
        schema: The JSON Schema sent to the provider (closed, every property required).
        name: The type's name (the schema ``title`` or class name; ``[A-Za-z0-9_-]``, ≤ 64).
        source: Where it came from (``module:Model``, a file path, ``<inline>``), for messages.
    """

    output_type: type[BaseModel]
    schema: dict[str, Any]
    name: str
    source: str

    def dump(self, value: BaseModel) -> Any:
        """The JSON-able form of a validated ``value``, keyed as in :attr:`schema`."""
        if issubclass(self.output_type, ToolArgs):
            return dump_params(value)
        return value.model_dump(mode="json", by_alias=True)


def _close(node: Any) -> Any:
    """A copy of a JSON Schema where an object with ``properties`` and no ``additionalProperties``
    gets ``additionalProperties: false`` (closed by default). Values of ``enum``/``const``/
    ``default``/``examples`` are data, not schemas, and are copied as they are."""
    if isinstance(node, list):
        return [_close(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _close(sub) for name, sub in value.items()}
        elif key in ("enum", "const", "default", "examples"):
            out[key] = copy.deepcopy(value)
        else:
            out[key] = _close(value)
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _is_object(node: dict[str, Any]) -> bool:
    t = node.get("type")
    return t == "object" or (isinstance(t, list) and "object" in t) or "properties" in node


def schema_problems(schema: dict[str, Any]) -> list[str]:
    """Every place ``schema`` breaks the closed/required rules, as ``"<pointer>: <rule>"`` lines
    (empty when fine). Walks ``properties``, ``items``, ``anyOf``/``oneOf``, map values and
    ``$defs``/``definitions``."""
    problems: list[str] = []

    def walk(node: Any, ptr: str) -> None:
        if not isinstance(node, dict):
            return
        if _is_object(node):
            extra = node.get("additionalProperties")
            props = node.get("properties")
            if props is not None and extra is not False:
                problems.append(f"{ptr or '/'}: an object must be closed (additionalProperties: false)")
            if props is None and not isinstance(extra, dict) and extra is not False:
                problems.append(
                    f"{ptr or '/'}: an object needs properties (closed) or a typed additionalProperties"
                )
            if isinstance(props, dict):
                missing = [k for k in props if k not in (node.get("required") or [])]
                if missing:
                    problems.append(
                        f"{ptr or '/'}: every property must be required (use a nullable type for an "
                        f"optional value): {', '.join(missing)}"
                    )
                for key, sub in props.items():
                    walk(sub, f"{ptr}/properties/{key}")
            if isinstance(extra, dict):
                walk(extra, f"{ptr}/additionalProperties")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{ptr}/items")
        for key in ("anyOf", "oneOf"):
            for i, alt in enumerate(node.get(key) or []):
                walk(alt, f"{ptr}/{key}/{i}")
        for key in ("$defs", "definitions"):
            for name, sub in (node.get(key) or {}).items():
                walk(sub, f"{ptr}/{key}/{name}")

    walk(schema, "")
    return problems


def _fail(source: str, problems: list[str]) -> OutputSchemaError:
    return OutputSchemaError(f"{source}: not usable as an output schema: " + "; ".join(problems))


def _name(candidate: Any, fallback: str) -> str:
    return candidate if isinstance(candidate, str) and _NAME.fullmatch(candidate) else fallback


def spec_from_json_schema(schema: Any, *, source: str = "<inline>") -> OutputSpec:
    """An :class:`OutputSpec` from a JSON Schema object (objects closed by default, see the module
    docstring; the supported keywords are those of :mod:`runtime.agent.schema_model`).

    Raises:
        OutputSchemaError: not an object schema, an open object, an optional property, or a
            keyword outside the supported subset (message names ``source`` and the pointer).
    """
    if not isinstance(schema, dict):
        raise _fail(source, [f"expected a JSON Schema object, got {type(schema).__name__}"])
    closed = _close(schema)
    if not _is_object(closed) or closed.get("properties") is None:
        raise _fail(source, ["/: the top level must be an object with properties"])
    problems = schema_problems(closed)
    if problems:
        raise _fail(source, problems)
    name = _name(closed.get("title"), "Output")
    try:
        model = schema_to_model(closed, name=name, source=source)
    except SchemaFeatureError as exc:
        raise OutputSchemaError(str(exc)) from None
    return OutputSpec(model, closed, name, source)


def spec_from_model(output_type: Any, *, source: str = "") -> OutputSpec:
    """An :class:`OutputSpec` from a pydantic class (its strict JSON Schema,
    :func:`runtime.reply.json_schema.strict_json_schema`).

    Raises:
        OutputSchemaError: not a pydantic model class, or a model that is open (no
            ``extra="forbid"``) somewhere (message names the pointer).
    """
    source = source or getattr(output_type, "__name__", repr(output_type))
    if not (isinstance(output_type, type) and issubclass(output_type, BaseModel)):
        raise _fail(source, [f"expected a pydantic model class, got {output_type!r}"])
    schema = strict_json_schema(output_type)
    problems = schema_problems(schema)
    if problems:
        raise _fail(source, [*problems, "hint: model_config = ConfigDict(extra='forbid')"])
    return OutputSpec(output_type, schema, _name(output_type.__name__, "Output"), source)


class CustomOutputContract(ImReplyContract):
    """The final answer as an instance of ``spec`` (see the module docstring).

    Args:
        model: The session's chat model.
        spec: The answer type.
        config: ``correction_timeout_s`` / ``sleep`` are used; ``failure_text`` is not (a failed
            answer delivers nothing).
        cache / stream_fn / options: As for :class:`~runtime.reply.im_reply.ImReplyContract`.
    """

    tool_name = OUTPUT_TOOL
    tool_description = "Return your final answer as the arguments of this tool (it ends the turn)."
    instructions = None  # the IM message prompt is not added
    correction_prompt = CUSTOM_CORRECTION_PROMPT

    def __init__(
        self,
        model: Model,
        spec: OutputSpec,
        *,
        config: ImReplyConfig | None = None,
        cache: CapabilityCache | None = None,
        stream_fn: StreamFn | None = None,
        options: StreamOptions | None = None,
    ) -> None:
        super().__init__(model, "segments", config=config, cache=cache, stream_fn=stream_fn, options=options)
        self.spec = spec
        self.output_type = spec.output_type
        self.schema = spec.schema

    def _validate(self, raw: str, identity: MentionIdentity) -> tuple[Any, str | None]:
        return validate_raw(self.output_type, raw)

    def _outcome(
        self, tier: Tier, outcome: Outcome, value: Any, raw: str, why: str | None, calls: int
    ) -> ReplyOutcome:
        return ReplyOutcome(Reply(segments=[]), tier, outcome, raw, why, calls, value=value)

    def _failure_reply(self) -> Reply:
        return Reply(segments=[])

"""Executable tools for the agent loop and their argument validation
(docs/decisions.md#agent-tool-validation).

An :class:`AgentTool` pairs what the model sees (name, description, the JSON Schema of a pydantic
model class) with an async ``execute``. :func:`validate_tool_call` checks a model's call against
the tool's parameters with pydantic's *lax* mode (``"500"`` is accepted for an ``int``; peers
learned that models send numbers as strings), and treats ``""``/``null`` arguments as ``{}``.

A validation failure raises :class:`ToolValidationError` whose text names the tool, every failing
field and the received arguments; the agent loop turns it into an ``is_error`` tool result so the
model can correct itself (docs/decisions.md#agent-tool-validation).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from runtime.llm.abort import AbortSignal
from runtime.llm.builder import parse_tool_arguments
from runtime.llm.types import ImageContent, TextContent, Tool, ToolCall

__all__ = [
    "MAX_ARGUMENTS_ECHO_CHARS",
    "AgentTool",
    "AgentToolResult",
    "ToolExecuteFn",
    "ToolNotFoundError",
    "ToolUpdateFn",
    "ToolValidationError",
    "find_tool",
    "validate_tool_call",
]

P = TypeVar("P", bound=BaseModel)


@dataclass
class AgentToolResult:
    """What a tool returns.

    Attributes:
        content: Blocks sent back to the model (text and/or images).
        details: Structured data for the host/UI (kept on the ``ToolResultMessage``, never sent
            to the model).
    """

    content: list[TextContent | ImageContent] = field(default_factory=list)
    details: Any = None

    @classmethod
    def text(cls, text: str, details: Any = None) -> AgentToolResult:
        """Shorthand for a single text block."""
        return cls(content=[TextContent(text=text)], details=details)


ToolUpdateFn = Callable[[AgentToolResult], None]
"""``on_update(partial_result)``: report progress; the loop emits ``tool_execution_update``."""

ToolExecuteFn = Callable[[str, Any, AbortSignal | None, ToolUpdateFn], Awaitable[AgentToolResult | str]]
"""``execute(tool_call_id, params, signal, on_update)``; ``params`` is an instance of the tool's
``parameters`` class. Returning a ``str`` is shorthand for one text block. Raising an exception
makes an ``is_error`` result carrying the exception's text."""


@dataclass
class AgentTool(Generic[P]):
    """A tool the agent loop can run.

    Attributes:
        name: Tool name the model calls (``[a-zA-Z0-9_-]``, ≤ 64 chars for every provider).
        description: What it does, for the model.
        parameters: A pydantic model class; its JSON Schema is what providers see and its lax
            validation checks the model's arguments.
        execute: ``async (tool_call_id, params, signal, on_update) -> AgentToolResult | str``.
        label: Human-readable name for UIs (defaults to ``name``).

    Example:
        >>> from pydantic import BaseModel
        >>> class EchoArgs(BaseModel):
        ...     text: str
        >>> async def run(call_id, params, signal, on_update):
        ...     return AgentToolResult.text(params.text)
        >>> echo = AgentTool("echo", "Echo text back.", EchoArgs, run)
        >>> echo.to_tool().parameters["required"]
        ['text']
    """

    name: str
    description: str
    parameters: type[P]
    execute: ToolExecuteFn
    label: str = ""

    def to_tool(self) -> Tool:
        """Return the :class:`~runtime.llm.types.Tool` the model sees (JSON Schema of ``parameters``)."""
        return Tool(name=self.name, description=self.description, parameters=_json_schema(self.parameters))


@functools.lru_cache(maxsize=512)
def _cached_schema_text(parameters: type[BaseModel]) -> str:
    return json.dumps(parameters.model_json_schema())


def _json_schema(parameters: type[BaseModel]) -> dict[str, Any]:
    """JSON Schema of a parameters model, generated once per class (pydantic's generation cost
    ≈ 1.5 ms per tool and the agent loop asks for it at every LLM call); each caller gets its own
    copy, so mutating it never changes the cache: decoded from the cached JSON text, a third of
    what a deep copy of the dict costs (measured 9 against 32 µs for a four-field model).

    Raises:
        TypeError: the schema holds a value JSON cannot carry (no provider could send it either).
    """
    schema: dict[str, Any] = json.loads(_cached_schema_text(parameters))
    return schema


class ToolNotFoundError(LookupError):
    """The model called a tool that is not in the list; the message names the available tools."""


class ToolValidationError(ValueError):
    """A tool call's arguments failed validation.

    Attributes:
        tool_name: The tool.
        errors: ``(field path, message)`` pairs, one per failing field.
        arguments: The arguments as received.
    """

    def __init__(self, tool_name: str, errors: list[tuple[str, str]], arguments: Any) -> None:
        self.tool_name = tool_name
        self.errors = errors
        self.arguments = arguments
        lines = [f'Validation failed for tool "{tool_name}":']
        lines += [f"  - {loc}: {msg}" for loc, msg in errors]
        lines.append(f"Received arguments: {_dump(arguments)}")
        super().__init__("\n".join(lines))


MAX_ARGUMENTS_ECHO_CHARS = 2000
"""Longest echo of the received arguments in a :class:`ToolValidationError` text (characters);
longer ones are cut and say how long they were, so a huge bad call does not flood the context."""


def _dump(value: Any) -> str:
    if isinstance(value, str):
        text = value  # raw argument text that did not parse: shown as it came
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    if len(text) > MAX_ARGUMENTS_ECHO_CHARS:
        text = f"{text[:MAX_ARGUMENTS_ECHO_CHARS]}… (cut; {len(text)} characters in all)"
    return text


def find_tool(tools: Sequence[AgentTool[Any]], name: str) -> AgentTool[Any]:
    """Return the tool called ``name``.

    Raises:
        ToolNotFoundError: no such tool; the message lists the available names.
    """
    for t in tools:
        if t.name == name:
            return t
    available = ", ".join(t.name for t in tools) or "(none)"
    raise ToolNotFoundError(f'Tool "{name}" not found. Available tools: {available}')


def _normalize_arguments(tool_name: str, arguments: Any) -> Any:
    if arguments is None:
        return {}
    if isinstance(arguments, str):
        try:
            return parse_tool_arguments(arguments)
        except ValueError as exc:
            raise ToolValidationError(tool_name, [("(arguments)", str(exc))], arguments) from None
    return arguments


def validate_tool_call(tools: Sequence[AgentTool[Any]], tool_call: ToolCall) -> BaseModel:
    """Validate ``tool_call`` against its tool and return the parsed parameters.

    Lax pydantic validation: strings are coerced where pydantic's lax mode allows (``"500"`` → 500).
    Arguments of ``""``, whitespace or ``null`` (``None``) mean ``{}``; a JSON *string* is parsed.
    A call whose streamed argument text did not parse (``tool_call.arguments_error`` set by the
    stream builder: truncated JSON, trailing garbage, an array) is refused even though its
    ``arguments`` hold a partial parse: the tool never runs on guessed arguments.
    The received arguments are echoed in the error text up to
    :data:`MAX_ARGUMENTS_ECHO_CHARS` characters.

    Args:
        tools: The available tools.
        tool_call: The model's call (``arguments`` normally a dict).

    Returns:
        An instance of the tool's ``parameters`` class.

    Raises:
        ToolNotFoundError: ``tool_call.name`` is not in ``tools``.
        ToolValidationError: the arguments do not fit, or their JSON did not parse; its text
            names the tool, each failing field with pydantic's message (``(arguments)`` for a
            parse failure), and the received arguments.
    """
    tool = find_tool(tools, tool_call.name)
    if tool_call.arguments_error is not None:
        raise ToolValidationError(
            tool.name, [("(arguments)", tool_call.arguments_error)], tool_call.raw_arguments or ""
        )
    args = _normalize_arguments(tool.name, tool_call.arguments)
    try:
        return tool.parameters.model_validate(args)
    except ValidationError as exc:
        errors = [(".".join(str(p) for p in err["loc"]) or "(arguments)", err["msg"]) for err in exc.errors()]
        raise ToolValidationError(tool.name, errors, args) from None

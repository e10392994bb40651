"""``*.tool.md`` tools: Markdown files whose YAML frontmatter declares a tool
(docs/decisions.md#tool-md-hard-fail).

Format (example: ``examples/tools/weather.tool.md``)::

    ---
    name: get_weather                 # [a-zA-Z0-9_-]{1,64}, unique in the folder
    description: Current weather for a city.   # optional when the Markdown body is not empty
    parameters:                       # JSON Schema of the arguments (runtime.agent.schema_model's subset)
      type: object
      properties:
        city: {type: string, minLength: 1}
      required: [city]
    handler:                          # exactly one of the two forms
      type: http                      # POST (or GET) the arguments as JSON (query string for GET)
      url: https://weather.example/api/current
      method: POST                    # POST (default) | GET
      headers: {X-Api-Key: "${WEATHER_KEY}"}   # ${VAR} in url/headers: read from the env at load
      timeout_s: 10
    # handler: {type: python, entry_point: "package.module:function"}
    platforms: [telegram]             # optional tool permissions (runtime.session.tool_policy)
    scopes: [private, group]
    required_any_role: [master]
    ---
    Markdown body: appended to the description the model sees (usage notes).

Handlers:

* ``http``: the arguments (schema property names, optional ones left out when not sent) are sent
  as a JSON body (``POST``) or a query string (``GET``); a 2xx response's text is the tool result
  (JSON is pretty-printed compactly); any other status raises ``HTTP <status>: <body[:500]>``,
  which the loop returns to the model as an error result.
* ``python``: ``module:function`` imported at load time; called as ``function(args: dict)``
  (sync or async) and returns ``str``, a JSON-able value, or an
  :class:`~runtime.agent.tools.AgentToolResult`.

Loading is all-or-nothing and happens at start-up: any problem (YAML, missing key, unknown key,
bad handler, unsupported schema feature, duplicate name) raises :class:`ToolMdError` naming the
file (and, for schemas, the JSON pointer and the feature) — a hard fail
(docs/decisions.md#tool-md-hard-fail).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from runtime.agent.schema_model import SchemaFeatureError, ToolArgs, dump_params, schema_to_model
from runtime.agent.tools import AgentTool, AgentToolResult, ToolUpdateFn
from runtime.config.entry_points import import_entry_point
from runtime.config.tool_permissions import ToolPermissions
from runtime.llm.abort import AbortSignal
from runtime.session.tool_policy import set_permissions

__all__ = ["TOOL_NAME_RE", "ToolMdError", "ToolMdSpec", "load_tool_dir", "load_tool_md", "parse_tool_md"]

TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""Tool names every provider accepts."""

_KEYS = {"name", "description", "parameters", "handler", "platforms", "scopes", "required_any_role"}
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ToolMdError(ValueError):
    """A ``*.tool.md`` file cannot be loaded; the message starts with the file path.

    Attributes:
        file: The file.
        pointer: JSON pointer inside the frontmatter (``""`` when not about one place).
        feature: The unsupported schema feature, when that is the cause.
    """

    def __init__(self, file: str, message: str, *, pointer: str = "", feature: str = "") -> None:
        self.file, self.pointer, self.feature = file, pointer, feature
        super().__init__(message if message.startswith(file) else f"{file}: {message}")


@dataclass
class ToolMdSpec:
    """A parsed ``*.tool.md`` file (before it becomes an :class:`AgentTool`).

    Attributes:
        file: Source path.
        name, description: What the model sees.
        parameters: The pydantic model converted from the JSON Schema.
        handler: The frontmatter ``handler`` mapping.
        permissions: Tool permissions, if any key was given.
    """

    file: str
    name: str
    description: str
    parameters: type[ToolArgs]
    handler: dict[str, Any]
    permissions: ToolPermissions | None


def _split(file: str, text: str) -> tuple[dict[str, Any], str]:
    m = re.match(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)(.*)\Z", text, re.S)
    if m is None:
        raise ToolMdError(
            file, "no YAML frontmatter (the file must start with a '---' line and close it with '---')"
        )
    try:
        data = yaml.safe_load(m.group(1))
    except yaml.YAMLError as exc:
        raise ToolMdError(file, f"frontmatter is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ToolMdError(file, "frontmatter must be a mapping")
    return data, m.group(2).strip()


def parse_tool_md(path: str | os.PathLike[str]) -> ToolMdSpec:
    """Parse and validate one ``*.tool.md`` file (the handler is checked, not yet bound).

    Raises:
        ToolMdError: see the module docstring.
    """
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ToolMdError(file, f"cannot read: {exc}") from None
    data, body = _split(file, text)
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ToolMdError(file, f"unknown frontmatter key(s) {unknown}; allowed: {sorted(_KEYS)}")
    name = data.get("name")
    if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
        raise ToolMdError(file, f"name: {name!r} must match [a-zA-Z0-9_-]{{1,64}}")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise ToolMdError(file, "description: expected a string")
    description = "\n\n".join(p for p in (description.strip(), body) if p)
    if not description:
        raise ToolMdError(file, "description: missing (give `description` or a Markdown body)")
    schema = data.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(schema, dict):
        raise ToolMdError(file, "parameters: expected a JSON Schema object", pointer="/parameters")
    try:
        params = schema_to_model(schema, name=f"{name}_args", source=file, pointer="/parameters")
    except SchemaFeatureError as exc:
        raise ToolMdError(file, str(exc), pointer=exc.pointer, feature=exc.feature) from None
    handler = data.get("handler")
    _check_handler(file, handler)
    try:
        perms = (
            ToolPermissions.from_mapping(data)
            if any(k in data for k in ("platforms", "scopes", "required_any_role"))
            else None
        )
    except ValueError as exc:
        raise ToolMdError(file, str(exc)) from None
    assert isinstance(handler, dict)
    return ToolMdSpec(file, name, description, params, handler, perms)


def _check_handler(file: str, handler: Any) -> None:
    if not isinstance(handler, dict) or handler.get("type") not in ("http", "python"):
        raise ToolMdError(
            file, "handler: expected {type: http, url: ...} or {type: python, entry_point: module:function}"
        )
    allowed = {"http": {"type", "url", "method", "headers", "timeout_s"}, "python": {"type", "entry_point"}}[
        handler["type"]
    ]
    unknown = sorted(set(handler) - allowed)
    if unknown:
        raise ToolMdError(
            file, f"handler: unknown key(s) {unknown} for type {handler['type']}; allowed: {sorted(allowed)}"
        )
    if handler["type"] == "http":
        url = handler.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://", "${")):
            raise ToolMdError(file, f"handler.url: expected an http(s) URL, got {url!r}")
        if str(handler.get("method", "POST")).upper() not in ("POST", "GET"):
            raise ToolMdError(file, "handler.method: POST or GET")
        if not isinstance(handler.get("headers", {}), dict):
            raise ToolMdError(file, "handler.headers: expected a mapping")
    elif not isinstance(handler.get("entry_point"), str) or ":" not in handler["entry_point"]:
        raise ToolMdError(file, "handler.entry_point: expected 'module:function'")


def _env(file: str, value: str) -> str:
    def sub(m: re.Match[str]) -> str:
        v = os.environ.get(m.group(1))
        if v is None:
            raise ToolMdError(file, f"handler: environment variable {m.group(1)} is not set")
        return v

    return _ENV.sub(sub, value)


def _result(value: Any) -> AgentToolResult | str:
    if isinstance(value, AgentToolResult | str):
        return value
    return AgentToolResult.text(json.dumps(value, ensure_ascii=False), details=value)


def _http_execute(spec: ToolMdSpec) -> Callable[..., Any]:
    h = spec.handler
    url, method = _env(spec.file, h["url"]), str(h.get("method", "POST")).upper()
    headers = {k: _env(spec.file, str(v)) for k, v in (h.get("headers") or {}).items()}
    timeout = float(h.get("timeout_s", 10))

    async def execute(call_id: str, params: Any, signal: AbortSignal | None, on_update: ToolUpdateFn) -> Any:
        args = dump_params(params)
        async with httpx.AsyncClient(timeout=timeout) as client:
            if method == "GET":
                q = {k: v if isinstance(v, str) else json.dumps(v) for k, v in args.items()}
                resp = await client.get(url, params=q, headers=headers)
            else:
                resp = await client.post(url, json=args, headers=headers)
        if not 200 <= resp.status_code < 300:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:500]}")
        if "json" in resp.headers.get("content-type", ""):
            return _result(resp.json())
        return resp.text

    return execute


def _python_execute(spec: ToolMdSpec) -> Callable[..., Any]:
    try:
        fn = import_entry_point(spec.handler["entry_point"])
    except (ImportError, AttributeError, ValueError) as exc:
        raise ToolMdError(
            spec.file, f"handler.entry_point {spec.handler['entry_point']!r} cannot be imported: {exc}"
        ) from None
    if not callable(fn):
        raise ToolMdError(spec.file, f"handler.entry_point {spec.handler['entry_point']!r} is not callable")

    async def execute(call_id: str, params: Any, signal: AbortSignal | None, on_update: ToolUpdateFn) -> Any:
        if inspect.iscoroutinefunction(fn):
            value = fn(dump_params(params))
        else:  # a plain function may block: off the loop every session of the host shares
            value = await asyncio.to_thread(fn, dump_params(params))  # docs/decisions.md#session-hosts
        if inspect.isawaitable(value):
            value = await value
        return _result(value)

    return execute


def load_tool_md(path: str | os.PathLike[str]) -> AgentTool[Any]:
    """Load one ``*.tool.md`` file as an :class:`AgentTool` (permissions attached, if declared).

    Raises:
        ToolMdError: see the module docstring (also: an ``${ENV}`` header variable is unset, or a
            Python entry point cannot be imported).
    """
    spec = parse_tool_md(path)
    execute = _http_execute(spec) if spec.handler["type"] == "http" else _python_execute(spec)
    tool: AgentTool[Any] = AgentTool(spec.name, spec.description, spec.parameters, execute)
    set_permissions(tool, spec.permissions)
    return tool


def load_tool_dir(folder: str | os.PathLike[str]) -> list[AgentTool[Any]]:
    """Load every ``*.tool.md`` in ``folder`` (not recursive), sorted by file name.

    Raises:
        ToolMdError: the folder does not exist, any file fails, or two files declare one name.
    """
    root = Path(folder)
    if not root.is_dir():
        raise ToolMdError(str(root), "tools folder does not exist")
    tools: list[AgentTool[Any]] = []
    seen: dict[str, str] = {}
    for file in sorted(root.glob("*.tool.md")):
        tool = load_tool_md(file)
        if tool.name in seen:
            raise ToolMdError(str(file), f"tool name {tool.name!r} is already declared by {seen[tool.name]}")
        seen[tool.name] = str(file)
        tools.append(tool)
    return tools

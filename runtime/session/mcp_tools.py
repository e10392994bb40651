"""MCP tools through the official ``mcp`` Python SDK
(docs/decisions.md#mcp-lazy-connect).

Servers come from ``ai.mcp_servers`` (:class:`runtime.config.McpServerConfig`): a ``command``
started as a stdio subprocess, or a streamable HTTP ``url``. Per server, :class:`McpServer`

* connects **lazily**: nothing happens at start-up; the first :meth:`McpServer.tools` call (made
  when a turn prepares its tools) connects, lists the tools and caches them; later turns reuse the
  connection and the list (``sessionray_mcp_connects_total{outcome}`` counts each attempt);
* owns the SDK client in one background task (the SDK's context managers must be entered and
  left in the same task), so turns of any task may call tools;
* **reconnects after failure**: a call that fails at the transport level (server crashed,
  connection closed, timeout) closes the connection and returns a tool error; the next call or
  turn connects again (a new subprocess for stdio). The failed call itself is never re-sent: a
  tool may have side effects;
* a server that **fails to start** logs one clear line per failure streak
  (``MCP server 'x' is unavailable: ...``) and gives the model one stand-in tool ``<prefix>unavailable``
  — or the tools it listed before — whose calls return that error as a tool error; the session lives on.

Each MCP tool becomes an :class:`~runtime.agent.tools.AgentTool` named ``<prefix><tool name>``
(``tool_prefix``, default ``<server name>_``) whose parameters are its ``inputSchema`` converted
by :func:`runtime.agent.schema_model.schema_to_model` (the same subset as ``*.tool.md``). A tool whose
schema uses an unsupported feature is left out, with a log line naming the feature (tools are
discovered at run time, so this cannot stop start-up). The server's ``platforms`` / ``scopes`` /
``required_any_role`` become the tool permissions of each of its tools. Results: text blocks →
text, image blocks → images, other blocks → their JSON; ``structuredContent`` → ``details``;
``isError`` → a tool error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from runtime import metrics
from runtime.agent.schema_model import SchemaFeatureError, dump_params, schema_to_model
from runtime.agent.tools import AgentTool, AgentToolResult, ToolUpdateFn
from runtime.config.tool_permissions import ToolPermissions
from runtime.llm.abort import AbortSignal
from runtime.llm.types import ImageContent, TextContent
from runtime.session.tool_policy import set_permissions

__all__ = ["McpServer", "McpToolset", "McpUnavailableError"]

log = logging.getLogger("runtime.session.mcp_tools")


class McpUnavailableError(RuntimeError):
    """The server cannot be reached; the text is what the model reads as the tool error."""


class McpServer:
    """One configured MCP server: lazy connection, cached tool list, reconnect after failure.

    Args:
        name: The key under ``ai.mcp_servers``.
        config: Its :class:`runtime.config.McpServerConfig` (or any object with the same fields).

    Use on one event loop. :meth:`close` ends the connection (and a stdio subprocess).
    """

    def __init__(self, name: str, config: Any) -> None:
        self.name = name
        self.config = config
        self.prefix: str = config.tool_prefix if config.tool_prefix is not None else f"{name}_"
        keys = ("platforms", "scopes", "required_any_role")
        limits = {k: getattr(config, k, None) for k in keys}
        self.permissions = (
            ToolPermissions.from_mapping(limits) if any(v is not None for v in limits.values()) else None
        )
        self.connects = 0
        """Successful connections so far."""
        self._client: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock = asyncio.Lock()
        self._tools: list[AgentTool[Any]] | None = None
        self._last_error: str | None = None

    @property
    def connected(self) -> bool:
        """Whether a live connection is open now."""
        return self._client is not None and self._owner is not None and not self._owner.done()

    # ------------------------------------------------------------------ connection
    def _target(self) -> Any:
        if self.config.url is not None:
            return self.config.url
        from mcp.client.stdio import StdioServerParameters

        return StdioServerParameters(
            command=self.config.command, args=list(self.config.args), env=dict(self.config.env) or None,
            cwd=self.config.cwd,
        )  # fmt: skip

    async def _own(self, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        from mcp import Client

        try:
            async with Client(self._target(), read_timeout_seconds=self.config.timeout_s) as client:
                ready.set_result(client)
                await stop.wait()
        except BaseException as exc:  # the SDK raises ExceptionGroups from its task groups
            if not ready.done():
                ready.set_exception(McpUnavailableError(_describe(exc)))
            elif not isinstance(exc, asyncio.CancelledError):
                log.debug("MCP server %r connection ended: %s", self.name, _describe(exc))

    async def _connect(self) -> Any:
        if self.connected:
            return self._client
        await self._drop()
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[Any] = loop.create_future()
        self._stop = asyncio.Event()
        self._owner = asyncio.create_task(self._own(ready, self._stop), name=f"mcp-{self.name}")
        try:
            self._client = await asyncio.wait_for(asyncio.shield(ready), self.config.timeout_s)
        except (McpUnavailableError, TimeoutError) as exc:
            await self._drop()
            metrics.MCP_CONNECTS.inc(outcome="failed")
            text = (
                str(exc)
                if isinstance(exc, McpUnavailableError)
                else f"no answer within {self.config.timeout_s} s"
            )
            raise McpUnavailableError(f"MCP server {self.name!r} is unavailable: {text}") from None
        self.connects += 1
        metrics.MCP_CONNECTS.inc(outcome="ok")
        return self._client

    async def _drop(self) -> None:
        owner, stop = self._owner, self._stop
        self._client = self._owner = self._stop = None
        if owner is None:
            return
        if stop is not None:
            stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(owner), 5.0)
        except BaseException:  # a wedged transport: cancel it
            owner.cancel()

    async def close(self) -> None:
        """Close the connection (ends a stdio subprocess); the next use reconnects."""
        async with self._lock:
            await self._drop()

    # ------------------------------------------------------------------ tools
    async def tools(self) -> list[AgentTool[Any]]:
        """The server's tools as ``AgentTool`` s; connects on first use (see the module docstring).

        Never raises for an unreachable server: returns the tools listed before (their calls will
        reconnect or fail as tool errors) or the stand-in ``<prefix>unavailable`` tool.
        """
        async with self._lock:
            if self._tools is not None and self._client is not None:
                return list(self._tools)
            try:
                client = await self._connect()
                listed = await asyncio.wait_for(client.list_tools(), self.config.timeout_s)
            except Exception as exc:
                await self._drop()
                self._report(exc)
                return list(self._tools) if self._tools is not None else [self._stand_in()]
            self._last_error = None
            self._tools = [t for t in (self._convert(tool) for tool in listed.tools) if t is not None]
            return list(self._tools)

    def _report(self, exc: BaseException) -> None:
        text = (
            str(exc)
            if isinstance(exc, McpUnavailableError)
            else f"MCP server {self.name!r} failed: {_describe(exc)}"
        )
        if text != self._last_error:
            log.error("%s", text)  # one clear line per failure streak
        self._last_error = text

    def _stand_in(self) -> AgentTool[Any]:
        from runtime.agent.schema_model import schema_to_model as convert

        error = self._last_error or f"MCP server {self.name!r} is unavailable"

        async def execute(
            call_id: str, params: Any, signal: AbortSignal | None, on_update: ToolUpdateFn
        ) -> Any:
            await self.tools()  # try to reconnect; the model sees the real tools next turn
            raise McpUnavailableError(
                self._last_error or f"MCP server {self.name!r} reconnected; retry next turn"
            )

        desc = f"The tools of the MCP server {self.name!r} are unavailable right now ({error})."
        params = convert({"type": "object", "properties": {}}, name=f"{self.name}_unavailable")
        tool = AgentTool(_tool_name(f"{self.prefix}unavailable"), desc, params, execute)
        return set_permissions(tool, self.permissions)

    def _convert(self, tool: Any) -> AgentTool[Any] | None:
        schema = (
            getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {"type": "object"}
        )
        name = _tool_name(f"{self.prefix}{tool.name}")
        try:
            params = schema_to_model(schema, name=f"{name}_args", source=f"mcp:{self.name}/{tool.name}")
        except SchemaFeatureError as exc:
            log.error("MCP tool %s/%s left out: %s", self.name, tool.name, exc)
            return None
        remote = tool.name

        async def execute(
            call_id: str, args: Any, signal: AbortSignal | None, on_update: ToolUpdateFn
        ) -> Any:
            return await self.call(remote, dump_params(args))

        agent_tool = AgentTool(name, tool.description or f"MCP tool {remote} of {self.name}", params, execute)
        return set_permissions(agent_tool, self.permissions)

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> AgentToolResult:
        """Call ``tool`` with ``arguments`` (reconnecting first when needed).

        Raises:
            McpUnavailableError: the server cannot be reached or failed during the call (the
                connection is dropped; the next use reconnects). The call is not re-sent.
            RuntimeError: the tool reported an error (``isError``); its text is the message.
        """
        async with self._lock:
            try:
                client = await self._connect()
            except McpUnavailableError as exc:
                self._report(exc)
                raise
        try:
            result = await asyncio.wait_for(client.call_tool(tool, dict(arguments)), self.config.timeout_s)
        except Exception as exc:
            async with self._lock:
                if self._client is client:
                    await self._drop()
            text = (
                f"MCP server {self.name!r} failed during {tool}: {_describe(exc)}; "
                "it reconnects on the next call"
            )
            log.error("%s", text)
            raise McpUnavailableError(text) from None
        blocks = [_block(b) for b in result.content]
        if result.is_error:
            raise RuntimeError(
                "".join(b.text for b in blocks if isinstance(b, TextContent)) or f"{tool} failed"
            )
        return AgentToolResult(content=blocks, details=result.structured_content)


def _block(b: Any) -> TextContent | ImageContent:
    kind = getattr(b, "type", "")
    if kind == "text":
        return TextContent(text=b.text)
    if kind == "image":
        return ImageContent(data=b.data, mime_type=getattr(b, "mime_type", None) or b.mimeType)
    dump = b.model_dump(mode="json", exclude_none=True) if hasattr(b, "model_dump") else str(b)
    return TextContent(text=json.dumps(dump, ensure_ascii=False))


def _tool_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


class McpToolset:
    """All servers of ``ai.mcp_servers`` for one live session (connections reused across turns).

    Args:
        servers: ``name → McpServerConfig``.
    """

    def __init__(self, servers: Mapping[str, Any]) -> None:
        self.servers = [McpServer(name, cfg) for name, cfg in servers.items()]

    async def tools(self) -> list[AgentTool[Any]]:
        """Every server's tools, servers in config order (connected in parallel on first use)."""
        lists = await asyncio.gather(*(s.tools() for s in self.servers))
        return [t for tools in lists for t in tools]

    async def close(self) -> None:
        """Close every connection."""
        await asyncio.gather(*(s.close() for s in self.servers), return_exceptions=True)

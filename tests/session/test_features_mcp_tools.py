"""MCP tools over stdio and streamable HTTP with a small server written with the same SDK
(docs/decisions.md#mcp-lazy-connect): list, call, tool errors, crash mid-session + reconnect, lazy
connect counted once, a server that fails to start."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from providers.faux import faux_assistant_message, faux_text, faux_tool_call, register_faux_provider
from runtime.agent.config import AgentContext, AgentLoopConfig
from runtime.agent.events import AgentEndEvent
from runtime.agent.loop import agent_loop
from runtime.agent.tools import AgentToolResult, validate_tool_call
from runtime.config import McpServerConfig
from runtime.config.tool_permissions import ToolPermissions
from runtime.llm.types import TextContent, ToolCall, ToolResultMessage, UserMessage
from runtime.session.mcp_tools import McpServer, McpToolset, McpUnavailableError
from runtime.session.tool_policy import get_permissions

SERVER = str(Path(__file__).with_name("mcp_server.py"))


def stdio_config(**kw: Any) -> McpServerConfig:
    return McpServerConfig(command=sys.executable, args=[SERVER, "stdio"], timeout_s=60, **kw)


async def call(tools: list[Any], name: str, args: dict[str, Any]) -> AgentToolResult:
    tool = next(t for t in tools if t.name == name)
    params = validate_tool_call([tool], ToolCall(id="c", name=name, arguments=args))
    result = await tool.execute("c", params, None, lambda _r: None)
    assert isinstance(result, AgentToolResult)
    return result


def text(result: AgentToolResult) -> str:
    return "".join(b.text for b in result.content if isinstance(b, TextContent))


async def test_stdio_list_call_error_crash_and_reconnect(metric: Callable[..., float]) -> None:
    server = McpServer("t", stdio_config())
    assert server.connects == 0  # lazy: nothing started yet
    try:
        tools = await server.tools()
        assert [t.name for t in tools] == ["t_add", "t_echo", "t_whoami", "t_fail", "t_crash"]
        assert tools[0].to_tool().parameters == {
            "type": "object",
            "properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
            "required": ["a", "b"],
            "title": "addArguments",
        }
        result = await call(tools, "t_add", {"a": 2, "b": "40"})
        assert (text(result), result.details) == ("42", {"result": 42})
        with pytest.raises(RuntimeError) as err:
            await call(tools, "t_fail", {"text": "boom"})
        assert str(err.value) == "Error executing tool fail"
        pid_before = text(await call(tools, "t_whoami", {}))
        assert await server.tools() is not tools and [t.name for t in await server.tools()] == [
            t.name for t in tools
        ]
        assert (server.connects, metric("sessionray_mcp_connects_total", outcome="ok")) == (1, 1.0)
        # the server crashes mid-session: that call is a tool error, the next one reconnects
        with pytest.raises(McpUnavailableError) as crash:
            await call(tools, "t_crash", {})
        assert str(crash.value).startswith("MCP server 't' failed during crash: ")
        pid_after = text(await call(tools, "t_whoami", {}))
        assert pid_after != pid_before
        assert (server.connects, metric("sessionray_mcp_connects_total", outcome="ok")) == (2, 2.0)
    finally:
        await server.close()


async def test_agent_turns_reuse_one_lazy_connection(metric: Callable[..., float]) -> None:
    toolset = McpToolset({"calc": stdio_config(tool_prefix="")})
    faux = register_faux_provider(
        [
            faux_assistant_message([faux_tool_call("add", {"a": 1, "b": 2}, id="c1")]),
            faux_assistant_message([faux_text("3")]),
            faux_assistant_message([faux_tool_call("echo", {"text": "again"}, id="c2")]),
            faux_assistant_message([faux_text("again")]),
        ],
        provider="mcp-faux",
    )
    try:
        results = []
        for prompt in ("1+2?", "echo"):
            tools = await toolset.tools()  # what a turn does before its loop
            ctx = AgentContext(tools=tools)
            events = [
                e
                async for e in agent_loop(
                    [UserMessage(content=prompt)], ctx, AgentLoopConfig(model=faux.get_model())
                )
            ]
            end = events[-1]
            assert isinstance(end, AgentEndEvent)
            results += [
                (m.tool_name, m.is_error, "".join(b.text for b in m.content if isinstance(b, TextContent)))
                for m in end.messages
                if isinstance(m, ToolResultMessage)
            ]
        assert results == [("add", False, "3"), ("echo", False, "again")]
        assert [t.name for t in faux.calls[0].context.tools or []] == [
            "add",
            "echo",
            "whoami",
            "fail",
            "crash",
        ]
        assert metric("sessionray_mcp_connects_total", outcome="ok") == 1.0
    finally:
        await toolset.close()


async def test_server_that_fails_to_start_gives_tool_errors_and_one_log_line(
    caplog: pytest.LogCaptureFixture, metric: Callable[..., float]
) -> None:
    server = McpServer(
        "broken",
        McpServerConfig(
            command=sys.executable,
            args=["-c", "import sys; sys.exit(2)"],
            timeout_s=60,
            required_any_role=["master"],
        ),
    )
    caplog.set_level(logging.ERROR, logger="runtime.session.mcp_tools")
    try:
        tools = await server.tools()
        assert [t.name for t in tools] == ["broken_unavailable"]
        assert get_permissions(tools[0]) == ToolPermissions(required_any_role=frozenset({"master"}))
        assert tools[0].description.startswith(
            "The tools of the MCP server 'broken' are unavailable right now "
            "(MCP server 'broken' is unavailable: "
        )
        with pytest.raises(McpUnavailableError) as err:
            await call(tools, "broken_unavailable", {})
        assert str(err.value).startswith("MCP server 'broken' is unavailable: ")
        assert [t.name for t in await server.tools()] == ["broken_unavailable"]
        lines = [r.getMessage() for r in caplog.records if r.name == "runtime.session.mcp_tools"]
        assert len(lines) == 1 and lines[0].startswith("MCP server 'broken' is unavailable: ")
        assert metric("sessionray_mcp_connects_total", outcome="failed") == 3.0
        assert metric("sessionray_mcp_connects_total", outcome="ok") == 0.0
    finally:
        await server.close()


# ------------------------------------------------------------------ streamable HTTP


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_http(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, SERVER, "http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120  # a loaded CI machine imports the SDK slowly
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/mcp", timeout=1)
            return proc
        except httpx.TransportError:
            if proc.poll() is not None:
                raise RuntimeError("MCP HTTP test server exited") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("MCP HTTP test server did not start")


@pytest.fixture
def http_port() -> Iterator[int]:
    yield free_port()


async def test_http_list_call_crash_and_reconnect(http_port: int, metric: Callable[..., float]) -> None:
    proc = await asyncio.to_thread(start_http, http_port)
    server = McpServer("web", McpServerConfig(url=f"http://127.0.0.1:{http_port}/mcp", timeout_s=60))
    try:
        tools = await server.tools()
        assert [t.name for t in tools] == ["web_add", "web_echo", "web_whoami", "web_fail", "web_crash"]
        assert text(await call(tools, "web_echo", {"text": "über"})) == "über"
        pid1 = text(await call(tools, "web_whoami", {}))
        assert pid1 == str(proc.pid)
        proc.kill()  # the server dies mid-session
        proc.wait()
        with pytest.raises(McpUnavailableError):
            await call(tools, "web_add", {"a": 1, "b": 1})
        proc = await asyncio.to_thread(start_http, http_port)
        assert text(await call(tools, "web_whoami", {})) == str(proc.pid)
        assert (server.connects, metric("sessionray_mcp_connects_total", outcome="ok")) == (2, 2.0)
    finally:
        await server.close()
        proc.kill()
        proc.wait()

"""A small MCP server for the MCP tool tests, written with the official SDK.

Run: ``python tests/session/mcp_server.py stdio`` or ``python tests/session/mcp_server.py http PORT``.
Tools: ``add(a, b)``, ``echo(text)``, ``whoami()`` (the server process id), ``fail(text)`` (a tool
error), ``crash()`` (the process exits at once: a crash mid-session).
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("sessionray-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


@server.tool()
def whoami() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
def fail(text: str) -> str:
    """Always fails with ``text``."""
    raise ValueError(text)


@server.tool()
def crash() -> str:
    """Exit the server process immediately."""
    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))

"""The example bot's MCP server: a tiny FAQ about sessionray, over stdio, written with the official
``mcp`` SDK.

The bot starts it, for each live session, as a subprocess of the session's host on the first turn
that prepares its tools (``ai.mcp_servers.faq`` in ``sessionray.yaml``; lazy connect). The model
sees its tools as ``faq_search`` and ``faq_topics`` (prefix ``<server name>_``).

Try it alone: ``.venv/bin/python examples/bot/faq_server.py`` speaks MCP on stdin/stdout.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("sessionray-example-faq")

FAQ: dict[str, str] = {
    "steer": (
        "Only a master of the bot may steer a running turn: /steer <text> in the chat, or the "
        "console's Steer button. Anyone else is refused."
    ),
    "new": (
        "/new archives the conversation and starts a new epoch; the archived messages stay in SQL. "
        "In a group only masters may use it."
    ),
    "vision": "A message with an image goes to the configured vision model instead of the main model.",
    "models": "/models lists the configured models with their context window and input kinds.",
}
"""Topic → answer."""


@server.tool()
def search(query: str) -> str:
    """Answer a question about the bot from its FAQ (matches topic words in the query)."""
    words = query.lower().replace("/", " ").replace("?", " ").split()
    hits = [answer for topic, answer in FAQ.items() if topic in words]
    return "\n".join(hits) if hits else f"No FAQ entry matches {query!r}. Topics: {', '.join(FAQ)}."


@server.tool()
def topics() -> str:
    """The FAQ's topics, comma-separated."""
    return ", ".join(FAQ)


if __name__ == "__main__":
    server.run("stdio")

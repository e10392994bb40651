"""Python entry points used by the ``*.tool.md`` tests (``tests.session.handlers:<name>``)."""

from __future__ import annotations

from typing import Any


def add(args: dict[str, Any]) -> dict[str, Any]:
    """Sum ``a`` and ``b``."""
    return {"sum": args["a"] + args["b"]}


async def shout(args: dict[str, Any]) -> str:
    """Upper-case ``text`` (async handler)."""
    return str(args["text"]).upper()


NOT_CALLABLE = 3


# --------------------------------------------------------------------------- ai.python_tools


def _echo_tool(name: str) -> Any:
    from pydantic import BaseModel

    from runtime.agent.tools import AgentTool

    class EchoArgs(BaseModel):
        text: str

    async def run(call_id: str, params: EchoArgs, signal: Any, on_update: Any) -> str:
        return params.text

    return AgentTool(name, "Echo the text back.", EchoArgs, run)


ONE_TOOL = _echo_tool("echo_one")
"""``tests.session.handlers:ONE_TOOL``: a single ``AgentTool``."""


def make_tools() -> list[Any]:
    """``tests.session.handlers:make_tools``: a function returning a list of tools."""
    return [_echo_tool("echo_two"), _echo_tool("echo_three")]


TWICE = [_echo_tool("echo_one")]
"""A list declaring a name ``ONE_TOOL`` already has."""


def broken_tools() -> list[Any]:
    """A tool function that fails."""
    raise RuntimeError("no tools today")

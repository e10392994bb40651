"""``sessionray chat``: talk to an :class:`~runtime.agent.agent.Agent` in the terminal.

Reads one line per prompt from stdin, streams the reply's text to stdout as it arrives, and
shows tool calls as ``[tool name {args}]`` / ``[tool name -> result]`` lines. Commands:
``/quit`` or ``/exit`` (or Ctrl-D) end the chat with exit code 0, ``/reset`` forgets the
conversation, ``/help`` lists the commands. Ctrl-C while a reply streams aborts that reply.

The model is ``ai.default_model`` from the configuration (``--config``, default
``sessionray.yaml`` when present) or, when none is configured or ``--builtin`` is given, the
built-in offline model with its demo tools (``clock``, ``echo``). The event loop is uvloop.

This module is an entry point (a composition root): it is the one place in ``runtime/`` that
imports ``providers`` (lazily, inside :func:`main`), to register the apis and build the built-in
model; the chat loop itself (:func:`run_chat`) only sees an :class:`Agent`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal as os_signal
import sys
from typing import Any, TextIO

from runtime.agent.agent import Agent
from runtime.agent.events import AgentEvent
from runtime.llm.abort import AbortSignal
from runtime.llm.types import AssistantMessage, TextContent, ToolResultMessage

__all__ = ["build_parser", "main", "run_chat", "tool_call_line", "tool_result_line"]

HELP = "commands: /quit or /exit (or Ctrl-D) to leave, /reset to forget the conversation, /help"


def build_parser() -> argparse.ArgumentParser:
    """Return the ``sessionray chat`` argument parser."""
    p = argparse.ArgumentParser(
        prog="sessionray chat",
        description="Talk to an agent in this terminal. Without a configured ai.default_model it uses "
        "the built-in offline model, which is NOT an LLM: it echoes your text and calls the demo "
        "tools clock/echo when you mention the time or a tool.",
        epilog=HELP,
    )
    p.add_argument(
        "--config", metavar="PATH", help="configuration file (default: ./sessionray.yaml if present)"
    )
    p.add_argument(
        "--builtin", action="store_true", help="use the built-in offline model even if one is configured"
    )
    p.add_argument(
        "--system-prompt", default="You are a helpful assistant.", help="system prompt for the agent"
    )
    return p


def tool_call_line(name: str, args: Any) -> str:
    """How a terminal shows a tool call starting: ``[tool NAME {json args}]`` (the standalone chat
    and the console client, :mod:`actors.cli.console_client`)."""
    return f"[tool {name} {json.dumps(args, ensure_ascii=False)}]"


def tool_result_line(name: str, text: str, *, is_error: bool = False) -> str:
    """How a terminal shows a tool call's end: ``[tool NAME -> TEXT]`` (``error: `` before
    ``TEXT`` when it failed; ``[tool NAME done]`` when there is no text)."""
    shown = ("error: " if is_error else "") + text
    return f"[tool {name} -> {shown}]" if shown else f"[tool {name} done]"


class _Printer:
    """Renders agent events to a text stream."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.open_line = False

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def _end_line(self) -> None:
        if self.open_line:
            self._write("\n")
            self.open_line = False

    def __call__(self, event: AgentEvent, signal: AbortSignal) -> None:
        if event.type == "message_update":
            inner = event.assistant_message_event
            if inner.type == "text_delta":
                if not self.open_line:
                    self._write("bot> ")
                    self.open_line = True
                self._write(inner.delta)
        elif event.type == "message_end" and isinstance(event.message, AssistantMessage):
            self._end_line()
            msg = event.message
            if msg.stop_reason in ("error", "aborted"):
                self._write(f"[{msg.stop_reason}: {msg.error_message or ''}]\n")
        elif event.type == "tool_execution_start":
            self._end_line()
            self._write(tool_call_line(event.tool_name, event.args) + "\n")
        elif event.type == "tool_execution_end":
            self._write(_result_line(event.tool_name, event.result) + "\n")


def _result_line(name: str, result: ToolResultMessage) -> str:
    text = "".join(b.text for b in result.content if isinstance(b, TextContent))
    return tool_result_line(name, text, is_error=result.is_error)


async def run_chat(agent: Agent, stdin: TextIO, stdout: TextIO, *, interactive: bool = False) -> int:
    """Run the read–reply loop until ``/quit`` or end of input; returns the exit code (0).

    Args:
        agent: The agent to talk to (its listeners get the printer added).
        stdin: Line source (read in a worker thread so the event loop keeps streaming).
        stdout: Where replies go.
        interactive: Print a ``you> `` prompt before each line (when stdin is a terminal).
    """
    agent.subscribe(_Printer(stdout))
    loop = asyncio.get_running_loop()
    while True:
        if interactive:
            stdout.write("you> ")
            stdout.flush()
        line = await loop.run_in_executor(None, stdin.readline)
        if not line:  # Ctrl-D / end of input
            if interactive:
                stdout.write("\n")
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return 0
        if text == "/help":
            stdout.write(HELP + "\n")
            continue
        if text == "/reset":
            agent.reset()
            stdout.write("[conversation cleared]\n")
            continue
        await _prompt(agent, text, loop)


async def _prompt(agent: Agent, text: str, loop: asyncio.AbstractEventLoop) -> None:
    installed = False
    try:
        loop.add_signal_handler(os_signal.SIGINT, agent.abort)  # Ctrl-C aborts the reply only
        installed = True
    except (NotImplementedError, RuntimeError, ValueError):
        pass
    try:
        await agent.prompt(text)
    finally:
        if installed:
            loop.remove_signal_handler(os_signal.SIGINT)


def _build_agent(args: argparse.Namespace) -> Agent:
    from actors.models.builtin import builtin_model, builtin_tools
    from actors.models.faux_script import register_configured_providers
    from actors.raylife.repo_root import ensure_repo_root_on_path
    from runtime import config as cfg_mod

    config = cfg_mod.load_config(args.config)
    ensure_repo_root_on_path()  # an `ai.providers.<alias>.script` imports here as in `serve`
    register_configured_providers(config.ai.providers)
    agent_cfg = config.ai.agent
    common: dict[str, Any] = {
        "system_prompt": args.system_prompt,
        "steering_mode": agent_cfg.steering_mode,
        "follow_up_mode": agent_cfg.follow_up_mode,
    }
    if config.ai.default_model and not args.builtin:
        model = cfg_mod.resolve_model_ref(config.ai.default_model, config)
        return Agent(model=model, get_api_key=lambda alias: cfg_mod.get_api_key(alias, config), **common)
    return Agent(model=builtin_model(), tools=builtin_tools(), **common)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sessionray chat``; returns the exit code.

    Exit codes: 0 on ``/quit``/end of input, 2 on a bad argument or configuration error
    (message on stderr), 130 on Ctrl-C while waiting for input.
    """
    import uvloop

    args = build_parser().parse_args(argv)
    try:
        agent = _build_agent(args)
    except ValueError as exc:  # ConfigError is a ValueError
        print(f"sessionray chat: {exc}", file=sys.stderr)
        return 2
    model = agent.state.model
    interactive = sys.stdin.isatty()
    if interactive and model is not None:
        print(f"sessionray chat on {model.ref()} ({model.name or model.id}). {HELP}")
    try:
        return uvloop.run(run_chat(agent, sys.stdin, sys.stdout, interactive=interactive))
    except KeyboardInterrupt:
        print()
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

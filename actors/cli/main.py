"""The ``sessionray`` command line (every command has ``--help``).

Commands are registered in :data:`COMMANDS` as ``name -> (help, module:function)`` and imported
lazily, so ``sessionray chat --help`` does not pay for importing Ray.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

__all__ = ["COMMANDS", "main", "version"]

COMMANDS: dict[str, tuple[str, str]] = {
    "chat": (
        "talk to an agent in this terminal; with --url, the console client of a running serve",
        "actors.cli.console_client:main",
    ),
    "init": (
        "write a commented sessionray.yaml into the current directory (--force overwrites)",
        "actors.cli.init_config:main",
    ),
    "check": (
        "check the configuration, environment variables, database and ports without starting anything",
        "actors.serve.preflight:check_main",
    ),
    "serve": (
        "run the runtime and its HTTP ingress (webhooks, console, admin API, metrics)",
        "actors.serve.main:main",
    ),
    "steer": (
        "steer a live session's running turn (admin API; masters only)",
        "actors.cli.control:steer_main",
    ),
    "follow-up": (
        "queue a follow-up message for a live session (admin API; masters only)",
        "actors.cli.control:follow_up_main",
    ),
    "abort": ("abort a live session's running turn (admin API)", "actors.cli.control:abort_main"),
    "archive": (
        "archive a session's active epoch, continue in a fresh one (admin API; as /new)",
        "actors.cli.control:archive_main",
    ),
    "sessions": ("list the live sessions (admin API)", "actors.cli.control:sessions_main"),
    "deliveries": (
        "list failed and uncertain replies, or retry one (admin API)",
        "actors.cli.control:deliveries_main",
    ),
    "models": (
        "list the configured models with their structured-output tier, source and age (admin API)",
        "actors.cli.control:models_main",
    ),
    "usage": (
        "who spent what: LLM calls, tokens and USD by user, chat, bot or model (admin API)",
        "actors.cli.usage:usage_main",
    ),
    "status": (
        "show hosts, live sessions, turns running and recent throughput (admin API)",
        "actors.cli.control:status_main",
    ),
    "trace": (
        "print where one message's time went: its trace's steps, or its inbox and ledger rows",
        "actors.cli.trace:main",
    ),
}


def version() -> str:
    """The installed ``sessionray`` distribution's version (package metadata), or ``unknown``
    when it runs from a source tree that was never installed."""
    try:
        return importlib.metadata.version("sessionray")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``sessionray <command> [args]``; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="sessionray",
        description="Chat-agent sessions for IM bots on Ray.",
        epilog="Run `sessionray <command> --help` for a command's options. Control commands' "
        "exit codes: 0 ok; 1 the admin API refused or failed; 2 usage error or server unreachable.",
    )
    parser.add_argument("--version", action="version", version=f"sessionray {version()}")
    sub = parser.add_subparsers(dest="command", metavar="command")
    for name, (help_text, _target) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] not in COMMANDS:  # also --help and --version
        parser.parse_args(argv or ["--help"])
        return 2
    module_name, func_name = COMMANDS[argv[0]][1].split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(argv[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())

"""What a loaded configuration needs from the machine it starts on: environment variables and
directories (the pure half of the start-up pre-flight, ``actors.serve.preflight``).

A configuration names secrets by environment-variable *name* (``bots[].access_token_env``,
``bots[].secret_env``, ``bots[].token_env``, ``ai.providers.<alias>.api_key_env``). Each one that
is named must be set and non-empty when the runtime starts: the codecs (``runtime.platforms``)
and the providers refuse an unset one, but only once Ray and the actors are up. These functions
find every such problem at once, each with the config key that asks for it
(`docs/decisions.md#ops-preflight-before-ray`).

``server.admin_token_env`` is not required: without it the admin API is disabled (the banner
of ``sessionray serve`` says so). Nor is a console bot's ``bots[].master_token_env``: without it the
console has no master (docs/decisions.md#security-console-master-proof; the banner says so too).

Usage::

    from runtime.config.requirements import directory_problems, missing_env
    for ref in missing_env(config):
        print(ref.var, "needed by", ref.key)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runtime.config.settings import Config

__all__ = ["BOT_SECRET_KEYS", "EnvRef", "directory_problems", "env_references", "missing_env"]

BOT_SECRET_KEYS = ("access_token_env", "secret_env", "token_env")
"""The keys of a ``bots:`` entry that name an environment variable holding a secret."""


@dataclass(frozen=True)
class EnvRef:
    """One environment variable the configuration needs.

    Attributes:
        key: The config key naming it, e.g. ``bots[0].secret_env`` or
            ``ai.providers.openai.api_key_env``.
        var: The variable's name, e.g. ``ONEBOT_SECRET``.
    """

    key: str
    var: str


def env_references(config: Config) -> list[EnvRef]:
    """Every environment variable ``config`` requires, in config order (bots, then providers).

    A variable named by two keys appears twice (once per key).
    """
    refs = [
        EnvRef(f"bots[{i}].{key}", var)
        for i, bot in enumerate(config.bots)
        for key in BOT_SECRET_KEYS
        if (var := getattr(bot, key))
    ]
    refs += [
        EnvRef(f"ai.providers.{alias}.api_key_env", provider.api_key_env)
        for alias, provider in config.ai.providers.items()
        if provider.api_key_env
    ]
    return refs


def missing_env(config: Config, environ: Mapping[str, str] | None = None) -> list[EnvRef]:
    """The :func:`env_references` whose variable is unset or empty (whitespace only counts as
    empty) in ``environ`` (default ``os.environ``). Values are never returned or logged."""
    env = os.environ if environ is None else environ
    return [ref for ref in env_references(config) if not env.get(ref.var, "").strip()]


def _directory_problem(path: str) -> str | None:
    p = Path(path)
    if not p.exists():
        return f"{path} does not exist"
    if not p.is_dir():
        return f"{path} is not a directory"
    if not os.access(p, os.R_OK | os.X_OK):
        return f"{path} is not readable by this user"
    return None


def directory_problems(config: Config) -> list[str]:
    """Directories the configuration names that this process cannot read.

    Checks every ``bots[].media_dir`` (already absolute: :class:`~runtime.config.BotConfig`
    resolves it when the configuration is loaded) and ``ai.tools_dir``.

    Returns:
        One line per problem, ``<config key>: <path> does not exist`` / ``is not a directory`` /
        ``is not readable by this user``; empty when all are fine.
    """
    named = [(f"bots[{i}].media_dir", bot.media_dir) for i, bot in enumerate(config.bots)]
    named.append(("ai.tools_dir", config.ai.tools_dir))
    return [f"{key}: {problem}" for key, path in named if path and (problem := _directory_problem(path))]

"""What ``sessionray serve`` tells the operator before it starts Ray: where everything is, how the
admin CLI reaches this server, and what Ray's token authentication means here (the token is
created on the first start: :mod:`actors.raylife.auth_token`).

Ray 2.60 turns token authentication on for a new local cluster and warns about it on every
start ("Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt
out ..."). ``sessionray serve`` keeps that secure default but asks for it explicitly
(:func:`quiet_ray_auth`: ``RAY_AUTH_MODE=token`` when the operator set nothing, which Ray
respects without the warning) and explains it once in the banner instead
(`docs/decisions.md#ops-ray-noise-explained-once`).
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from actors.raylife.auth_token import ensure_local_token

__all__ = [
    "RAY_AUTH_MODE_ENV",
    "admin_token_for_run",
    "banner",
    "cli_command",
    "quiet_ray_auth",
    "shown_host",
]

RAY_AUTH_MODE_ENV = "RAY_AUTH_MODE"
"""Ray's switch for token authentication (``token`` | ``disabled``)."""

DEFAULT_CONTROL_URL = "http://127.0.0.1:8000"
DEFAULT_CONTROL_TOKEN_ENV = "SESSIONRAY_ADMIN_TOKEN"
"""The ``--url`` / ``--token-env`` defaults of the admin CLI (``actors.cli.control``)."""


def shown_host(host: str) -> str:
    """The host to put in URLs a person opens: a wildcard bind address is shown as 127.0.0.1."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def quiet_ray_auth(environ: MutableMapping[str, str] | None = None) -> str:
    """Before a *local* Ray starts: ask for token authentication explicitly when the operator set
    no ``RAY_AUTH_MODE`` (Ray's default for a new local cluster, minus its start-up warning), and
    make sure the token exists (:func:`actors.raylife.auth_token.ensure_local_token`: created on the first
    start, as ``ray.init()`` would; docs/decisions.md#ops-ray-token-first-start).

    Returns:
        The banner line explaining the mode in effect and where the token is.

    Raises:
        actors.raylife.auth_token.RayTokenError: no token can be found or created.
    """
    env = os.environ if environ is None else environ
    mode = env.setdefault(RAY_AUTH_MODE_ENV, "token").lower()
    if mode == "token":
        where = ensure_local_token(env)
        return (
            f"sessionray: Ray            local; token authentication on (token: {where}; "
            "`RAY_AUTH_MODE=token ray status` uses it too)"
        )
    return f"sessionray: Ray            local; token authentication {mode} ({RAY_AUTH_MODE_ENV}={mode})"


def admin_token_for_run(config: Any, environ: MutableMapping[str, str] | None = None) -> str | None:
    """``sessionray serve --dev-admin-token`` (what ``make run`` passes): when the variable named by
    ``server.admin_token_env`` is unset, set it to a fresh random token for this process (the
    ingress and, through the environment Ray inherits, every worker) and return it.

    Returns:
        The generated token; ``None`` when the variable was already set (it is used as is) or
        ``server.admin_token_env`` is null (admin API off by configuration).
    """
    env = os.environ if environ is None else environ
    var = config.server.admin_token_env
    if not var or env.get(var):
        return None
    env[var] = secrets.token_urlsafe(24)
    return env[var]


def cli_command(environ: MutableMapping[str, str] | None = None) -> str:
    """How a shell of this user runs this installation's ``sessionray``: the bare name when
    ``PATH`` (of ``environ``, default ``os.environ``) finds this very console script, else its
    path beside the running interpreter — relative to the working directory when below it (a
    source checkout: ``.venv/bin/sessionray``), else absolute."""
    env = os.environ if environ is None else environ
    mine = Path(sys.executable).parent / "sessionray"
    if not mine.exists():
        return "sessionray"
    found = shutil.which("sessionray", path=env.get("PATH", ""))
    if found and Path(found).resolve() == mine.resolve():
        return "sessionray"
    try:
        return str(mine.relative_to(Path.cwd()))
    except ValueError:
        return str(mine)


def _control_hint(token_env: str, base: str, environ: MutableMapping[str, str]) -> str:
    """The admin CLI command line for this server (options only where they differ from defaults)."""
    opts = "" if base == DEFAULT_CONTROL_URL else f" --url {base}"
    if token_env != DEFAULT_CONTROL_TOKEN_ENV:
        opts += f" --token-env {token_env}"
    return f"{cli_command(environ)} status{opts}"


def banner(
    config: Any,
    source: str,
    host: str,
    port: int,
    metrics_port: int | None,
    *,
    generated_token: str | None = None,
    environ: MutableMapping[str, str] | None = None,
) -> list[str]:
    """The first lines ``sessionray serve`` prints: configuration source, console URL, webhook URLs,
    metrics URLs and the admin API with the command that reaches it (with ``generated_token``, the
    ``export`` line to paste into another shell). Commands are spelled as this user's shell runs
    them (:func:`cli_command`)."""
    env = os.environ if environ is None else environ
    base = f"http://{shown_host(host)}:{port}"
    lines = [f"sessionray: configuration from {source}"]
    if source == "<defaults>":
        lines.append(
            "sessionray: no sessionray.yaml: embedded defaults (local Ray, SQLite ./data/sessionray.db, "
            f"console bot, built-in model); `{cli_command(env)} init` writes a commented one"
        )
    if any(str(b.platform) == "console" for b in config.bots):
        lines.append(f"sessionray: console        {base}/console")
    for bot in config.bots:
        transport = getattr(bot, "transport", "http")
        if transport == "ws-reverse":
            ws = f"ws://{shown_host(host)}:{port}/onebot/v11/ws"
            lines.append(f"sessionray: onebot ws     {ws}  (reverse WebSocket of bot {bot.self_id})")
        elif transport == "ws-forward":
            where = f"dialing {bot.ws_url}"
            lines.append(f"sessionray: onebot ws     {where}  (forward WebSocket of bot {bot.self_id})")
        elif getattr(bot, "mode", "webhook") == "polling":
            lines.append(f"sessionray: polling        {bot.platform}/{bot.self_id} (getUpdates; no webhook)")
        else:
            lines.append(f"sessionray: webhook        {base}/webhooks/{bot.platform}/{bot.self_id}")
    lines.append(f"sessionray: metrics        {base}/metrics  (ingress)")
    if metrics_port:
        lines.append(
            f"sessionray: actor metrics  http://{shown_host(host)}:{metrics_port}/metrics  "
            "(Ray node metrics agent)"
        )
    token_env = config.server.admin_token_env
    if token_env and env.get(token_env):
        lines.append(f"sessionray: admin API      {base}/admin/ (bearer token from ${token_env})")
        if generated_token:
            lines.append(
                f"sessionray: admin token    generated for this instance (kept across a planned restart); "
                f"admin CLI in another shell: "
                f"export {token_env}={generated_token}; {_control_hint(token_env, base, env)}"
            )
        else:
            lines.append(
                f"sessionray: admin CLI      {_control_hint(token_env, base, env)}  (with ${token_env} set "
                "to the same value in that shell)"
            )
    else:
        how = (
            f"set {token_env} before starting, or start with --dev-admin-token as `make run` does"
            if token_env
            else "server.admin_token_env is null"
        )
        lines.append(f"sessionray: admin API      disabled ({how})")
    lines += _console_master_lines(config, base, generated_token, env)
    return lines


def _console_master_lines(
    config: Any, base: str, generated_token: str | None, env: MutableMapping[str, str]
) -> list[str]:
    """One line per console bot: who its masters are and the token they log in with
    (docs/decisions.md#security-console-master-proof); with a token generated for this run whose
    variable is the bot's ``master_token_env``, the console URL that fills it in."""
    lines = []
    for bot in config.bots:
        if str(bot.platform) != "console" or not bot.masters:
            continue
        names, var = ", ".join(bot.masters), getattr(bot, "master_token_env", None)
        if not var or not env.get(var):
            lines.append(
                f"sessionray: console master {names}: no master token is set, so none can act as master; "
                f"set {var or 'master_token_env'} (a name alone grants nothing)"
            )
        elif generated_token and env.get(var) == generated_token:
            lines.append(
                f"sessionray: console master {names} with the admin token as master token, e.g. open "
                f"{base}/console#master={generated_token}"
            )
        else:
            lines.append(f"sessionray: console master {names} with the master token (${var})")
    return lines

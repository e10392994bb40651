"""``sessionray init``: write a commented ``sessionray.yaml`` into the current directory.

The file runs as written (the embedded defaults spelled out: one console bot, the built-in
offline model, SQLite under ./data, the admin token variable) and carries, commented out, one
OneBot v11 bot, one Telegram bot and one provider per built-in wire protocol
(``openai-completions``, ``anthropic-messages``, ``google-generative-ai``). Lines starting with
``# `` are configuration to uncomment (delete the two characters ``# ``); lines starting with
``##`` are explanations. Uncommenting every block gives a valid configuration too (tested).

An existing file is never overwritten without ``--force``. Exit codes: 0 written; 2 the file
exists (or another usage error).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from actors.serve.banner import cli_command
from providers.common import DEFAULT_KEY_ENV
from runtime.config import DEFAULT_CONFIG_FILE, DatabaseConfig, ServerConfig

__all__ = ["config_template", "main"]

EXAMPLE_MODELS = {
    "openai-completions": ("openai", "gpt-4o-mini"),
    "anthropic-messages": ("anthropic", "claude-sonnet-4-5"),
    "google-generative-ai": ("gemini", "gemini-2.5-flash"),
}
"""api → (provider alias, an example model id) of the commented provider blocks."""


def _provider_blocks() -> str:
    out = []
    for api, (alias, model) in EXAMPLE_MODELS.items():
        out.append(
            f"#     {alias}:\n"
            f"#       api: {api}\n"
            f"#       api_key_env: {DEFAULT_KEY_ENV[api]}\n"
            f"#       models:\n"
            f"#         - id: {model}\n"
        )
    return "".join(out)


def config_template() -> str:
    """The text ``sessionray init`` writes (defaults taken from the configuration model)."""
    server, database = ServerConfig(), DatabaseConfig()
    default_alias, default_model = EXAMPLE_MODELS["openai-completions"]
    return f"""\
## sessionray.yaml — written by `sessionray init`. Every key is optional; this file spells out
## the embedded defaults. Lines starting with "# " are settings: delete those two characters to
## use one. Check the file and this machine with `sessionray check`, then start `sessionray serve`
## (or `make run` in a source checkout).

## Models. Without ai.default_model sessions use the built-in offline model (no key, no network).
## To use a provider: uncomment `ai:`, `providers:` and its block, export its key variable, and
## point default_model at "<alias>/<model id>". A local OpenAI-compatible server (vLLM, Ollama,
## llama.cpp) is an openai-completions provider with base_url, e.g. http://127.0.0.1:8001/v1 —
## not port {server.port}, where sessionray itself listens.
# ai:
#   default_model: {default_alias}/{default_model}
#   providers:
{_provider_blocks()}
## Bots. The console bot serves the web console at http://127.0.0.1:{server.port}/console.
## Secrets are never written here: each *_env key names an environment variable holding one.
bots:
  - platform: console
    self_id: console
    masters: [admin]          # acts as master with the master token: the admin token by default
    # master_token_env: CONSOLE_MASTER_TOKEN   # or a console-only master token's variable
  ## QQ through a OneBot v11 implementation (NapCat, LLOneBot, go-cqhttp) on its HTTP API:
  # - platform: onebot11
  #   self_id: "10001"
  #   api_base: http://127.0.0.1:5700
  #   access_token_env: ONEBOT_ACCESS_TOKEN
  #   secret_env: ONEBOT_SECRET
  #   masters: ["20002"]
  ## Telegram (set the bot's webhook to http(s)://<this host>/webhooks/telegram/<self_id>):
  # - platform: telegram
  #   self_id: "123456789"
  #   username: my_sessionray_bot
  #   token_env: TELEGRAM_BOT_TOKEN
  #   secret_env: TELEGRAM_WEBHOOK_SECRET
  #   masters: ["20002"]

## SQLite on one machine; on a multi-node Ray cluster use
## postgresql+psycopg://USER:PASSWORD@HOST:5432/DBNAME.
database:
  url: {database.url}

## The HTTP ingress (webhooks, console, admin API, /metrics). The admin API and the admin CLI
## (`sessionray status`, `sessions`, `steer`, ...) need the same token on both sides:
##   export {server.admin_token_env}=$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')
## before `sessionray serve` and in the shell where you run the CLI (`make run` makes one per run).
server:
  host: {server.host}
  port: {server.port}
  admin_token_env: {server.admin_token_env}

## Spend. Every LLM call is recorded (tokens, and USD from a model's `cost:` in USD per million
## tokens, e.g. `input: 0.15` and `output: 0.6` under a model above). A quota refuses a turn before
## it starts once its window is used up (never a master's); `/usage` in a chat shows what is left.
# spend:
#   quotas:
#     - scope: user          # every user: 200k tokens a day
#       window: day
#       tokens: 200000
#     - scope: global        # the whole bot: 300 USD a month
#       window: month
#       usd: 300
"""


def main(argv: list[str]) -> int:
    """``sessionray init [--force] [--path FILE]``; returns the exit code (module docstring)."""
    p = argparse.ArgumentParser(
        prog="sessionray init",
        description=f"Write a commented {DEFAULT_CONFIG_FILE} (console bot, built-in model; OneBot, "
        "Telegram and provider examples commented out).",
    )
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.add_argument(
        "--path",
        default=DEFAULT_CONFIG_FILE,
        metavar="FILE",
        help=f"where to write (default ./{DEFAULT_CONFIG_FILE})",
    )
    args = p.parse_args(argv)
    path = Path(args.path)
    if path.exists() and not args.force:
        print(f"sessionray init: {path} exists; not overwritten (use --force to replace it)", file=sys.stderr)
        return 2
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config_template(), encoding="utf-8")
    config_opt = "" if args.path == DEFAULT_CONFIG_FILE else f" --config {path}"
    print(f"sessionray init: wrote {path}")
    cli = cli_command()  # as this user's shell runs it (.venv/bin/sessionray off PATH)
    print(f"next: {cli} check{config_opt} && {cli} serve{config_opt}")
    if not config_opt:
        print("      (in a source checkout: `make run`, which reads ./sessionray.yaml)")
    return 0

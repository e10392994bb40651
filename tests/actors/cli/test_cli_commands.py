"""The ``sessionray`` CLI: every command answers ``--help`` (the installed console script), the
top-level help lists them, and argument errors are clear. (The control commands against a
running ingress are tested in test_ingress_app.py, next to the ingress they talk to.)"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(sys.executable).parent / "sessionray"

EXPECTED = {
    "serve": ["--config FILE", "--address RAY_ADDRESS", "--dev-admin-token", "exit codes: 0 fine; 2"],
    "check": ["--config FILE", "--port PORT", "--metrics-export-port", "exit codes: 0 fine; 2"],
    "init": ["--force", "--path FILE"],
    "steer": ["SESSION_KEY", "TEXT", "--as USER_ID", "--url URL"],
    "follow-up": ["SESSION_KEY", "TEXT", "--as USER_ID", "--url URL"],
    "abort": ["SESSION_KEY", "--url URL"],
    "archive": ["SESSION_KEY", "--url URL", "--json"],
    "sessions": ["--url URL"],
    "status": ["--url URL"],
    "models": ["--url URL"],
    "deliveries": ["--state {failed,uncertain,queued,pending,sent}", "--retry REPLY_ID", "--url URL"],
    "usage": ["--by {user,chat,bot,model}", "--since WHEN", "--chat SESSION_KEY", "--json"],
}


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_commands_registered() -> None:
    assert {"chat", *EXPECTED} <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(EXPECTED))
def test_every_command_has_help(command: str) -> None:
    out = run(command, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: sessionray {command}")
    for fragment in EXPECTED[command]:
        assert fragment in out.stdout, (fragment, out.stdout)


def test_top_level_help_lists_every_command() -> None:
    out = run("--help")
    assert out.returncode == 0
    for name in COMMANDS:
        assert name in out.stdout


def test_steer_without_as_is_a_usage_error() -> None:
    out = run("steer", "onebot11:1:private:2", "hi")
    assert out.returncode == 2
    assert "the following arguments are required: --as" in out.stderr


@pytest.mark.parametrize("command", sorted(set(EXPECTED) - {"serve", "check", "init"}))
def test_control_commands_document_their_exit_codes(command: str) -> None:
    out = run(command, "--help")
    assert "exit codes: 0 ok; 1 the admin API refused or failed" in " ".join(out.stdout.split())


def test_version_comes_from_the_package_metadata() -> None:
    out = run("--version")
    assert (out.returncode, out.stdout) == (0, f"sessionray {importlib.metadata.version('sessionray')}\n")


def test_chat_imports_a_configured_script_from_the_repository_like_serve(tmp_path: Path) -> None:
    # `serve` and `check` put the repository root on the import path for `ai.providers.<alias>.script`;
    # the standalone `chat`, started from another directory, must find the same script.
    config = tmp_path / "sessionray.yaml"
    config.write_text(
        "ai:\n  default_model: scripted/chat\n  providers:\n    scripted:\n      api: faux\n"
        "      script: tests.providers.helpers:shout\n      models: [{id: chat}]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(SCRIPT), "chat", "--config", str(config)], input="hello there\n",
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)  # fmt: skip
    assert (out.returncode, out.stderr) == (0, "")
    assert "bot> HELLO THERE" in out.stdout

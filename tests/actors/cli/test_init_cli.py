"""``sessionray init`` (issue 19, item 3): a commented ``sessionray.yaml`` that the real loader
accepts as written and with every commented block uncommented; never overwritten without
``--force``; the next command is printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from actors.cli.init_config import config_template
from runtime.config import KNOWN_APIS, load_config, parse_config
from runtime.config.requirements import env_references, missing_env

SCRIPT = Path(sys.executable).parent / "sessionray"
ROOT = Path(__file__).resolve().parents[3]


def init(cwd: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    """``sessionray init ARGS`` in ``cwd``; PATH finds this venv's ``sessionray`` unless ``path``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": path or f"{SCRIPT.parent}:{os.environ['PATH']}"}
    return subprocess.run(
        [str(SCRIPT), "init", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def uncommented(text: str) -> str:
    """Every "# " setting line made live, as an operator would (explanations, "##", stay)."""
    return re.sub(r"(?m)^(\s*)# ", r"\1", text)


def test_init_writes_a_file_the_loader_accepts(tmp_path: Path) -> None:
    out = init(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "sessionray init: wrote sessionray.yaml\n"
        "next: sessionray check && sessionray serve\n"
        "      (in a source checkout: `make run`, which reads ./sessionray.yaml)\n"
    )
    written = tmp_path / "sessionray.yaml"
    assert written.read_text() == config_template()
    config = load_config(written)
    assert [(b.platform, b.self_id, b.masters) for b in config.bots] == [("console", "console", ["admin"])]
    assert config.ai.default_model is None and config.ai.providers == {}  # the built-in model
    assert config.server.admin_token_env == "SESSIONRAY_ADMIN_TOKEN"
    assert env_references(config) == []


def test_uncommented_template_validates_with_the_variables_it_names(tmp_path: Path) -> None:
    full = parse_config(yaml.safe_load(uncommented(config_template())), "uncommented")
    assert sorted(p.api for p in full.ai.providers.values()) == sorted(a for a in KNOWN_APIS if a != "faux")
    assert [b.platform for b in full.bots] == ["console", "onebot11", "telegram"]
    assert [(q.scope, q.window, q.tokens, q.usd) for q in full.spend.quotas] == [
        ("user", "day", 200000, None),
        ("global", "month", None, 300),
    ]
    assert full.ai.default_model is not None and full.ai.default_model.split("/")[0] in full.ai.providers
    names = {ref.var for ref in env_references(full)}
    assert names == {
        "ONEBOT_ACCESS_TOKEN",
        "ONEBOT_SECRET",
        "TELEGRAM_BOT_TOKEN",
        "TELEGRAM_WEBHOOK_SECRET",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "GEMINI_API_KEY",
    }
    assert missing_env(full, dict.fromkeys(names, "set")) == []


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    mine = tmp_path / "sessionray.yaml"
    mine.write_text("bots: []\n")
    out = init(tmp_path)
    assert out.returncode == 2
    assert (
        out.stderr == "sessionray init: sessionray.yaml exists; not overwritten (use --force to replace it)\n"
    )
    assert mine.read_text() == "bots: []\n"
    assert init(tmp_path, "--force").returncode == 0
    assert mine.read_text() == config_template()


def test_the_next_command_is_spelled_as_a_shell_without_the_venv_on_path_runs_it(tmp_path: Path) -> None:
    out = init(tmp_path, path="/usr/bin:/bin")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == f"next: {SCRIPT} check && {SCRIPT} serve"  # cwd is not above it


def test_init_path_names_the_file_in_the_next_command(tmp_path: Path) -> None:
    out = init(tmp_path, "--path", "conf/dev.yaml")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == [
        "sessionray init: wrote conf/dev.yaml",
        "next: sessionray check --config conf/dev.yaml && sessionray serve --config conf/dev.yaml",
    ]
    assert (tmp_path / "conf" / "dev.yaml").read_text() == config_template()


def test_no_example_points_a_model_server_at_sessionrays_own_port() -> None:
    """A local model server (vLLM defaults to 8000) must not be shown on sessionray's own port."""
    from runtime.config import ServerConfig

    port = ServerConfig().port
    own = re.compile(rf"(127\.0\.0\.1|localhost):{port}/v1")
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    offending = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages for m in own.finditer(p.read_text())]
    assert offending + own.findall(config_template()) == []

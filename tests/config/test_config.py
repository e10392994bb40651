"""runtime.config: the YAML contract, its errors (file + key path), driver rejection, get_model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.config import (
    Config,
    ConfigError,
    get_api_key,
    get_model,
    load_config,
    resolve_model_ref,
    set_config,
)
from runtime.llm.types import Model

FULL = """
ai:
  default_model: local/qwen2.5
  vision_model: claude/claude-sonnet-4-5
  fallback_models: [gemini/gemini-2.5-flash]
  providers:
    local:
      api: openai-completions
      base_url: http://127.0.0.1:11434/v1
      api_key_env: LOCAL_LLM_KEY
      compat: {max_tokens_field: max_tokens}
      models:
        - {id: qwen2.5, context_window: 32768, max_tokens: 4096, input: [text]}
    claude:
      api: anthropic-messages
      api_key_env: ANTHROPIC_API_KEY
      headers: {x-team: bots}
      models:
        - {id: claude-sonnet-4-5, reasoning: true, input: [text, image], cost: {input: 3, output: 15}}
    gemini:
      api: google-generative-ai
      base_url: https://generativelanguage.googleapis.com/v1beta
      api_key_env: GEMINI_API_KEY
  agent:
    output_schema: segments
    steering_mode: one-at-a-time
    follow_up_mode: all
bots:
  - platform: onebot11
    self_id: 10001
    api_base: http://127.0.0.1:5700
    access_token_env: ONEBOT_ACCESS_TOKEN
    secret_env: ONEBOT_SECRET
    trigger: mention
    masters: [20002]
database:
  url: sqlite:///./data/sessionray.db
server: {host: 127.0.0.1, port: 8000, admin_token_env: SESSIONRAY_ADMIN_TOKEN}
runtime: {router_shards: 1, delivery_actors: 2, sessions_per_host: 2000, min_hosts: 2, max_live_sessions: 64,
  idle_ttl_s: 600}
"""


@pytest.fixture(autouse=True)
def _forget_config() -> Iterator[None]:
    yield
    set_config(None)


def _write(tmp_path: Path, text: str, name: str = "sessionray.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_full_file_and_get_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(_write(tmp_path, FULL))
    assert cfg.bots[0].self_id == "10001" and cfg.bots[0].masters == ["20002"]
    assert cfg.ai.agent.follow_up_mode == "all"
    assert get_model("local", "qwen2.5") == Model(
        id="qwen2.5",
        name="qwen2.5",
        api="openai-completions",
        provider="local",
        base_url="http://127.0.0.1:11434/v1",
        context_window=32768,
        max_tokens=4096,
        input=["text"],
        compat={"max_tokens_field": "max_tokens"},
    )
    claude = resolve_model_ref("claude/claude-sonnet-4-5")
    assert (claude.api, claude.reasoning, claude.input, claude.cost.output, claude.headers) == (
        "anthropic-messages",
        True,
        ["text", "image"],
        15.0,
        {"x-team": "bots"},
    )
    unlisted = get_model("gemini", "gemini-2.5-pro")  # unlisted ids are allowed (default budgets)
    assert (unlisted.api, unlisted.max_tokens) == ("google-generative-ai", 4096)
    monkeypatch.setenv("LOCAL_LLM_KEY", "lk-123456")
    assert get_api_key("local") == "lk-123456" and get_api_key("nope") is None


def test_missing_default_file_gives_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config() == Config()
    assert Config().runtime.min_hosts == 2 and Config().database.url == "sqlite:///./data/sessionray.db"


def test_missing_named_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: configuration file not found"


def test_default_file_in_cwd_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, "runtime: {min_hosts: 9}\n")
    monkeypatch.chdir(tmp_path)
    assert load_config().runtime.min_hosts == 9


def test_driver_key_is_rejected_with_the_api_to_use(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "ai:\n  providers:\n    ds:\n      driver: deepseek\n      base_url: https://api.deepseek.com\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: ai.providers.ds.driver: the `driver` key was removed (seed 002 D1); "
        "use `api: openai-completions` instead"
    )


def test_bad_key_paths_are_named(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "ai:\n  providers:\n    local:\n      base_url: http://x\n      modles: []\n"
        "bots:\n  - platform: onebot11\n    trigger: sometimes\nruntime: {min_hosts: 0}\n",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    lines = str(info.value).splitlines()
    assert lines == [
        f"{path}: ai.providers.local.api: Field required",
        f"{path}: ai.providers.local.modles: Extra inputs are not permitted",
        f"{path}: bots.0.trigger: Input should be 'mention', 'always' or 'keyword'",
        f"{path}: runtime.min_hosts: Input should be greater than or equal to 1",
    ]


def test_unknown_api_and_dangling_default_model(tmp_path: Path) -> None:
    path = _write(tmp_path, "ai:\n  default_model: other/m\n  providers:\n    x: {api: openai-chat}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).splitlines() == [
        f"{path}: ai.providers.x.api: unknown api 'openai-chat'; "
        "known: openai-completions, anthropic-messages, google-generative-ai, faux",
    ]
    path = _write(tmp_path, "ai:\n  default_model: other/m\n  providers:\n    x: {api: faux}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert (
        str(info.value)
        == f"{path}: ai.default_model: provider alias 'other' is not in ai.providers (known: x)"
    )


def test_invalid_yaml_and_unknown_alias(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sessionray.yaml: not valid YAML"):
        load_config(_write(tmp_path, "ai: [unclosed\n"))
    set_config(Config())
    with pytest.raises(
        ConfigError, match=r"ai.providers.ghost: not configured \(known: \(none configured\)\)"
    ):
        get_model("ghost", "m")
    with pytest.raises(ConfigError, match="not of the form provider_alias/model_id"):
        resolve_model_ref("no-slash")


def test_docs_provider_example_is_valid(tmp_path: Path) -> None:
    """The provider example of docs/providers.md (one per api) loads and yields the documented models."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "providers.md").read_text()
    section = page.split("## Configuring providers", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = load_config(_write(tmp_path, example))
    assert sorted(cfg.ai.providers) == ["claude", "deepseek", "gemini", "local", "openai"]
    assert {a: p.api for a, p in cfg.ai.providers.items()} == {
        "local": "openai-completions",
        "deepseek": "openai-completions",
        "openai": "openai-completions",
        "claude": "anthropic-messages",
        "gemini": "google-generative-ai",
    }
    assert resolve_model_ref(cfg.ai.default_model or "").base_url == "http://127.0.0.1:11434/v1"


def test_size_limits_refuse_a_boolean(tmp_path: Path) -> None:
    """``max_body_bytes: true`` would otherwise be read as 1 byte and refuse every request."""
    path = _write(tmp_path, "server:\n  max_body_bytes: true\n  max_text_chars: '100'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).splitlines() == [
        f"{path}: server.max_body_bytes: Input should be a valid integer",
        f"{path}: server.max_text_chars: Input should be a valid integer",
    ]


def test_a_relative_media_dir_is_made_absolute_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delivery actors may run in another working directory: the bot's media_dir is resolved
    once, where the configuration is loaded (docs/decisions.md#security-media-references)."""
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, "bots:\n  - platform: onebot11\n    self_id: 1\n    media_dir: media\n")
    assert load_config(path).bots[0].media_dir == str(tmp_path / "media")

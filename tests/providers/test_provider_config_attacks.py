"""Bad configuration and API keys: YAML errors with key paths, keys pasted into ``api_key_env``,
missing key variables named at call time, keys kept away from other vendors and out of errors
and logs, wrong ``compat`` types (docs/decisions.md#llm-api-keys)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers import register_builtin_providers
from providers.openai_images import ImageModel, generate_images
from runtime.config import Config, ConfigError, get_model, load_config, set_config
from runtime.llm.options import StreamOptions
from runtime.llm.stream import stream
from runtime.llm.types import Model
from tests.providers.helpers import GEMINI, OPENAI, hello, model_for, openai_text, run, sse
from tests.providers.replay_server import ReplayServer, Reply


@pytest.fixture
def no_config() -> Iterator[None]:
    yield
    set_config(None)
    register_builtin_providers()  # drop the configured providers a test registered


async def test_key_whitespace_is_stripped_and_control_characters_refused(replay: ReplayServer) -> None:
    replay.enqueue(Reply(body=sse(openai_text("ok", "stop"))))
    _, msg = await run(model_for(replay, OPENAI), api_key="sk-from-dotenv-1234\r\n")
    assert (msg.stop_reason, replay.requests[0].headers["authorization"]) == (
        "stop",
        "Bearer sk-from-dotenv-1234",
    )
    _, bad = await run(model_for(replay, OPENAI), api_key="sk-broken\x00key-5678")
    assert (bad.stop_reason, bad.error_message) == (
        "error",
        "the API key from StreamOptions.api_key contains whitespace or control characters",
    )
    assert len(replay.requests) == 1  # nothing sent with the broken key


def _config(tmp_path: Path, server: ReplayServer, provider_extra: str) -> Config:
    (tmp_path / "s.yaml").write_text(
        "ai:\n  providers:\n    acme:\n      api: openai-completions\n"
        f"      base_url: {server.base_url}/v1\n{provider_extra}"
    )
    config = load_config(tmp_path / "s.yaml")
    register_builtin_providers(config.ai.providers)  # as the session setup registers them
    return config


async def test_missing_key_variable_is_named_at_call_time(
    replay: ReplayServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_config: None
) -> None:
    monkeypatch.delenv("ACME_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-must-not-leak")
    config = _config(tmp_path, replay, "      api_key_env: ACME_API_KEY\n")
    s = stream(get_model("acme", "m1"), hello(), StreamOptions())
    msg = await s.result()
    assert (msg.stop_reason, msg.error_message) == (
        "error",
        "no API key for provider 'acme': the environment variable ACME_API_KEY "
        "(ai.providers.acme.api_key_env) is not set",
    )
    assert replay.requests == []  # no request without the key, and no other vendor's key
    result = await generate_images(
        ImageModel(id="gpt-image-1", provider="acme", base_url=replay.base_url),
        "a fox",
        provider_configs=config.ai.providers,
    )
    assert (result.images, result.error_message) == ([], msg.error_message)


async def test_keyless_provider_never_gets_another_vendors_key(
    replay: ReplayServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_config: None
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-must-not-leak")
    _config(tmp_path, replay, "")
    replay.enqueue(Reply(body=sse(openai_text("ok", "stop"))))
    msg = await stream(get_model("acme", "m1"), hello(), StreamOptions()).result()
    assert msg.stop_reason == "stop" and "authorization" not in replay.requests[0].headers


async def test_key_in_configured_headers_is_redacted(
    replay: ReplayServer, tmp_path: Path, no_config: None, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "hdr-secret-value-4242"
    _config(tmp_path, replay, f"      headers: {{Authorization: Bearer {secret}}}\n")
    replay.enqueue(Reply.error(403, {"error": {"message": f"token {secret} revoked"}}))
    caplog.set_level(logging.DEBUG)
    msg = await stream(get_model("acme", "m1"), hello(), StreamOptions()).result()
    assert msg.error_message == "HTTP 403: token *** revoked"
    assert replay.requests[0].headers["authorization"] == f"Bearer {secret}"
    assert secret not in caplog.text


def test_compat_flags_of_the_wrong_type_are_named(replay: ReplayServer) -> None:
    from providers.openai_completions import build_request_body

    model = model_for(replay, OPENAI, compat={"supports_developer_role": "maybe"})
    with pytest.raises(ValueError) as err:
        build_request_body(model, hello(), StreamOptions())
    assert (
        str(err.value)
        == "ai.providers.p.compat.supports_developer_role (model m1): expected true or false, got 'maybe'"
    )
    model = model_for(replay, OPENAI, compat={"max_tokens_field": "maxx"})
    with pytest.raises(ValueError) as err:
        build_request_body(model, hello(), StreamOptions())
    assert str(err.value) == (
        "ai.providers.p.compat.max_tokens_field (model m1): 'maxx' is not one of "
        "max_tokens, max_completion_tokens"
    )


def _load(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    return str(err.value).replace(str(path), "bad.yaml")


def test_config_tabs_wrong_types_and_unknown_keys(tmp_path: Path, no_config: None) -> None:
    tabs = _load(tmp_path, "ai:\n\tproviders: {}\n")
    assert tabs.startswith("bad.yaml: not valid YAML: ") and "line 2, column 1" in tabs
    assert _load(
        tmp_path,
        "ai:\n  providers:\n    x:\n      api: openai-completions\n      models:\n        - id: m\n"
        "          bogus: 1\n          cost: {inputt: 1}\n          max_tokens: lots\n  agentt: {}\n"
        "runtime: {min_hosts: many}\nfoo: 1\n",
    ).splitlines() == [
        "bad.yaml: ai.providers.x.models.0.max_tokens: Input should be a valid integer, "
        "unable to parse string as an integer",
        "bad.yaml: ai.providers.x.models.0.cost.inputt: Extra inputs are not permitted",
        "bad.yaml: ai.providers.x.models.0.bogus: Extra inputs are not permitted",
        "bad.yaml: ai.agentt: Extra inputs are not permitted",
        "bad.yaml: runtime.min_hosts: Input should be a valid integer, unable to parse string as an integer",
        "bad.yaml: foo: Extra inputs are not permitted",
    ]


def test_a_key_pasted_into_api_key_env_is_refused_without_echo(tmp_path: Path, no_config: None) -> None:
    for pasted in ("sk-proj-Abc123SECRET", "AIzaSyD-SECRET_value", "sk_live_SECRET"):
        text = _load(
            tmp_path,
            f"ai:\n  providers:\n    x:\n      api: openai-completions\n      api_key_env: {pasted}\n",
        )
        assert text == (
            "bad.yaml: ai.providers.x.api_key_env: must be the NAME of an environment variable holding "
            "the key (letters, digits, `_`; e.g. OPENAI_API_KEY), not the key itself"
        )


def test_model_of_unconfigured_provider_uses_the_apis_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from providers.common import resolve_api_key

    monkeypatch.setenv("GEMINI_API_KEY", " g-key-1234\n")
    set_config(None)
    assert resolve_api_key(Model(id="m", api=GEMINI, provider="adhoc"), None) == "g-key-1234"
    official = Model(
        id="m", api=GEMINI, provider="adhoc", base_url="https://generativelanguage.googleapis.com/v1beta"
    )
    elsewhere = Model(id="m", api=GEMINI, provider="adhoc", base_url="https://gemini-proxy.example/v1beta")
    assert (resolve_api_key(official, None), resolve_api_key(elsewhere, None)) == ("g-key-1234", None)


def test_base_url_without_scheme_is_a_config_error(tmp_path: Path, no_config: None) -> None:
    text = _load(
        tmp_path,
        "ai:\n  providers:\n    x:\n      api: openai-completions\n      base_url: 127.0.0.1:11434/v1\n",
    )
    assert (
        text == "bad.yaml: ai.providers.x.base_url: '127.0.0.1:11434/v1' must start with http:// or https://"
    )


def test_provider_alias_with_a_slash_is_refused(tmp_path: Path, no_config: None) -> None:
    text = _load(tmp_path, "ai:\n  providers:\n    my/llm:\n      api: openai-completions\n")
    assert text == "bad.yaml: ai.providers.my/llm: a provider alias must be non-empty and contain no '/'"


async def test_session_setup_hands_its_configured_keys_to_the_providers(
    replay: ReplayServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_config: None
) -> None:
    from actors.placement.hosts.setup import ConfigSetupFactory
    from runtime.config import parse_config
    from runtime.memory.db import Database

    monkeypatch.setenv("ACME_API_KEY", "acme-key-5678")
    config = parse_config(
        {
            "ai": {
                "default_model": "acme/m1",
                "providers": {
                    "acme": {
                        "api": "openai-completions",
                        "base_url": f"{replay.base_url}/v1",
                        "api_key_env": "ACME_API_KEY",
                    }
                },
            },
            "database": {"url": f"sqlite:///{tmp_path / 's.db'}"},
        }
    )
    set_config(None)  # a session actor's process has no process-wide configuration
    db = Database(config.database.url)
    db.create_tables()
    setup = ConfigSetupFactory(config)
    setup.prepare(database=db)
    replay.enqueue(Reply(body=sse(openai_text("ok", "stop"))))
    try:
        msg = await stream(setup("console:console:private:u1").model, hello(), StreamOptions()).result()
    finally:
        db.dispose()
    assert (msg.stop_reason, replay.requests[0].headers["authorization"]) == ("stop", "Bearer acme-key-5678")

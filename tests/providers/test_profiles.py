"""Capability profiles of OpenAI-compatible servers (providers.profiles), chosen by base URL."""

from __future__ import annotations

import pytest

from providers.profiles import OpenAICompat, openai_compat
from runtime.llm.types import Model


def _m(base_url: str, **compat: object) -> Model:
    return Model(id="x", api="openai-completions", base_url=base_url, compat=dict(compat))


def test_defaults_by_base_url() -> None:
    assert openai_compat(_m("https://api.openai.com/v1")) == OpenAICompat(
        supports_developer_role=True, max_tokens_field="max_completion_tokens", reasoning_format="openai"
    )
    assert openai_compat(_m("https://api.deepseek.com")) == OpenAICompat(
        reasoning_format="deepseek",
        send_reasoning_content=True,
        supports_strict_mode=False,
        supports_json_schema=False,
    )
    assert openai_compat(_m("http://127.0.0.1:11434/v1")) == OpenAICompat(supports_strict_mode=False)
    assert openai_compat(_m("https://openrouter.ai/api/v1")).reasoning_format == "openrouter"
    assert openai_compat(_m("https://api.mistral.ai/v1")).tool_result_needs_name is True
    assert openai_compat(_m("https://llm.example.com/v1")) == OpenAICompat()
    assert openai_compat(_m("")).max_tokens_field == "max_completion_tokens"  # empty: api.openai.com


def test_named_profile_and_overrides() -> None:
    c = openai_compat(
        _m("http://127.0.0.1:9000/v1", profile="deepseek", supports_json_schema=True, other_api_key=1)
    )
    assert (c.send_reasoning_content, c.supports_json_schema, c.reasoning_format) == (True, True, "deepseek")
    with pytest.raises(ValueError, match="unknown compat profile 'nope'; known: deepseek, generic, local"):
        openai_compat(_m("http://h", profile="nope"))

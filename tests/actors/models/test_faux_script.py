"""``ai.providers.<alias>.script``: a scripted faux provider named in the configuration
(docs/decisions.md#faux-script-from-config) answers from the configured function once the providers
are registered with the configured ones; the key is refused where it cannot work."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from actors.models.faux_script import SCRIPT_CHUNK_SIZE, faux_scripts, register_configured_providers
from providers.faux import get_faux_provider, unregister_faux_provider
from runtime.config import ConfigError, parse_config, resolve_model_ref
from runtime.config.entry_points import PythonToolError
from runtime.llm.stream import stream
from runtime.llm.types import Context, UserMessage

SHOUT = "tests.providers.helpers:shout"


def providers_config(**provider: Any) -> Any:
    return parse_config({"ai": {"default_model": "scripted/chat", "providers": {"scripted": provider}}})


@pytest.fixture
def scripted() -> Iterator[Any]:
    cfg = providers_config(api="faux", script=SHOUT, models=[{"id": "chat", "context_window": 4096}])
    yield cfg
    unregister_faux_provider("scripted")


async def test_the_configured_script_answers_every_call(scripted: Any) -> None:
    register_configured_providers(scripted.ai.providers)
    assert [m.id for m in get_faux_provider("scripted").models] == ["chat"]
    model = resolve_model_ref("scripted/chat", scripted)
    assert (model.api, model.provider, model.context_window) == ("faux", "scripted", 4096)
    text = "hello " * 30  # 180 characters: three chunks
    events = stream(model, Context(messages=[UserMessage(content=text)]))
    deltas = [e.delta for e in [e async for e in events] if e.type == "text_delta"]
    reply = await events.result()
    assert (reply.stop_reason, reply.text()) == ("stop", text.upper())
    assert [len(d) for d in deltas] == [SCRIPT_CHUNK_SIZE, SCRIPT_CHUNK_SIZE, 180 - 2 * SCRIPT_CHUNK_SIZE]


def test_script_is_for_faux_providers_with_models_only() -> None:
    with pytest.raises(ConfigError, match="only for `api: faux`"):
        providers_config(api="openai-completions", script=SHOUT, models=[{"id": "chat"}])
    with pytest.raises(ConfigError, match=r"not of the form 'package\.module:function'"):
        providers_config(api="faux", script="tests/providers/helpers.py", models=[{"id": "chat"}])
    with pytest.raises(ConfigError, match="needs `models`"):
        providers_config(api="faux", script=SHOUT)


def test_a_script_that_cannot_be_used_is_refused_when_loaded() -> None:
    missing = providers_config(api="faux", script="tests.providers.helpers:nope", models=[{"id": "chat"}])
    with pytest.raises(PythonToolError, match="cannot be imported"):
        faux_scripts(missing.ai.providers)
    constant = providers_config(api="faux", script="tests.providers.helpers:BASE_PATHS", models=[{"id": "c"}])
    with pytest.raises(PythonToolError, match="is not callable"):
        faux_scripts(constant.ai.providers)
    assert faux_scripts(providers_config(api="faux", models=[{"id": "chat"}]).ai.providers) == {}

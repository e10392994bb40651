"""``ai.providers.<alias>.limits`` and ``ai.agent.busy_text`` in ``sessionray.yaml``
(docs/decisions.md#spend-provider-limits): read as written, every key optional, and a bad value
named by its dotted path; the busy reply of a refused turn (``runtime.session.turn_agent.busy_reply``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.config import ConfigError, load_config
from runtime.llm.limits import ProviderBusyError
from runtime.llm.types import AssistantMessage, Model
from runtime.reply.custom_output import spec_from_json_schema
from runtime.session.turn import BUSY_TEXT, SessionSetup
from runtime.session.turn_agent import busy_reply

YAML = """
ai:
  providers:
    main:
      api: openai-completions
      base_url: http://127.0.0.1:9/v1
      limits: {limits}
      models: [{{id: m1}}]
"""


def load(tmp_path: Path, limits: str) -> object:
    path = tmp_path / "sessionray.yaml"
    path.write_text(YAML.format(limits=limits), encoding="utf-8")
    return load_config(path)


def test_limits_are_read_and_every_key_is_optional(tmp_path: Path) -> None:
    config = load(tmp_path, "{concurrency: 8, rpm: 500, tpm: 200000, max_wait_s: 30}")
    limits = config.ai.providers["main"].limits  # type: ignore[attr-defined]
    assert (limits.concurrency, limits.rpm, limits.tpm, limits.max_wait_s) == (8, 500, 200_000, 30.0)
    only_wait = load(tmp_path, "{max_wait_s: 5}").ai.providers["main"].limits  # type: ignore[attr-defined]
    assert (only_wait.limited(), only_wait.max_wait_s) == (False, 5.0)
    assert load(tmp_path, "null").ai.providers["main"].limits is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("limits", "where", "why"),
    [
        ("{rpm: 0}", "ai.providers.main.limits.rpm", "greater than or equal to 1"),
        ("{concurrency: -2}", "ai.providers.main.limits.concurrency", "greater than or equal to 1"),
        ("{tpm: lots}", "ai.providers.main.limits.tpm", "valid integer"),
        ("{max_wait_s: 0}", "ai.providers.main.limits.max_wait_s", "greater than 0"),
        ("{rps: 3}", "ai.providers.main.limits.rps", "Extra inputs are not permitted"),
    ],
)
def test_a_bad_limit_is_named_by_its_path(tmp_path: Path, limits: str, where: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, limits)
    assert where in str(err.value) and why in str(err.value)


def _final(error_message: str | None, stop_reason: str = "error") -> AssistantMessage:
    return AssistantMessage(
        api="openai-completions",
        provider="main",
        model="m1",
        stop_reason=stop_reason,
        error_message=error_message,
    )


def test_a_refused_call_gives_the_busy_reply_and_nothing_else_does() -> None:
    model = Model(id="m1", provider="main", api="openai-completions")
    setup = SessionSetup(model=model)
    refused = _final(str(ProviderBusyError("main", 30.0)))
    reply = busy_reply(setup, refused)
    assert reply is not None and reply.preview_text() == BUSY_TEXT
    custom = SessionSetup(model=model, busy_text="Busy, try later.")
    reply = busy_reply(custom, refused)
    assert reply is not None and reply.preview_text() == "Busy, try later."
    assert busy_reply(setup, _final("HTTP 500: oops")) is None
    assert busy_reply(setup, _final(None, "stop")) is None
    assert busy_reply(setup, None) is None
    sink = SessionSetup(
        model=model,
        output_schema=spec_from_json_schema(
            {"title": "Note", "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        ),
    )
    assert busy_reply(sink, refused) is None  # a custom schema's answers never go to the chat

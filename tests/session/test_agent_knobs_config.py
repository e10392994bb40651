"""``ai.agent`` knobs reach the session (docs/decisions.md#agent-iteration-budget,
docs/decisions.md#session-extra-tools): the LLM-call budget is bounded by default, and
``failure_text``, ``pre_tools`` and ``deferred_tasks`` from the configuration become the session
setup's; a bad reference is refused when the configuration loads or the runtime starts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from actors.placement.hosts.setup import ConfigSetupFactory, agent_code
from runtime.config import ConfigError, parse_config
from runtime.config.entry_points import PythonToolError
from runtime.memory.db import Database
from runtime.session.turn import TurnInput
from runtime.session.turn_agent import run_pre_tools
from tests.session import agent_code as code


def config(tmp_path: Path, **agent: Any) -> Any:
    cfg = parse_config({"ai": {"agent": agent}, "database": {"url": f"sqlite:///{tmp_path / 'k.db'}"}})
    Database(cfg.database.url).create_tables()
    return cfg


def a_turn() -> TurnInput:
    return TurnInput(
        seq=1,
        session_key="onebot11:10001:private:42",
        platform="onebot11",
        bot_id="10001",
        message_id="m1",
        scene_type="private",
        scene_id="42",
        sender={"id": "42", "name": "Bob", "roles": []},
        text="hi",
    )


def test_the_llm_call_budget_is_bounded_by_default_and_configurable(tmp_path: Path) -> None:
    def budget(**agent: Any) -> int | None:
        return ConfigSetupFactory(config(tmp_path, **agent))("onebot11:1:private:1").max_iterations

    assert (budget(), budget(max_iterations=3), budget(max_iterations=None)) == (16, 3, None)
    with pytest.raises(ConfigError, match="max_iterations"):
        config(tmp_path, max_iterations=0)


def test_failure_text_from_the_config_replaces_the_built_in_one(tmp_path: Path) -> None:
    default = ConfigSetupFactory(config(tmp_path))("onebot11:1:private:1").failure_text
    assert default.startswith("Sorry, something went wrong")
    setup = ConfigSetupFactory(config(tmp_path, failure_text="出错了，请再试一次。"))("onebot11:1:private:1")
    assert setup.failure_text == "出错了，请再试一次。"
    with pytest.raises(ConfigError, match="failure_text"):
        config(tmp_path, failure_text="")


async def test_pre_tools_run_before_the_turn_a_plain_one_off_the_loop_thread(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        pre_tools=["tests.session.agent_code:where_am_i", "tests.session.agent_code:nothing_to_add"],
    )
    setup = ConfigSetupFactory(cfg)("onebot11:10001:private:42")
    assert [p.name for p in setup.pre_tools] == ["where_am_i", "nothing_to_add"]
    record = await run_pre_tools(setup.pre_tools, a_turn())
    assert record is not None and set(record.data["results"]) == {"where_am_i"}
    text = record.data["results"]["where_am_i"]
    assert text.startswith("sender 42 on thread ") and not text.endswith(threading.current_thread().name)


def test_deferred_tasks_are_imported_by_name(tmp_path: Path) -> None:
    cfg = config(tmp_path, deferred_tasks={"square": "tests.session.agent_code:square"})
    setup = ConfigSetupFactory(cfg)("onebot11:10001:private:42")
    assert setup.deferred_tasks == {"square": code.square}
    assert setup.deferred_tasks["square"]({"x": 7}) == "49"


def test_bad_references_are_refused_at_load_or_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not of the form"):
        config(tmp_path, pre_tools=["no colon here"])
    with pytest.raises(ConfigError, match="not of the form"):
        config(tmp_path, deferred_tasks={"x": "bad ref"})
    with pytest.raises(PythonToolError, match="cannot be imported"):
        agent_code(config(tmp_path, pre_tools=["tests.session.agent_code:missing"]))
    with pytest.raises(PythonToolError, match="is not callable"):
        agent_code(config(tmp_path, deferred_tasks={"x": "tests.session.agent_code:NOT_CALLABLE"}))


def test_the_queue_modes_of_the_configuration_are_the_agents() -> None:
    # The configuration spells the queue modes itself (it imports no agent:
    # docs/decisions.md#layout-forbidden-pairs); both knobs accept exactly Agent's QueueMode values.
    from typing import get_args

    from runtime.agent.agent import QueueMode
    from runtime.config.ai import AgentConfig

    for knob in ("steering_mode", "follow_up_mode"):
        assert get_args(AgentConfig.model_fields[knob].annotation) == get_args(QueueMode)
        assert getattr(parse_config({"ai": {"agent": {knob: "all"}}}).ai.agent, knob) == "all"
        with pytest.raises(ConfigError, match=knob):
            parse_config({"ai": {"agent": {knob: "some"}}})

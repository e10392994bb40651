"""``ai.python_tools`` (Python ``AgentTool`` s named in the configuration) and ``ai.agent.delegate``
(the sub-agent tool): loading, start-up errors naming the reference, and the tools a session gets
from the default ``ConfigSetupFactory``."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.placement.hosts.setup import ConfigSetupFactory, business_tools
from runtime.config import ConfigError, parse_config
from runtime.config.entry_points import PythonToolError
from runtime.memory.db import Database
from runtime.session.python_tools import load_python_tools

ROOT = Path(__file__).resolve().parents[2]
H = "tests.session.handlers"


def test_a_tool_a_function_and_the_example_list_load_in_order() -> None:
    tools = load_python_tools([f"{H}:ONE_TOOL", f"{H}:make_tools", "examples.bot.bot_tools:TOOLS"])
    assert [t.name for t in tools] == ["echo_one", "echo_two", "echo_three", "convert_units"]


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        (f"{H}:nope", f"{H}:nope: cannot be imported: module '{H}' has no attribute 'nope'"),
        (
            "tests.session.no_such_module:x",
            "tests.session.no_such_module:x: cannot be imported: No module named",
        ),
        (f"{H}:NOT_CALLABLE", f"{H}:NOT_CALLABLE: expected AgentTool objects, got int"),
        (f"{H}:add", f"{H}:add: the tool function raised TypeError:"),
        (f"{H}:broken_tools", f"{H}:broken_tools: the tool function raised RuntimeError: no tools today"),
        (f"{H}:TWICE", f"{H}:TWICE: tool name 'echo_one' is already declared by {H}:ONE_TOOL"),
    ],
)
def test_bad_references_name_themselves(ref: str, message: str) -> None:
    with pytest.raises(PythonToolError) as err:
        load_python_tools([f"{H}:ONE_TOOL", ref])
    assert str(err.value).startswith(message)


def test_the_reference_form_is_checked_with_the_configuration() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"ai": {"python_tools": ["examples/bot/bot_tools.py", "ok.mod:TOOLS"]}}, "bot.yaml")
    assert str(err.value) == (
        "bot.yaml: ai.python_tools.0: 'examples/bot/bot_tools.py' is not of the form "
        "'package.module:attribute'"
    )


def test_a_tool_md_may_not_reuse_a_python_tool_name(tmp_path: Path) -> None:
    (tmp_path / "echo.tool.md").write_text(
        f"---\nname: echo_one\ndescription: d\nhandler: {{type: python, entry_point: '{H}:add'}}\n---\n"
    )
    config = parse_config({"ai": {"python_tools": [f"{H}:ONE_TOOL"], "tools_dir": str(tmp_path)}})
    with pytest.raises(PythonToolError) as err:
        business_tools(config)
    assert str(err.value) == f"{tmp_path}: tool name 'echo_one' is also declared by ai.python_tools"


@pytest.mark.parametrize("delegate", [False, True])
def test_session_tools_from_the_configuration(tmp_path: Path, delegate: bool) -> None:
    config = parse_config(
        {
            "ai": {
                "default_model": "local/m",
                "providers": {"local": {"api": "faux"}},
                "agent": {"delegate": delegate},
                "python_tools": ["examples.bot.bot_tools:TOOLS"],
                "tools_dir": str(ROOT / "examples" / "bot" / "tools"),
            },
            "database": {"url": f"sqlite:///{tmp_path / 's.db'}"},
        }
    )
    Database(config.database.url).create_tables()
    setup = ConfigSetupFactory(config)("console:console:private:alice")
    names = ["chat_history", "convert_units", "text_stats"]
    assert [t.name for t in setup.tools] == ([*names, "delegate"] if delegate else names)

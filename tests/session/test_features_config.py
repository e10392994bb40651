"""Configuration of the agent features: the new ``ai`` keys, and the default
``ConfigSetupFactory`` building a session with ``*.tool.md`` tools and ``AgentFeatures``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from actors.placement.hosts.setup import ConfigSetupFactory
from runtime.config import ConfigError, McpServerConfig, parse_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tools"


def test_feature_keys_parse_and_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEATHER_API_URL", "http://127.0.0.1:9")
    cfg = parse_config(
        {
            "ai": {
                "default_model": "local/text",
                "vision_model": "local/eyes",
                "fallback_models": ["backup/big"],
                "providers": {
                    "local": {
                        "api": "faux",
                        "models": [{"id": "text"}, {"id": "eyes", "input": ["text", "image"]}],
                    },
                    "backup": {"api": "faux"},
                },
                "mcp_servers": {
                    "calc": {"command": sys.executable, "args": ["server.py", "stdio"]},
                    "web": {"url": "http://127.0.0.1:8001/mcp", "tool_prefix": ""},
                },
                "tools_dir": str(EXAMPLES),
                "media_url_allowlist": ["https://assets.example/"],
                "commands": {"names": {"new": "reset"}, "texts": {"yes": "ja"}},
            },
            "database": {"url": f"sqlite:///{tmp_path / 'c.db'}"},
        }
    )
    assert cfg.ai.mcp_servers == {
        "calc": McpServerConfig(command=sys.executable, args=["server.py", "stdio"]),
        "web": McpServerConfig(url="http://127.0.0.1:8001/mcp", tool_prefix=""),
    }
    from runtime.memory.db import Database

    Database(cfg.database.url).create_tables()
    setup = ConfigSetupFactory(cfg)("onebot11:10001:group:777")
    assert [t.name for t in setup.tools] == ["chat_history", "get_weather"]
    f = setup.features
    assert (setup.model.ref(), f.vision_model.ref(), [m.ref() for m in f.fallback_models]) == (
        "local/text",
        "local/eyes",
        ["backup/big"],
    )
    assert [s.name for s in f.mcp.servers] == ["calc", "web"] and f.mcp.servers[0].connects == 0  # lazy
    assert f.media_url_allowlist == ["https://assets.example/"]
    assert f.commands.parse("/reset") is not None and f.commands.texts["yes"] == "ja"


@pytest.mark.parametrize(
    ("server", "message"),
    [
        (
            {"command": "x", "url": "http://h/mcp"},
            "give exactly one of `command` (stdio) or `url` (streamable HTTP)",
        ),
        ({"args": ["a"]}, "give exactly one of `command` (stdio) or `url` (streamable HTTP)"),
        ({"url": "http://h/mcp", "tranport": "x"}, "Extra inputs are not permitted"),
        ({"url": "http://h/mcp", "scopes": ["room"]}, "scopes: unknown scope(s) ['room']"),
        ({"url": "http://h/mcp", "required_any_role": []}, "required_any_role: an empty list allows nobody"),
    ],
)
def test_bad_mcp_server_config(server: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as err:
        parse_config({"ai": {"mcp_servers": {"s": server}}}, "sessionray.yaml")
    assert message in str(err.value) and "sessionray.yaml: ai.mcp_servers.s" in str(err.value)

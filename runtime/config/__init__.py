"""``sessionray.yaml`` as one closed pydantic model: ``ai`` (providers, models, agent modes, MCP
servers, chat commands), ``bots``, ``database``, ``server`` and ``runtime``. Every default lives
here and nowhere else; :func:`load_config` names the file and the dotted key of each problem
(`docs/decisions.md#config-closed-model`).
"""

from runtime.config.settings import (
    DEFAULT_CONFIG_FILE,
    DRIVER_TO_API,
    KNOWN_APIS,
    AgentConfig,
    AiConfig,
    BotConfig,
    CommandsConfig,
    Config,
    ConfigError,
    DatabaseConfig,
    McpServerConfig,
    ModelConfig,
    ProviderConfig,
    RuntimeConfig,
    ServerConfig,
    default_bots,
    get_api_key,
    get_config,
    get_model,
    get_provider_config,
    load_config,
    parse_config,
    resolve_model_ref,
    set_config,
)

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "DRIVER_TO_API",
    "KNOWN_APIS",
    "AgentConfig",
    "AiConfig",
    "BotConfig",
    "CommandsConfig",
    "Config",
    "ConfigError",
    "DatabaseConfig",
    "McpServerConfig",
    "ModelConfig",
    "ProviderConfig",
    "RuntimeConfig",
    "ServerConfig",
    "default_bots",
    "get_api_key",
    "get_config",
    "get_model",
    "get_provider_config",
    "load_config",
    "parse_config",
    "resolve_model_ref",
    "set_config",
]

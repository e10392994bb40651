"""The one configuration module: ``sessionray.yaml`` as a pydantic v2 model
(docs/decisions.md#config-closed-model).

Every object is closed (``extra="forbid"``), so a typo is an error, not a silently ignored key.
:func:`load_config` reads YAML and raises :class:`ConfigError` whose message names the file and
the dotted key path of each problem (e.g. ``sessionray.yaml: ai.providers.local.api: Field
required``). The removed ``driver`` key is rejected with the ``api`` value to use instead
(the migration table is in the docs only, no shim: docs/decisions.md#llm-api-required).

How model lookup finds its configuration: :func:`load_config` stores the loaded
:class:`Config` as the *current* one (so does :func:`set_config`); :func:`get_model`,
:func:`resolve_model_ref` and :func:`get_api_key` read the current config, loading the default
file (or the embedded defaults) on first use. Pass ``config=`` to use another one explicitly.

The section models live in :mod:`runtime.config.ai` (``ai:`` and the shared base) and
:mod:`runtime.config.sections` (``bots``, ``database``, ``server``, ``runtime``, ``delivery``); every public
name is re-exported here, so import from ``runtime.config``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from runtime.config.ai import (  # re-exported: public names stay in runtime.config
    DRIVER_TO_API,
    ENTRY_POINT_RE,
    KNOWN_APIS,
    AgentConfig,
    AiConfig,
    CommandsConfig,
    ConfigError,
    McpServerConfig,
    ModelConfig,
    OutputSinkConfig,
    ProviderConfig,
    ProviderLimits,
    _Closed,
    _driver_hint,
    _split_ref,
)
from runtime.config.policy import RateLimitConfig, parse_rate
from runtime.config.sections import (
    BotConfig,
    DatabaseConfig,
    DeliveryConfig,
    RuntimeConfig,
    ServerConfig,
    default_bots,
)
from runtime.config.spend import SpendConfig
from runtime.config.tracing import TracingConfig
from runtime.llm.types import Model

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "DRIVER_TO_API",
    "ENTRY_POINT_RE",
    "KNOWN_APIS",
    "AgentConfig",
    "AiConfig",
    "BotConfig",
    "CommandsConfig",
    "Config",
    "ConfigError",
    "DatabaseConfig",
    "DeliveryConfig",
    "McpServerConfig",
    "ModelConfig",
    "OutputSinkConfig",
    "ProviderConfig",
    "ProviderLimits",
    "RateLimitConfig",
    "RuntimeConfig",
    "ServerConfig",
    "default_bots",
    "get_api_key",
    "get_config",
    "get_model",
    "get_provider_config",
    "load_config",
    "parse_config",
    "parse_rate",
    "resolve_model_ref",
    "set_config",
]

DEFAULT_CONFIG_FILE = "sessionray.yaml"
"""Read from the current directory when :func:`load_config` gets no path."""


class Config(_Closed):
    """The whole ``sessionray.yaml``; every section has embedded defaults."""

    ai: AiConfig = Field(default_factory=AiConfig)
    bots: list[BotConfig] = Field(default_factory=default_bots)
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig)
    spend: SpendConfig = Field(default_factory=SpendConfig)
    tracing: TracingConfig = Field(default_factory=TracingConfig)

    @model_validator(mode="after")
    def _console_api_base(self) -> Config:
        """A console bot's "platform API" is this ingress: default its ``api_base`` to the server;
        its master proof defaults to the admin token (``master_token_env`` unset:
        ``server.admin_token_env``, docs/decisions.md#security-console-master-proof)."""
        host = "127.0.0.1" if self.server.host in ("0.0.0.0", "::", "") else self.server.host
        for bot in self.bots:
            if bot.platform == "console" and not bot.api_base:
                bot.api_base = f"http://{host}:{self.server.port}"
            if bot.platform == "console" and not bot.master_token_env:
                bot.master_token_env = self.server.admin_token_env
        return self


# --------------------------------------------------------------------------- loading

_current: Config | None = None
_current_source: str = "<defaults>"


def _format(source: str, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if msg.startswith("[") and "] " in msg:  # a model validator naming the sub-key: "[key] text"
            sub, msg = msg[1:].split("] ", 1)
            path = f"{path}.{sub}" if path != "(top level)" else sub
        lines.append(f"{source}: {path}: {msg}")
    return "\n".join(lines)


def _driver_keys(data: Any) -> list[str]:
    """Find ``driver`` keys under ``ai.providers.*`` before pydantic (for a precise message)."""
    out = []
    providers = ((data or {}).get("ai") or {}).get("providers") if isinstance(data, dict) else None
    if isinstance(providers, dict):
        for alias, p in providers.items():
            if isinstance(p, dict) and "driver" in p:
                out.append(
                    f"ai.providers.{alias}.driver: the `driver` key was removed (seed 002 D1); "
                    f"{_driver_hint(p['driver'])}"
                )
    return out


def parse_config(data: Any, source: str = "<memory>") -> Config:
    """Validate an already-parsed YAML mapping (``None`` → defaults) without making it current.

    Raises:
        ConfigError: one line per problem: ``<source>: <dotted.key.path>: <message>``.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: (top level): expected a mapping, got {type(data).__name__}")
    drivers = _driver_keys(data)
    if drivers:
        raise ConfigError("\n".join(f"{source}: {d}" for d in drivers))
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format(source, exc)) from None


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read, validate and make current the YAML configuration.

    Args:
        path: The file; ``None`` means ``sessionray.yaml`` in the current directory, and if that
            file does not exist the embedded defaults are used.

    Raises:
        ConfigError: an explicitly named file is missing; the YAML does not parse; a key is
            unknown, missing or invalid (the message names the file and the key path); a
            ``driver`` key is present (the message gives the ``api`` to use).
    """
    global _current, _current_source
    explicit = path is not None
    file = Path(path) if path is not None else Path(DEFAULT_CONFIG_FILE)
    if not file.exists():
        if explicit:
            raise ConfigError(f"{file}: configuration file not found")
        cfg, source = Config(), "<defaults>"
    else:
        source = str(file)
        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source}: not valid YAML: {exc}") from None
        cfg = parse_config(data, source)
    _current, _current_source = cfg, source
    return cfg


def set_config(config: Config | None) -> None:
    """Make ``config`` current (``None``: forget it; the next lookup loads the default file)."""
    global _current, _current_source
    _current, _current_source = config, "<set_config>"


def get_config() -> Config:
    """Return the current config, loading ``sessionray.yaml`` (or the defaults) on first use."""
    return _current if _current is not None else load_config()


# --------------------------------------------------------------------------- model lookup


def get_model(provider_alias: str, model_id: str, config: Config | None = None) -> Model:
    """Return the :class:`~runtime.llm.types.Model` for ``ai.providers.<provider_alias>`` / ``model_id``
    (docs/decisions.md#llm-single-entry).

    Provider ``compat`` and ``headers`` are merged under the model's own (``structured_tier``, when set,
    becomes ``compat["structured_tier"]``: the pinned tier). A model id that the
    provider does not list is still returned with default budgets (servers such as Ollama serve
    whatever is pulled), so listing models is optional.

    Raises:
        ConfigError: ``provider_alias`` is not configured (the message lists the known aliases).
    """
    cfg = config or get_config()
    provider = cfg.ai.providers.get(provider_alias)
    if provider is None:
        known = ", ".join(sorted(cfg.ai.providers)) or "(none configured)"
        raise ConfigError(
            f"{_current_source}: ai.providers.{provider_alias}: not configured (known: {known})"
        )
    entry = next((m for m in provider.models if m.id == model_id), None) or ModelConfig(id=model_id)
    return Model(
        id=entry.id,
        name=entry.name or entry.id,
        api=provider.api,
        provider=provider_alias,
        base_url=provider.base_url,
        reasoning=entry.reasoning,
        input=list(entry.input),
        cost=entry.cost,
        context_window=entry.context_window,
        max_tokens=entry.max_tokens,
        headers={**provider.headers, **entry.headers},
        compat={
            **provider.compat,
            **entry.compat,
            **({"structured_tier": entry.structured_tier} if entry.structured_tier else {}),
        },
    )


def resolve_model_ref(ref: str, config: Config | None = None) -> Model:
    """Return the model named ``"provider_alias/model_id"`` (the form ``ai.default_model`` uses).

    Raises:
        ConfigError: ``ref`` has no ``/`` or names an unknown provider alias.
    """
    cfg = config or get_config()
    try:
        alias, model_id = _split_ref(ref, cfg.ai)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("[model] ", "")) from None
    return get_model(alias, model_id, cfg)


def get_api_key(provider_alias: str, config: Config | None = None) -> str | None:
    """Return the key from the environment variable named by ``ai.providers.<alias>.api_key_env``.

    ``None`` when the alias or its ``api_key_env`` is not configured or the variable is unset.
    Never logs the value.
    """
    cfg = config or _current
    if cfg is None:
        return None
    provider = cfg.ai.providers.get(provider_alias)
    if provider is None or not provider.api_key_env:
        return None
    return os.environ.get(provider.api_key_env) or None


def get_provider_config(provider_alias: str, config: Config | None = None) -> ProviderConfig | None:
    """Return ``ai.providers.<provider_alias>`` of ``config`` (default: the current config, without
    loading any file), or ``None`` when it is not configured."""
    cfg = config or _current
    return cfg.ai.providers.get(provider_alias) if cfg is not None else None

"""The one configuration module: ``sessionray.yaml`` as a pydantic v2 model (DESIGN.md "Configuration").

Every object is closed (``extra="forbid"``), so a typo is an error, not a silently ignored key.
:func:`load_config` reads YAML and raises :class:`ConfigError` whose message names the file and
the dotted key path of each problem (e.g. ``sessionray.yaml: ai.providers.local.api: Field
required``). The removed ``driver`` key is rejected with the ``api`` value to use instead
(seed 002, D1: "``api`` required, ``driver`` deleted; migration table in the docs only, no shim").

How model lookup finds its configuration: :func:`load_config` stores the loaded
:class:`Config` as the *current* one (so does :func:`set_config`); :func:`get_model`,
:func:`resolve_model_ref` and :func:`get_api_key` read the current config, loading the default
file (or the embedded defaults) on first use. Pass ``config=`` to use another one explicitly.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runtime.types import InputKind, Model, ModelCost

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
    "resolve_model_ref",
    "set_config",
]

DEFAULT_CONFIG_FILE = "sessionray.yaml"
"""Read from the current directory when :func:`load_config` gets no path."""

KNOWN_APIS = ("openai-completions", "anthropic-messages", "google-generative-ai", "faux")
"""The built-in ``api`` ids (``providers.register_builtin_providers`` registers them)."""

DRIVER_TO_API: dict[str, str] = {
    "openai": "openai-completions",
    "openai-compatible": "openai-completions",
    "deepseek": "openai-completions",
    "ollama": "openai-completions",
    "vllm": "openai-completions",
    "llamacpp": "openai-completions",
    "openrouter": "openai-completions",
    "qwen": "openai-completions",
    "moonshot": "openai-completions",
    "zhipu": "openai-completions",
    "anthropic": "anthropic-messages",
    "claude": "anthropic-messages",
    "gemini": "google-generative-ai",
    "google": "google-generative-ai",
}
"""The documented ``driver`` → ``api`` migration table (seed 002, D1; docs only, no runtime shim)."""


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ConfigError(ValueError):
    """Invalid configuration; the message names the file and the dotted key path of each error."""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _driver_hint(driver: Any) -> str:
    api = DRIVER_TO_API.get(str(driver).lower())
    if api:
        return f"use `api: {api}` instead"
    return f"use `api:` with one of {', '.join(KNOWN_APIS)}"


# --------------------------------------------------------------------------- ai


class ModelConfig(_Closed):
    """One entry of ``ai.providers.<alias>.models``."""

    id: str
    """The provider's model id (sent on the wire)."""
    name: str = ""
    reasoning: bool = False
    """Whether the model emits thinking."""
    input: list[InputKind] = Field(default_factory=lambda: list[InputKind](["text"]))
    """Accepted inputs; include ``image`` for vision models."""
    context_window: int = Field(128_000, gt=0)
    """Tokens."""
    max_tokens: int = Field(4_096, gt=0)
    """Default output budget in tokens."""
    cost: ModelCost = Field(default_factory=ModelCost)
    """USD per million tokens."""
    compat: dict[str, Any] = Field(default_factory=dict)
    """Overrides the provider's ``compat`` for this model."""
    headers: dict[str, str] = Field(default_factory=dict)


class ProviderConfig(_Closed):
    """``ai.providers.<alias>``: one endpoint speaking one wire protocol (``api``)."""

    api: str
    """Required wire protocol id (see :data:`KNOWN_APIS`)."""
    base_url: str = ""
    """Endpoint base URL (empty: the api's public default)."""
    api_key_env: str | None = None
    """Environment variable holding the key (None: keyless, e.g. a local server)."""
    compat: dict[str, Any] = Field(default_factory=dict)
    """Capability flags read by the api (``providers.profiles`` documents the OpenAI ones)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra HTTP headers on every request."""
    models: list[ModelConfig] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _reject_driver(cls, data: Any) -> Any:
        if isinstance(data, dict) and "driver" in data:
            raise ValueError(f"the `driver` key was removed (seed 002 D1); {_driver_hint(data['driver'])}")
        return data

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if v and not v.lower().startswith(("http://", "https://")):
            raise ValueError(f"{v!r} must start with http:// or https://")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        # the value is never echoed: a key pasted here by mistake must not reach logs
        if v is not None and (not _ENV_NAME.fullmatch(v) or v.startswith(("sk_", "AIza"))):
            raise ValueError(
                "must be the NAME of an environment variable holding the key (letters, digits, "
                "`_`; e.g. OPENAI_API_KEY), not the key itself"
            )
        return v

    @field_validator("api")
    @classmethod
    def _known_api(cls, v: str) -> str:
        from runtime.registry import list_api_providers

        if v not in KNOWN_APIS and v not in list_api_providers():
            raise ValueError(f"unknown api {v!r}; known: {', '.join(KNOWN_APIS)}")
        return v


class AgentConfig(_Closed):
    """``ai.agent``: structured-reply and queue modes."""

    output_schema: Literal["segments", False] | dict[str, Any] = "segments"
    """``segments`` (seed 000 reply contract), ``false`` (plain text) or a JSON Schema object."""
    steering_mode: Literal["one-at-a-time", "all"] = "one-at-a-time"
    follow_up_mode: Literal["one-at-a-time", "all"] = "one-at-a-time"


class McpServerConfig(_Closed):
    """``ai.mcp_servers.<name>``: one MCP server (issue 9, item 3; ``runtime.mcp_tools``).

    Exactly one of ``command`` (stdio: the command is started as a subprocess) or ``url``
    (streamable HTTP endpoint, e.g. ``http://127.0.0.1:8001/mcp``).
    """

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables of the stdio subprocess."""
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP headers of a ``url`` server."""
    tool_prefix: str | None = None
    """Prefix of the tool names the model sees (``None``: ``<name>_``; ``""``: the server's names)."""
    timeout_s: float = Field(30.0, gt=0)
    """Bound of connecting, listing and of each tool call (seconds)."""
    platforms: list[str] | None = None
    """Tool permissions of every tool of this server (``runtime.tool_policy``; ``None``: no limit)."""
    scopes: list[str] | None = None
    required_any_role: list[str] | None = None

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (stdio) or `url` (streamable HTTP)")
        from runtime.tool_policy import ToolPermissions

        ToolPermissions.from_mapping(self.model_dump())  # raises ValueError naming the key
        return self


class CommandsConfig(_Closed):
    """``ai.commands``: chat commands handled before the agent (issue 9, item 7; ``runtime.commands``)."""

    enabled: bool = True
    names: dict[str, str] = Field(default_factory=dict)
    """Command → the word users type (without ``/``), e.g. ``{new: reset}``; unset ones keep their name."""
    texts: dict[str, str] = Field(default_factory=dict)
    """Reply texts by key (see ``runtime.commands.DEFAULT_TEXTS``)."""


class AiConfig(_Closed):
    """``ai``: models and providers."""

    default_model: str | None = None
    """``provider_alias/model_id``; ``None``: the built-in offline model."""
    vision_model: str | None = None
    """Used instead of the default when a turn carries images (seed 002, D3)."""
    fallback_models: list[str] = Field(default_factory=list)
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    mcp_servers: dict[str, McpServerConfig] = Field(default_factory=dict)
    """MCP servers whose tools every session may use (issue 9, item 3)."""
    tools_dir: str | None = None
    """Folder of ``*.tool.md`` tools loaded at start-up (issue 9, item 4; hard fail on errors)."""
    media_url_allowlist: list[str] = Field(default_factory=list)
    """URL prefixes a reply may attach without them appearing in the context (issue 9, item 6)."""
    commands: CommandsConfig = Field(default_factory=CommandsConfig)

    @model_validator(mode="after")
    def _refs_exist(self) -> AiConfig:
        for alias in self.providers:
            if not alias or "/" in alias:  # refs are "alias/model_id": the first "/" ends the alias
                raise ValueError(f"[providers.{alias}] a provider alias must be non-empty and contain no '/'")
        for key in ("default_model", "vision_model"):
            ref = getattr(self, key)
            if ref is not None:
                _split_ref(ref, self, key)
        for i, ref in enumerate(self.fallback_models):
            _split_ref(ref, self, f"fallback_models.{i}")
        return self


# --------------------------------------------------------------------------- the rest


class BotConfig(_Closed):
    """One ``bots:`` entry: a bot account on one platform. Secrets are env-var *names*."""

    platform: Literal["onebot11", "telegram", "console"]
    self_id: str = ""
    """The bot's own id on the platform (QQ number, Telegram bot id)."""
    api_base: str | None = None
    """Platform HTTP API base URL."""
    access_token_env: str | None = None
    secret_env: str | None = None
    token_env: str | None = None
    trigger: Literal["mention", "always", "keyword"] = "mention"
    keyword: str | None = None
    """Required with ``trigger: keyword``."""
    masters: list[str] = Field(default_factory=list)
    """User ids allowed to steer / follow_up."""
    username: str | None = None
    """Telegram: the bot's ``@username`` (without ``@``), to recognize mentions of it in groups."""
    media_dir: str | None = None
    """Directory that outbound ``path`` media must lie under (OneBot sends them as ``file://``)."""

    @field_validator("self_id", mode="before")
    @classmethod
    def _id_str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v

    @field_validator("masters", mode="before")
    @classmethod
    def _ids_str(cls, v: Any) -> Any:
        return [str(x) if isinstance(x, int) else x for x in v] if isinstance(v, list) else v

    @model_validator(mode="after")
    def _keyword_needed(self) -> BotConfig:
        if self.trigger == "keyword" and not self.keyword:
            raise ValueError("trigger: keyword needs a `keyword`")
        if self.platform == "console" and not self.self_id:
            self.self_id = "console"
        if not self.self_id:
            raise ValueError(f"a {self.platform} bot needs `self_id` (QQ number / Telegram bot id)")
        if self.platform == "telegram" and not self.token_env:
            raise ValueError("a telegram bot needs `token_env` (the variable holding the bot token)")
        return self


def default_bots() -> list[BotConfig]:
    """The embedded default ``bots:`` (no sessionray.yaml or no ``bots`` key): one console bot,
    ``self_id: console``, whose master is the console user ``admin`` (issue #6)."""
    return [BotConfig(platform="console", self_id="console", masters=["admin"])]


class DatabaseConfig(_Closed):
    """``database``: the SQL URL (SQLite by default; PostgreSQL on a multi-node cluster)."""

    url: str = "sqlite:///./data/sessionray.db"


class ServerConfig(_Closed):
    """``server``: the ingress HTTP server."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    admin_token_env: str | None = "SESSIONRAY_ADMIN_TOKEN"


class RuntimeConfig(_Closed):
    """``runtime``: actor topology and session lifecycle (DESIGN.md consequences 1-2)."""

    router_shards: int = Field(1, ge=1)
    delivery_actors: int = Field(2, ge=1)
    warm_pool: int = Field(4, ge=0)
    max_live_sessions: int = Field(64, ge=1)
    idle_ttl_s: float = Field(600, gt=0)
    """Seconds without a message before a session is passivated."""
    mailbox_size: int = Field(16, ge=1)
    """Accepted-but-unfinished messages per session; one more is refused as ``busy`` (503)."""
    busy_retry_after_s: float = Field(1.0, gt=0)
    """``Retry-After`` (seconds) suggested with a ``busy`` answer."""
    max_concurrent_turns: int = Field(4, ge=1)
    """Turns of one session that may overlap (seed 002 #12); 1 = strictly one after another."""
    activation_wait_s: float = Field(10.0, ge=0)
    """How long a new session waits for a free slot over ``max_live_sessions`` before ``busy``."""
    recycle_after_sessions: int = Field(100, ge=1)
    """A pooled SessionActor is replaced after serving this many sessions."""
    recycle_memory_mib: float = Field(512.0, gt=0)
    """A pooled SessionActor whose process USS exceeds this (MiB) is replaced when returned."""
    dedup_window: int = Field(10_000, ge=1)
    """(platform, bot_id, message_id) triples each router shard remembers for dedup."""


class Config(_Closed):
    """The whole ``sessionray.yaml``; every section has embedded defaults."""

    ai: AiConfig = Field(default_factory=AiConfig)
    bots: list[BotConfig] = Field(default_factory=default_bots)
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)

    @model_validator(mode="after")
    def _console_api_base(self) -> Config:
        """A console bot's "platform API" is this ingress: default its ``api_base`` to the server."""
        host = "127.0.0.1" if self.server.host in ("0.0.0.0", "::", "") else self.server.host
        for bot in self.bots:
            if bot.platform == "console" and not bot.api_base:
                bot.api_base = f"http://{host}:{self.server.port}"
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


def _split_ref(ref: str, ai: AiConfig, key: str = "model") -> tuple[str, str]:
    alias, sep, model_id = ref.partition("/")
    if not sep or not alias or not model_id:
        raise ValueError(f"[{key}] {ref!r} is not of the form provider_alias/model_id")
    if alias not in ai.providers:
        known = ", ".join(sorted(ai.providers)) or "(none configured)"
        raise ValueError(f"[{key}] provider alias {alias!r} is not in ai.providers (known: {known})")
    return alias, model_id


def get_model(provider_alias: str, model_id: str, config: Config | None = None) -> Model:
    """Return the :class:`~runtime.types.Model` for ``ai.providers.<provider_alias>`` / ``model_id``
    (seed 002, D1 ``getModel``).

    Provider ``compat`` and ``headers`` are merged under the model's own. A model id that the
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
        compat={**provider.compat, **entry.compat},
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

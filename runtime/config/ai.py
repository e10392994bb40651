"""``ai:`` of ``sessionray.yaml``: providers, models, agent modes, MCP servers, chat commands.

Part of :mod:`runtime.config` (which re-exports every public name here; import from there).
Also holds the shared base of every section (:class:`ConfigError`, closed models).
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from runtime.llm.types import InputKind, ModelCost

DEFAULT_CONTEXT_BUDGET_TOKENS = 8000
"""``ai.agent.context_budget_tokens`` when unset (equal to
:data:`runtime.agent.context_budget.DEFAULT_BUDGET_TOKENS`; a test keeps them equal)."""

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
"""The documented ``driver`` → ``api`` migration table (docs only, no runtime shim:
docs/decisions.md#llm-api-required)."""


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

ENTRY_POINT_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
"""The form of a Python ``module:attribute`` reference (``ai.python_tools``): a dotted module
path, a colon, one attribute name."""


class ConfigError(ValueError):
    """Invalid configuration; the message names the file and the dotted key path of each error."""


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _driver_hint(driver: Any) -> str:
    api = DRIVER_TO_API.get(str(driver).lower())
    if api:
        return f"use `api: {api}` instead"
    return f"use `api:` with one of {', '.join(KNOWN_APIS)}"


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
    structured_tier: Literal["native", "tool", "prompt"] | None = None
    """Pins the structured-output tier (no probe, no downgrade;
    docs/decisions.md#structured-capability-cache); ``None``: probed at first use."""
    context_budget_tokens: int | None = Field(None, ge=1)
    """Overrides ``ai.agent.context_budget_tokens`` for this model when set (``null`` set
    explicitly: no budget for this model; docs/decisions.md#agent-context-budget)."""


class ProviderLimits(_Closed):
    """``ai.providers.<alias>.limits``: what the provider's API key allows, granted for the whole
    cluster (docs/decisions.md#spend-provider-limits). Every key is optional; an unset one is not
    limited. Enforced by :mod:`runtime.spend.limits` (leases) through the gate of
    :mod:`runtime.llm.limits`."""

    concurrency: int | None = Field(None, ge=1)
    """Requests in flight at once, across every host."""
    rpm: int | None = Field(None, ge=1)
    """Requests per minute (a token bucket of this size refilled at ``rpm / 60`` per second)."""
    tpm: int | None = Field(None, ge=1)
    """Tokens per minute, input + output (estimated before a request, corrected by the usage the
    provider reports after it)."""
    max_wait_s: float = Field(60.0, gt=0, allow_inf_nan=False)
    """Seconds a call may wait for its lease; longer and it is refused (the turn gets the busy
    reply, ``ai.agent.busy_text``)."""

    def limited(self) -> bool:
        """Whether any of ``concurrency`` / ``rpm`` / ``tpm`` is set (otherwise nothing is gated)."""
        return any(v is not None for v in (self.concurrency, self.rpm, self.tpm))


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
    limits: ProviderLimits | None = None
    """Provider limits shared by the cluster (docs/decisions.md#spend-provider-limits); ``None``:
    no gate, each call only retries its own 429s."""
    script: str | None = None
    """``api: faux`` only: ``"package.module:function"`` answering every call to this provider's
    models — ``function(context, options)`` returns an ``AssistantMessage`` (sync or async); it is
    registered under the alias in every process (docs/decisions.md#faux-script-from-config)."""

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
        # (docs/decisions.md#config-secrets-by-name)
        if v is not None and (not _ENV_NAME.fullmatch(v) or v.startswith(("sk_", "AIza"))):
            raise ValueError(
                "must be the NAME of an environment variable holding the key (letters, digits, "
                "`_`; e.g. OPENAI_API_KEY), not the key itself"
            )
        return v

    @field_validator("api")
    @classmethod
    def _known_api(cls, v: str) -> str:
        from runtime.llm.registry import list_api_providers

        if v not in KNOWN_APIS and v not in list_api_providers():
            raise ValueError(f"unknown api {v!r}; known: {', '.join(KNOWN_APIS)}")
        return v

    @model_validator(mode="after")
    def _script_is_faux(self) -> ProviderConfig:
        if self.script is None:
            return self
        if self.api != "faux":
            raise ValueError(f"`script` is only for `api: faux` (this provider has api {self.api!r})")
        if not ENTRY_POINT_RE.fullmatch(self.script):
            raise ValueError(f"script {self.script!r} is not of the form 'package.module:function'")
        if not self.models:
            raise ValueError("a scripted faux provider needs `models` (the ids it answers for)")
        return self


class OutputSinkConfig(_Closed):
    """``ai.agent.output_sink``: where the validated answers of a custom ``output_schema`` go
    (``runtime.session.output_sink``; docs/decisions.md#structured-custom-schema)."""

    url: str | None = None
    """HTTP(S) callback that receives ``POST`` of each validated answer's JSON (``None``: none)."""
    transcript: bool = True
    """Record each validated answer in the session's transcript (``structured_output`` records)."""
    timeout_s: float = Field(10.0, gt=0)
    """Bound of each callback attempt in seconds."""
    attempts: int = Field(3, ge=1, le=10)
    """Callback attempts in all (a transport error, timeout, 429 or 5xx is retried)."""

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not v.lower().startswith(("http://", "https://")):
            raise ValueError(f"{v!r} must start with http:// or https://")
        return v

    @model_validator(mode="after")
    def _somewhere(self) -> OutputSinkConfig:
        if self.url is None and not self.transcript:
            raise ValueError("the answers would go nowhere: set `url`, or keep `transcript: true`")
        return self


class CoalesceConfig(_Closed):
    """``ai.agent.coalesce``: a hot chat's mentions are answered in batches
    (``runtime.session.coalesce``; docs/decisions.md#session-hot-chat-coalescing).

    Where it is on, the chat runs one turn at a time; the triggered messages that arrive while it
    runs wait (at most ``max_queue``) and the next turn answers up to ``max_batch`` of them at
    once. A message beyond ``max_queue`` is recorded as history and answered only by the busy
    notice (at most one per ``busy_notice_interval_s`` per chat).
    """

    groups: bool = True
    """Coalesce in group and channel chats."""
    private: bool = False
    """Coalesce in private chats."""
    max_batch: int = Field(8, ge=1, le=64)
    """Most messages one turn answers."""
    max_queue: int = Field(7, ge=1)
    """Messages that may wait for the next turn; one more gets the busy notice. The session
    host's ``runtime.mailbox_size`` counts the running batch too, so the bound in force is
    ``min(max_queue, runtime.mailbox_size - max_batch - 1)`` (at least 1)."""
    busy_notice: str = Field(
        "Too many questions at once; I could not take yours. Please ask again in a minute.", min_length=1
    )
    """The short reply a chat gets when its queue is full."""
    busy_notice_interval_s: float = Field(30.0, ge=0, allow_inf_nan=False)
    """At most one busy notice per chat in this many seconds; the overflowed messages in between
    are recorded and get no notice of their own."""

    def enabled_for(self, scope: str) -> bool:
        """Whether a chat of session-key scope ``scope`` (``private``, ``group``, ``channel``)
        coalesces."""
        return self.private if scope == "private" else self.groups

    def within_mailbox(self, mailbox_size: int) -> CoalesceConfig:
        """This config with ``max_queue`` capped to ``mailbox_size - max_batch - 1`` (at least
        1): a message over the queue then reaches the session and gets the busy notice, instead of
        the host's ``busy`` (docs/decisions.md#session-backpressure)."""
        cap = max(1, min(self.max_queue, mailbox_size - self.max_batch - 1))
        return self if cap == self.max_queue else self.model_copy(update={"max_queue": cap})


class AgentConfig(_Closed):
    """``ai.agent``: structured-reply and queue modes."""

    output_schema: Literal["segments", False] | dict[str, Any] | str = "segments"
    """``segments`` (the IM reply contract, docs/decisions.md#reply-segments), ``false`` (plain
    text), or a custom schema (docs/decisions.md#structured-custom-schema): a JSON Schema object, a
    ``"package.module:Model"`` pydantic model, or a path to a JSON file (made absolute at load)."""
    output_sink: OutputSinkConfig | None = None
    """Where a custom schema's answers go (``None``: the transcript only); only with a custom schema."""
    steering_mode: Literal["one-at-a-time", "all"] = "one-at-a-time"
    """How many queued steer messages each poll of the loop takes: the values of
    :data:`runtime.agent.agent.QueueMode` (docs/decisions.md#queue-modes), spelled here because the
    configuration imports no agent (docs/decisions.md#layout-forbidden-pairs); a test keeps the two
    equal."""
    follow_up_mode: Literal["one-at-a-time", "all"] = "one-at-a-time"
    """The same for queued follow_up messages."""
    compaction_threshold: float | None = Field(default=0.8, gt=0, le=1)
    """Share of the model's ``context_window`` above which older messages are summarized into
    ``agent_summaries`` before an LLM call (docs/decisions.md#memory-compaction); ``null`` turns
    compaction off."""
    context_budget_tokens: int | None = Field(default=DEFAULT_CONTEXT_BUDGET_TOKENS, ge=1)
    """Estimated tokens (calibrated by the provider's reported usage) one LLM call of a turn may
    send: system prompt, tools, compaction summary and the current turn always, then as much recent
    history as fits, newest first (docs/decisions.md#agent-context-budget); ``null``: no budget.
    A model's ``context_budget_tokens`` overrides it."""
    delegate: bool = False
    """Offer the ``delegate`` tool: a sub-agent on the session's model, with the business tools
    (``python_tools``, ``tools_dir``) and without the IM preset
    (docs/decisions.md#session-extra-tools)."""
    max_iterations: int | None = Field(16, ge=1)
    """Most LLM calls in one turn; when spent, one more call asks for a summary in the reply
    schema (docs/decisions.md#agent-iteration-budget). ``null``: unbounded."""
    failure_text: str | None = Field(None, min_length=1)
    """The fixed message sent when a turn cannot produce a valid reply
    (docs/decisions.md#reply-fixed-failure); ``null``: the built-in English text."""
    busy_text: str | None = Field(None, min_length=1)
    """The polite reply sent when a turn's model call waited longer than its provider's
    ``limits.max_wait_s`` (docs/decisions.md#spend-provider-limits); ``null``: the built-in
    English text."""
    abort_text: str | None = None
    """The fixed notice a chat gets when a master aborts its turn (nothing of the cut-off answer
    is sent; docs/decisions.md#agent-abort-valid-context); ``null``: the built-in English text,
    ``""``: nothing is sent."""
    pre_tools: list[str] = Field(default_factory=list)
    """``"module:function"`` references run in parallel before a turn's first LLM call; each gets
    the turn (``runtime.session.turn.TurnInput``) and returns text for the model or ``None``
    (sync or async; a sync one runs in a worker thread)."""
    deferred_tasks: dict[str, str] = Field(default_factory=dict)
    """Task name → ``"module:function"`` the model may hand off with ``run_deferred_task``; the
    function takes the task's arguments (a dict) and returns text, runs as a Ray task, and its
    result is sent as a separate message (docs/decisions.md#session-extra-tools)."""
    coalesce: CoalesceConfig = Field(default_factory=CoalesceConfig)
    """Hot-chat coalescing (docs/decisions.md#session-hot-chat-coalescing); on for groups."""

    @field_validator("output_schema")
    @classmethod
    def _schema_ref(cls, v: Any) -> Any:
        if isinstance(v, str) and v != "segments" and not ENTRY_POINT_RE.fullmatch(v):
            if not v.strip():
                raise ValueError("expected `segments`, false, a JSON Schema, `module:Model` or a file path")
            return os.path.abspath(os.path.expanduser(v))  # a path: the same in every process
        return v

    @model_validator(mode="after")
    def _sink_needs_schema(self) -> AgentConfig:
        if self.output_sink is not None and self.output_schema in ("segments", False):
            raise ValueError("output_sink is only used with a custom output_schema")
        return self

    @field_validator("pre_tools")
    @classmethod
    def _pre_tool_refs(cls, v: list[str]) -> list[str]:
        bad = [r for r in v if not ENTRY_POINT_RE.fullmatch(r)]
        if bad:
            raise ValueError(f"not of the form 'package.module:function': {', '.join(map(repr, bad))}")
        return v

    @field_validator("deferred_tasks")
    @classmethod
    def _deferred_refs(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [f"{k}: {r!r}" for k, r in v.items() if not ENTRY_POINT_RE.fullmatch(r)]
        if bad:
            raise ValueError(f"not of the form 'package.module:function': {', '.join(bad)}")
        return v


class McpServerConfig(_Closed):
    """``ai.mcp_servers.<name>``: one MCP server (``runtime.session.mcp_tools``;
    docs/decisions.md#mcp-lazy-connect).

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
    """Tool permissions of every tool of this server (``runtime.config.tool_permissions``;
    ``None``: no limit)."""
    scopes: list[str] | None = None
    required_any_role: list[str] | None = None

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (stdio) or `url` (streamable HTTP)")
        from runtime.config.tool_permissions import ToolPermissions

        ToolPermissions.from_mapping(self.model_dump())  # raises ValueError naming the key
        return self


class CommandsConfig(_Closed):
    """``ai.commands``: chat commands handled before the agent (``runtime.session.commands``)."""

    enabled: bool = True
    names: dict[str, str] = Field(default_factory=dict)
    """Command → the word users type (without ``/``), e.g. ``{new: reset}``; unset ones keep their name."""
    texts: dict[str, str] = Field(default_factory=dict)
    """Reply texts by key (see ``runtime.session.commands.DEFAULT_TEXTS``)."""


class AiConfig(_Closed):
    """``ai``: models and providers."""

    default_model: str | None = None
    """``provider_alias/model_id``; ``None``: the built-in offline model."""
    vision_model: str | None = None
    """Used instead of the default when a turn carries images (docs/decisions.md#model-routing)."""
    fallback_models: list[str] = Field(default_factory=list)
    image_model: str | None = None
    """``provider_alias/model_id`` of an image model on an OpenAI-compatible Images API; sessions
    of bots with a ``media_dir`` then get the ``generate_image`` tool
    (docs/decisions.md#llm-image-generation)."""
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    mcp_servers: dict[str, McpServerConfig] = Field(default_factory=dict)
    """MCP servers whose tools every session may use."""
    tools_dir: str | None = None
    """Folder of ``*.tool.md`` tools loaded at start-up (hard fail on errors:
    docs/decisions.md#tool-md-hard-fail)."""
    python_tools: list[str] = Field(default_factory=list)
    """``module:attribute`` references of Python ``AgentTool`` s (a tool, a list of them, or a
    function returning either), imported at start-up and in every session host
    (``runtime.session.python_tools``; hard fail on errors: docs/decisions.md#tool-md-hard-fail)."""
    media_url_allowlist: list[str] = Field(default_factory=list)
    """URL prefixes a reply may attach without them appearing in the context
    (docs/decisions.md#reply-media-provenance)."""
    commands: CommandsConfig = Field(default_factory=CommandsConfig)
    probe_on_start: bool = False
    """Probe every configured model's structured-output tier when the runtime starts (else at the
    first use by a session; docs/decisions.md#structured-capability-cache)."""
    capability_ttl_s: float | None = Field(default=7 * 24 * 3600.0, gt=0)
    """Age in seconds after which a probed or downgraded tier is probed again; ``null``: never."""
    downgrade_after: int = Field(default=2, ge=1)
    """Consecutive off-schema answers at a tier that move a model to the next tier
    (docs/decisions.md#structured-downgrade-on-evidence)."""

    @field_validator("python_tools")
    @classmethod
    def _entry_points(cls, v: list[str]) -> list[str]:
        for i, ref in enumerate(v):
            if not ENTRY_POINT_RE.fullmatch(ref):
                raise ValueError(f"[{i}] {ref!r} is not of the form 'package.module:attribute'")
        return v

    @model_validator(mode="after")
    def _refs_exist(self) -> AiConfig:
        for alias in self.providers:
            if not alias or "/" in alias:  # refs are "alias/model_id": the first "/" ends the alias
                raise ValueError(f"[providers.{alias}] a provider alias must be non-empty and contain no '/'")
        for key in ("default_model", "vision_model", "image_model"):
            ref = getattr(self, key)
            if ref is not None:
                _split_ref(ref, self, key)
        for i, ref in enumerate(self.fallback_models):
            _split_ref(ref, self, f"fallback_models.{i}")
        return self


def _split_ref(ref: str, ai: AiConfig, key: str = "model") -> tuple[str, str]:
    alias, sep, model_id = ref.partition("/")
    if not sep or not alias or not model_id:
        raise ValueError(f"[{key}] {ref!r} is not of the form provider_alias/model_id")
    if alias not in ai.providers:
        known = ", ".join(sorted(ai.providers)) or "(none configured)"
        raise ValueError(f"[{key}] provider alias {alias!r} is not in ai.providers (known: {known})")
    return alias, model_id

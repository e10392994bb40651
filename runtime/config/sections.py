"""``bots:``, ``database:``, ``server:`` and ``runtime:`` of ``sessionray.yaml``.

Part of :mod:`runtime.config` (which re-exports every public name here; import from there).
"""

from __future__ import annotations

import math
import os
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from runtime.config.ai import _Closed
from runtime.config.policy import RateLimitConfig


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
    """User ids allowed to steer / follow_up (console: with the master token only)."""
    master_token_env: str | None = None
    """Console: the variable whose value a console master must send (``X-Console-Master-Token``)
    to act as a master; a name in ``masters`` alone grants nothing. Unset: the admin token's
    variable, ``server.admin_token_env`` (docs/decisions.md#security-console-master-proof)."""
    username: str | None = None
    """Telegram: the bot's ``@username`` (without ``@``), to recognize mentions of it in groups."""
    media_dir: str | None = None
    """Directory that outbound ``path`` media must lie under (OneBot sends them as ``file://``).
    A relative one is made absolute against the working directory of the process that loads the
    configuration (``sessionray serve``), so delivery actors, whose working directory may differ,
    confine to the same place; ``~`` is expanded."""
    thinking_preview: bool = False
    """Console: also show the first 200 characters of the model's thinking in the live events."""
    forward_api: bool = False
    """OneBot: the implementation has ``send_group_forward_msg`` / ``send_private_forward_msg``
    (NapCat, Lagrange, LLOneBot); outbound ``forward`` segments go through them, else as text
    (docs/decisions.md#platform-forward-api)."""
    allow_groups: list[str] = Field(default_factory=list)
    """Group/channel ids the bot answers in (empty: every group). Inbound policy:
    docs/decisions.md#platform-inbound-policy."""
    deny_groups: list[str] = Field(default_factory=list)
    """Group/channel ids the bot never answers in (wins over ``allow_groups``)."""
    allow_users: list[str] = Field(default_factory=list)
    """Sender ids the bot answers (empty: everyone); private chats and groups alike."""
    deny_users: list[str] = Field(default_factory=list)
    """Sender ids the bot never answers (wins over ``allow_users``)."""
    rate_limit: RateLimitConfig | None = None
    """Per-user / per-group token buckets (None: no limit)."""
    transport: Literal["http", "ws-reverse", "ws-forward"] = "http"
    """OneBot v11: how events arrive and API calls leave. ``http`` (events POSTed to the webhook,
    API calls to ``api_base``); ``ws-reverse`` (the implementation dials
    ``/onebot/v11/ws`` of the ingress); ``ws-forward`` (the ingress dials ``ws_url``)."""
    ws_url: str | None = None
    """OneBot v11 ``transport: ws-forward``: the implementation's WebSocket server, e.g.
    ``ws://127.0.0.1:3001`` (required there, unused otherwise)."""
    max_connections: int = Field(4, ge=1, strict=True)
    """HTTP connections all delivery actors together open at most to ``api_base`` (each actor its
    share, rounded up); a reply waits for a free one. 4: a small server's listen backlog (5 for
    Python's ``http.server``) is not overrun by one bot's replies
    (docs/decisions.md#delivery-connections)."""
    mode: Literal["webhook", "polling"] = "webhook"
    """Telegram: how updates arrive — ``webhook`` (Telegram POSTs to ``/webhooks/telegram/{id}``;
    needs public HTTPS) or ``polling`` (one ``getUpdates`` long-poll loop per bot across the
    cluster: :mod:`actors.inbound.telegram_poll`). Only Telegram bots may poll."""
    poll_timeout_s: int = Field(30, ge=0, le=300, strict=True)
    """Telegram polling: the ``timeout`` of each ``getUpdates`` long poll, in seconds (0: short
    polling, for tests only)."""
    allowed_updates: list[str] | None = None
    """Telegram polling: the update types asked for (``allowed_updates``); None: the types the
    codec handles (``runtime.platforms.telegram_inbound.HANDLED_UPDATES``)."""

    @field_validator("self_id", mode="before")
    @classmethod
    def _id_str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v

    @field_validator("media_dir")
    @classmethod
    def _absolute_media_dir(cls, v: str | None) -> str | None:
        return None if v is None else os.path.abspath(os.path.expanduser(v))

    @field_validator("masters", "allow_groups", "deny_groups", "allow_users", "deny_users", mode="before")
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
        if self.master_token_env and self.platform != "console":
            raise ValueError("`master_token_env` is for console bots only")
        if self.transport != "http" and self.platform != "onebot11":
            raise ValueError(f"transport: {self.transport} is for onebot11 bots only")
        if self.transport == "ws-forward" and not (self.ws_url or "").startswith(("ws://", "wss://")):
            raise ValueError("transport: ws-forward needs `ws_url` (ws:// or wss://)")
        if self.platform == "telegram" and not self.token_env:
            raise ValueError("a telegram bot needs `token_env` (the variable holding the bot token)")
        if self.mode == "polling" and self.platform != "telegram":
            raise ValueError(f"`mode: polling` is for telegram bots only (this bot is {self.platform})")
        return self


def default_bots() -> list[BotConfig]:
    """The embedded default ``bots:`` (no sessionray.yaml or no ``bots`` key): one console bot,
    ``self_id: console``, whose master is the console user ``admin``
    (docs/decisions.md#platform-console-default)."""
    return [BotConfig(platform="console", self_id="console", masters=["admin"])]


class DatabaseConfig(_Closed):
    """``database``: the SQL URL (SQLite by default; PostgreSQL on a multi-node cluster)."""

    url: str = "sqlite:///./data/sessionray.db"


class ServerConfig(_Closed):
    """``server``: the ingress HTTP server."""

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    admin_token_env: str | None = "SESSIONRAY_ADMIN_TOKEN"
    max_body_bytes: int = Field(1_048_576, gt=0, strict=True)
    """Largest request body (bytes) on every route of the ingress; a larger one is answered 413."""
    max_text_chars: int = Field(16_000, gt=0, strict=True)
    """Largest text (characters, after decoding) of an inbound message; a longer one is answered
    413 and neither stored nor routed."""


class DeliveryConfig(_Closed):
    """``delivery``: how replies wait out platform outages (docs/decisions.md#delivery-outage)."""

    max_age_s: float = Field(3600.0, gt=0)
    """A reply still not sent this many seconds after its turn recorded it is ``failed`` (counted,
    logged, listed by ``GET /admin/deliveries``; an operator may retry it)."""
    backoff_base_s: float = Field(0.5, gt=0)
    """First wait before retrying a 429/5xx/connection failure, in seconds; doubles per retry
    (full jitter: a random wait between 0 and that)."""
    backoff_max_s: float = Field(60.0, gt=0)
    """Longest wait between two tries without a ``Retry-After``, in seconds (the platform's
    ``Retry-After`` is honoured as given)."""
    timeout_s: float = Field(30.0, gt=0)
    """HTTP timeout of one platform call, in seconds (a call written and not answered in time is
    ``uncertain``, never resent by itself)."""
    sweep_s: float = Field(30.0, ge=0)
    """How often each delivery actor looks for queued replies nobody told it about, in seconds
    (0: only when it starts)."""


SINGLE_MACHINE_RUNTIME = {"min_hosts": 1, "delivery_actors": 1, "deliver_in_host": True}
"""The ``runtime`` keys the single-machine profile changes when the configuration leaves them
unset (:meth:`RuntimeConfig.single_machine`, docs/decisions.md#ops-single-machine-profile);
``deliver_in_host`` only on SQLite (measured slower on PostgreSQL: docs/decisions.md#delivery-in-host)."""


class RuntimeConfig(_Closed):
    """``runtime``: actor topology and session lifecycle (docs/decisions.md#session-hosts)."""

    router_shards: int = Field(1, ge=1)
    delivery_actors: int = Field(2, ge=1)
    """Delivery actors (processes) sharing the replies by chat; a local Ray (no ``--address``) uses 1
    unless set (docs/decisions.md#ops-single-machine-profile)."""
    deliver_in_host: bool = False
    """A session host sends a reply that is its chat's only unfinished one (of a bot over HTTP,
    without attachments) itself, in its own process, instead of through the chat's delivery
    actor: one Ray call less on the message's path. Every other reply, and every reply of a dead
    host, goes through the delivery actors. A local Ray (no ``--address``) uses true unless set
    (docs/decisions.md#delivery-in-host, docs/decisions.md#ops-single-machine-profile)."""
    sessions_per_host: int = Field(2000, ge=1)
    """Live sessions one ``SessionHost`` process holds at most; 1 = a process per live session
    (strict isolation; docs/decisions.md#session-hosts)."""
    min_hosts: int = Field(2, ge=1)
    """Session hosts started ahead of need; the supervisor also keeps
    ``max(min_hosts, sessions_per_host / 4)`` free slots by starting more, up to the host limit.
    A local Ray (no ``--address``) uses 1 unless set (docs/decisions.md#ops-single-machine-profile)."""
    host_memory_mib: float = Field(4096.0, gt=0)
    """A host whose process USS is above this (MiB) takes no more sessions (an activation then
    passivates one of its idle sessions or goes to another host)."""
    max_live_sessions: int = Field(10_000, ge=1)
    idle_ttl_s: float = Field(600, gt=0)
    """Seconds without a message before a session is passivated."""
    mailbox_size: int = Field(16, ge=1)
    """Accepted-but-unfinished messages per session; one more is refused as ``busy`` (503)."""
    busy_retry_after_s: float = Field(1.0, gt=0)
    """``Retry-After`` (seconds) suggested with a ``busy`` answer."""
    max_concurrent_turns: int = Field(4, ge=1)
    """Turns of one session that may overlap (docs/decisions.md#session-concurrent-turns); 1 =
    strictly one after another."""
    activation_wait_s: float = Field(10.0, ge=0)
    """How long a new session waits for room on a host (every host full of busy sessions)
    before ``busy``."""
    dedup_window: int = Field(10_000, ge=1)
    """(platform, bot_id, message_id) triples each session host remembers for dedup."""
    hung_ping_timeout_s: float = Field(30.0, gt=0)
    """Seconds the host supervisor waits for a host's ``ping_turn`` (its sessions' event loop); a
    host that does not answer is killed and its sessions re-activated elsewhere (crash path)."""
    shutdown_grace_s: float = Field(10.0, ge=0)
    """On SIGTERM/SIGINT, ``sessionray serve`` stops accepting events, then waits at most this many
    seconds for the turns in flight to end and the delivery actors to send what they hold before it
    stops the runtime (docs/decisions.md#ops-graceful-shutdown); what is left is replayed by the
    next start."""

    orphaned_ray_keep_s: float = Field(300.0, ge=0)
    """The local Ray that ``sessionray serve`` starts outlives a driver killed with ``kill -9``; the
    next serve with the same configuration and code joins it, its actors still running. Once no
    live serve has named it for this many seconds it is stopped
    (docs/decisions.md#ops-ray-outlives-driver)."""

    replay_window_s: float = Field(600.0, gt=0)
    """Seconds an inbox row may wait for its turn: a stored or routed message younger than this
    whose turn result never came is routed again by the recovery loop; an older one is expired
    (logged, counted), never replayed (docs/decisions.md#inbox-durable)."""

    def single_machine(self, database_url: str | None = None) -> RuntimeConfig:
        """This section under the single-machine profile: every key of
        :data:`SINGLE_MACHINE_RUNTIME` the configuration did not set takes the profile's value
        (one session host, one delivery actor: one machine idles on ≈ 175 MiB less; on SQLite
        — ``database_url`` None is the default file — the hosts send their chats' head replies
        themselves: one Ray call less a message; docs/decisions.md#ops-single-machine-profile).
        Keys set in the file are kept as given."""
        unset = {k: v for k, v in SINGLE_MACHINE_RUNTIME.items() if k not in self.model_fields_set}
        if not (database_url or "sqlite").startswith("sqlite"):  # ``database.url``: None is the default file
            unset.pop("deliver_in_host", None)
        return self.model_copy(update=unset) if unset else self

    def host_capacity(self) -> tuple[int, int]:
        """``(sessions per host, most hosts)``: the host supervisor's limits for this section
        (docs/decisions.md#session-hosts), also the host count of the PostgreSQL connection budget
        (docs/decisions.md#memory-connection-budget).

        ``most hosts = max(min_hosts, ceil(max_live_sessions / min(sessions_per_host,
        max_live_sessions)))`` and each host holds ``min(sessions_per_host, ceil(max_live_sessions /
        most hosts))``, so all hosts together hold ``max_live_sessions`` (rounded up to a whole
        number per host). The defaults give ``(2000, 5)``."""
        per = min(self.sessions_per_host, self.max_live_sessions)
        most = max(self.min_hosts, math.ceil(self.max_live_sessions / per))
        return min(self.sessions_per_host, math.ceil(self.max_live_sessions / most)), most

"""The platform codec interface: inbound HTTP event → :class:`InboundMessage`, :class:`Reply` → API calls.

A codec is Ray-free and socket-free (house style, after httpx: "codecs know nothing of
sockets"). The ingress hands it the raw webhook request (headers + body bytes); a
DeliveryActor hands it a validated :class:`~runtime.reply.segments.Reply` and performs the returned
:class:`ApiCall` list itself, in order, then asks the codec to read each HTTP answer with
:meth:`PlatformCodec.parse_send_result`.

Flow::

    ingress:   codec.verify(headers, body)            # SignatureError → HTTP 401, nothing stored
               msg = codec.parse(headers, body)       # MalformedEvent → HTTP 400, nothing stored
               msg is None                            # heartbeat / notice: HTTP 200 (or 204), ignored
               msg.triggered is False                 # stored in transcripts, no agent turn
    delivery:  for call in codec.render(reply, RenderTarget(...)):
                   status, headers, body = <HTTP call.method base_url+call.path>
                   result = codec.parse_send_result(status, headers, body)

Segments are the canonical dicts ``{"type": ..., "data": {...}}``
(docs/decisions.md#reply-segments). Inbound media is expressed with the same
``media: {kind, value}`` shape (``url`` for downloadable links, ``file`` for an opaque platform
reference such as a Telegram ``file_id``).

Every codec declares :attr:`PlatformCodec.supported_segments`; a segment type outside that set is
degraded to text **explicitly** by the codec and counted in
``metrics.SEGMENTS_DEGRADED{platform, type}`` (never dropped silently:
docs/decisions.md#platform-degrade-explicitly); see :func:`count_degraded`.

The codec registry maps ``bot_config.platform`` to a factory: :func:`register_codec` /
:func:`get_codec`. The three built-in codecs (``onebot11``, ``telegram``, ``console``) are
registered lazily on the first :func:`get_codec` call.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from runtime import metrics
from runtime.reply.segments import Reply

__all__ = [
    "ApiCall",
    "BotSettings",
    "InboundMessage",
    "MalformedEvent",
    "MultipartFile",
    "PlatformCodec",
    "RenderTarget",
    "SceneType",
    "SendResult",
    "Sender",
    "SignatureError",
    "UnknownPlatformError",
    "count_degraded",
    "get_codec",
    "header",
    "read_env",
    "register_codec",
    "registered_platforms",
]

SceneType = Literal["private", "group", "channel"]
"""Where a message was said: a private chat, a group, or a broadcast channel."""


class SignatureError(Exception):
    """The webhook's signature / secret token is missing or wrong (ingress answers HTTP 401)."""


class MalformedEvent(ValueError):
    """The webhook body is not a well-formed event of the platform (ingress answers HTTP 400)."""


class UnknownPlatformError(ValueError):
    """``bot_config.platform`` names no registered codec."""


# --------------------------------------------------------------------------- inbound


class Sender(BaseModel):
    """Who sent an inbound message."""

    model_config = ConfigDict(frozen=True)

    id: str
    """The platform user id, as a string (OneBot QQ number, Telegram user id, console name)."""
    name: str = ""
    """Display name (group card or nickname; Telegram first + last name); may be empty."""
    roles: list[str] = Field(default_factory=list)
    """Platform roles, e.g. ``["owner"]``, ``["admin"]``, ``["member"]``; codecs add ``"master"``
    when the sender is one of the bot's configured masters
    (:func:`runtime.platforms.common.with_master_role`)."""


class InboundMessage(BaseModel):
    """One inbound platform message, normalized (docs/decisions.md#platform-codecs).

    Times are Unix epoch **milliseconds**. Ids are strings even where the platform sends numbers.
    """

    model_config = ConfigDict(frozen=True)

    platform: str
    """Codec name: ``onebot11`` | ``telegram`` | ``console``."""
    bot_id: str
    """The bot's own id on the platform (OneBot ``self_id``, Telegram bot user id, console bot id)."""
    message_id: str
    """The message id, unique per bot (dedup key together with platform and bot_id; the
    transcript's ``UNIQUE``). OneBot: the platform id as is; Telegram, whose ids are unique only
    per chat: ``"<chat_id>:<message_id>"`` (``reply_to`` and ``reply`` segments keep native ids)."""
    scene_type: SceneType
    """``private`` | ``group`` | ``channel`` (Telegram ``supergroup`` is a ``group``)."""
    scene_id: str
    """Group/chat id; for private scenes the peer's user id."""
    sender: Sender
    text: str
    """Plain text of the message: text segments concatenated, mentions as ``@<id>``, no media."""
    segments: list[dict[str, Any]] = Field(default_factory=list)
    """Canonical segments, in order, including inbound media (``media: {kind, value}``)."""
    reply_to: str | None = None
    """Id of the message this one quotes/replies to, if any."""
    mentioned_bot: bool = False
    """True when the message mentions the bot (OneBot ``at`` of ``self_id``, Telegram mention
    entity of the bot username / ``text_mention`` of its id, a reply to the bot's message)."""
    triggered: bool = True
    """Whether the bot should answer (an agent turn runs). Private scenes: always True. Groups:
    per the bot's ``trigger`` mode (``always`` | ``mention`` | ``keyword``). An un-triggered group
    message is still an accepted message (stored in transcripts for chat_history), but no turn runs."""
    time_ms: int
    """When the platform says the message was sent, Unix epoch ms."""
    traceparent: str | None = None
    """W3C ``traceparent`` of the ingress's ``webhook`` span (None: not traced). Set by the
    ingress, carried through Ray with the message and kept in its inbox row's JSON, so a replay
    links to its first attempt (docs/decisions.md#ops-traces)."""

    @property
    def session_key(self) -> str:
        """``"{platform}:{bot_id}:{scope}:{scene_id}"`` built with ``runtime.keys.make_session_key``
        (scope = scene_type; a private scene's id is the peer's id)."""
        from runtime.keys import make_session_key

        return make_session_key(self.platform, self.bot_id, self.scene_type, self.scene_id)


# --------------------------------------------------------------------------- outbound


class RenderTarget(BaseModel):
    """Where a reply goes (taken from the DeliveryJob)."""

    model_config = ConfigDict(frozen=True)

    scene_type: SceneType
    scene_id: str
    """Group/chat id; for private scenes the peer's user id."""
    reply_to: str | None = None
    """The inbound message being answered. Codecs quote it in group/channel scenes when the
    reply has no ``reply`` segment of its own (private chats are not quoted)."""


class MultipartFile(BaseModel):
    """One uploaded file of a multipart/form-data request."""

    model_config = ConfigDict(frozen=True)

    filename: str
    content_type: str
    data: bytes


class ApiCall(BaseModel):
    """One platform HTTP API call, ready to send (the DeliveryActor sends it as is).

    Exactly one of ``json`` or (``form`` and/or ``files``) is set for a POST with a body.
    ``url`` = ``base_url`` + ``path``.
    """

    model_config = ConfigDict(frozen=True)

    method: str = "POST"
    base_url: str
    """The bot's API base, e.g. ``http://127.0.0.1:5700`` or ``https://api.telegram.org``."""
    path: str
    """URL path starting with ``/``, e.g. ``/send_group_msg`` or ``/bot<token>/sendMessage``."""
    json_body: dict[str, Any] | None = None
    """JSON body (sent with ``Content-Type: application/json``)."""
    form: dict[str, str] | None = None
    """Multipart text fields (used together with ``files``)."""
    files: dict[str, MultipartFile] | None = None
    """Multipart file fields by form field name."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers, e.g. ``Authorization: Bearer <access_token>``."""
    kind: str = "message"
    """What the call sends, for logs/tests: ``message`` | ``photo`` | ``dice`` | ... (no secrets)."""

    @property
    def url(self) -> str:
        """The absolute URL: ``base_url`` without trailing ``/`` + ``path``."""
        return self.base_url.rstrip("/") + self.path


class SendResult(BaseModel):
    """The platform's answer to one :class:`ApiCall`."""

    model_config = ConfigDict(frozen=True)

    ok: bool
    message_id: str | None = None
    """Id of the sent message, when the platform returns one."""
    error: str | None = None
    """The platform's own wording of the failure (e.g. OneBot ``wording``/``message``, Telegram
    ``description``), prefixed with the code."""
    retry_after_s: float | None = None
    """Seconds to wait before retrying (HTTP ``Retry-After`` or Telegram ``parameters.retry_after``)."""
    retryable: bool = False
    """True for transient failures (HTTP 429 and 5xx); False for permanent ones (bad request,
    unknown API, OneBot retcode ≠ 0/1)."""


# --------------------------------------------------------------------------- codec protocol


@runtime_checkable
class PlatformCodec(Protocol):
    """Translate one platform's webhook events and API calls (contract 1 of the actor interfaces)."""

    platform: str
    """The platform name, ``onebot11`` | ``telegram`` | ``console`` (also the metrics label)."""
    supported_segments: frozenset[str]
    """Segment types sent natively; any other type is degraded to text and counted."""

    def verify(self, headers: Mapping[str, str], body: bytes) -> None:
        """Check the webhook's signature / secret token. Raises :class:`SignatureError`."""
        ...

    def parse(self, headers: Mapping[str, str], body: bytes) -> InboundMessage | None:
        """Parse a verified webhook body. ``None`` = accepted and ignored (heartbeat, notice).
        Raises :class:`MalformedEvent`."""
        ...

    def render(self, reply: Reply, target: RenderTarget) -> list[ApiCall]:
        """Turn a validated reply into API calls, in send order (empty reply → ``[]``)."""
        ...

    def parse_send_result(self, status: int, headers: Mapping[str, str], body: bytes) -> SendResult:
        """Read the platform's HTTP answer to one :class:`ApiCall`."""
        ...


class BotSettings(Protocol):
    """The attributes of a ``bots:`` entry (``runtime.config``) the codecs read."""

    platform: str
    self_id: str


# --------------------------------------------------------------------------- helpers


def header(headers: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive header lookup in a plain dict or a starlette ``Headers``; None if absent."""
    value = headers.get(name)
    if value is not None:
        return value
    lower = name.lower()
    for k, v in headers.items():
        if k.lower() == lower:
            return v
    return None


def read_env(var: str | None, *, what: str) -> str | None:
    """Read a secret from the environment variable named ``var`` (None when ``var`` is None).

    Raises:
        ValueError: ``var`` is set but the environment variable is missing or empty
            (the message names the variable and what it is for, never a value).
    """
    if not var:
        return None
    value = os.environ.get(var)
    if not value:
        raise ValueError(f"environment variable {var} ({what}) is not set")
    return value


def count_degraded(platform: str, segment_type: str) -> None:
    """Count one segment a platform cannot send natively and degraded to text
    (``sessionray_segments_degraded_total{platform, type}``; never a silent drop:
    docs/decisions.md#platform-degrade-explicitly)."""
    metrics.SEGMENTS_DEGRADED.inc(platform=platform, type=segment_type)


# --------------------------------------------------------------------------- registry

CodecFactory = Callable[[Any], PlatformCodec]
"""Builds a codec from one ``bots:`` config entry."""

_BUILTIN = {
    "onebot11": "runtime.platforms.onebot11",
    "telegram": "runtime.platforms.telegram",
    "console": "runtime.platforms.console",
}
_factories: dict[str, CodecFactory] = {}
_lock = threading.Lock()


def register_codec(platform: str, factory: CodecFactory) -> None:
    """Register (or replace) the codec factory for ``platform``."""
    with _lock:
        _factories[platform] = factory


def registered_platforms() -> list[str]:
    """Names of every known platform (built-ins included), sorted."""
    return sorted(set(_factories) | set(_BUILTIN))


def get_codec(bot_config: Any) -> PlatformCodec:
    """Build the codec for one ``bots:`` entry (anything with ``.platform`` and the fields its
    codec reads, normally ``runtime.config.BotConfig``).

    Built-in modules register themselves (``CODEC_FACTORY``) on first use.

    Raises:
        UnknownPlatformError: no codec for ``bot_config.platform``.
        ValueError: a configured secret's environment variable is missing.
    """
    platform = str(bot_config.platform)
    with _lock:
        factory = _factories.get(platform)
    if factory is None and platform in _BUILTIN:
        module = importlib.import_module(_BUILTIN[platform])
        factory = module.CODEC_FACTORY
        register_codec(platform, factory)
    if factory is None:
        raise UnknownPlatformError(
            f"unknown platform {platform!r} in bots: config; known: {', '.join(registered_platforms())}"
        )
    return factory(bot_config)

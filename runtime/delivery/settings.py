"""What a delivery actor is configured with and answers: :class:`DeliverySettings` (from the
``delivery:`` and ``bots:`` config), :class:`DeliveryResult`, the stable partition of a chat
(:func:`partition_of`) and the per-bot lookups of :class:`runtime.delivery.core.DeliverySender`
(which re-exports every public name here; :func:`partition_of` itself lives in
:mod:`runtime.delivery.job`, which a session host imports). Nothing here imports Ray or an HTTP client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from runtime.delivery.job import partition_of
from runtime.platforms.base import ApiCall, PlatformCodec, SendResult
from runtime.platforms.common import setting
from runtime.reply.leak import LeakPolicy
from runtime.reply.media import MediaPolicy
from runtime.reply.segments import AudioSegment, FileSegment, ImageSegment, Reply, VideoSegment

__all__ = [
    "DeliveryResult",
    "DeliverySettings",
    "SocketSender",
    "bot_id_of",
    "bot_key",
    "bot_media_policy",
    "has_media",
    "partition_of",
]

SocketSender = Callable[[PlatformCodec, str, ApiCall, float], Awaitable[SendResult]]
"""Sends one call of a bot whose transport is a socket: ``(codec, bot_id, call, timeout_s) →
SendResult`` (a never-sent call is a retryable ``connect:`` failure; a sent, unanswered one a
``transport:`` failure: uncertain)."""


class DeliveryResult(BaseModel):
    """What happened to one :class:`DeliveryJob`.

    ``outcome``: ``sent`` (every step confirmed), ``uncertain`` (every step handled, at least one
    of them may or may not have arrived: docs/decisions.md#delivery-uncertain), ``empty`` (the
    reply had no segments: nothing to send), ``failed`` (a step failed for good, or the reply grew
    older than ``delivery.max_age_s`` while its platform failed; the steps before it were sent),
    ``duplicate`` (the ledger already had a final row: nothing sent now; ``message_ids``/``error``
    are the recorded ones), ``busy`` (another live actor owns it).
    """

    reply_id: str
    outcome: Literal["sent", "uncertain", "empty", "failed", "duplicate", "busy"]
    message_ids: list[str | None] = Field(default_factory=list)
    """The platform's message id per step (``None``: none returned, or an uncertain step)."""
    attempts: int = 0
    """HTTP calls made by this invocation (retries included)."""
    waits_s: list[float] = Field(default_factory=list)
    """Each back-off this invocation waited before a retry, in seconds."""
    error: str | None = None


class DeliverySettings(BaseModel):
    """Everything a DeliveryActor needs (picklable; built from ``runtime.config`` by
    :meth:`from_config`)."""

    database_url: str | None = None
    """SQL URL of the ledger and transcripts (None: the default SQLite file)."""
    bots: list[Any] = Field(default_factory=list)
    """The ``bots:`` config entries (anything :func:`runtime.platforms.base.get_codec` accepts)."""
    max_age_s: float = 3600.0
    """``delivery.max_age_s``: a reply whose platform keeps failing is retried until it is this
    old (seconds since its turn recorded it), then it is ``failed``."""
    backoff_base_s: float = 0.5
    """``delivery.backoff_base_s``: the first back-off in seconds; doubles per retry, full jitter."""
    backoff_max_s: float = 60.0
    """``delivery.backoff_max_s``: the longest back-off without a ``Retry-After``, in seconds."""
    timeout_s: float = 30.0
    """``delivery.timeout_s``: HTTP timeout of one platform call, in seconds."""
    actors: int = 1
    """How many senders share a bot's ``bots[].max_connections``: ``runtime.delivery_actors``, plus
    the most session hosts with ``runtime.deliver_in_host`` (:func:`senders`;
    docs/decisions.md#delivery-connections)."""
    sweep_s: float = 30.0
    """``delivery.sweep_s``: period of a delivery actor's look for work nobody told it about."""
    lease_s: float = 60.0
    """How long a reply stays owned by an actor without a ledger write before another may take it
    over (at least ``timeout_s`` + 10 s; an actor waiting out an outage renews it)."""
    media: Any = None
    """Media settings passed to ``runtime.reply.media`` (a ``MediaPolicy``; None: its defaults). A bot's
    own ``media_dir`` (``bots[].media_dir``) replaces its ``media_dir`` for that bot's replies."""
    tracing: Any = None
    """The ``tracing`` config section (None: off; docs/decisions.md#ops-traces)."""
    leak: LeakPolicy = Field(default_factory=LeakPolicy)
    """Outbound leak check (outbound text, Markdown and nested strings pass the leak check:
    docs/decisions.md#security-leak-check); :meth:`from_config` fills it with the values of every
    secret variable the config names."""

    @classmethod
    def from_config(cls, config: Any) -> DeliverySettings:
        """Build settings from a ``runtime.config.Config`` (``database.url``, ``bots``,
        ``delivery``)."""
        database = getattr(config, "database", None)
        section = getattr(config, "delivery", None)
        knobs = ("max_age_s", "backoff_base_s", "backoff_max_s", "timeout_s", "sweep_s")
        return cls(
            **{k: getattr(section, k) for k in knobs if section is not None and hasattr(section, k)},
            database_url=getattr(database, "url", None),
            actors=senders(getattr(config, "runtime", None)),
            bots=list(getattr(config, "bots", []) or []),
            media=getattr(config, "media", None),
            leak=LeakPolicy.from_config(config),
            tracing=getattr(config, "tracing", None),
        )


def senders(runtime: Any) -> int:
    """How many processes share a bot's ``bots[].max_connections``: the delivery actors, and with
    ``runtime.deliver_in_host`` the session hosts started ahead of need (``runtime.min_hosts``; a
    host started on demand takes a share more: docs/decisions.md#delivery-in-host,
    docs/decisions.md#delivery-connections). Counting every host there may be would leave one
    connection each (1 + 5 senders for the default 4), which throttled the sends."""
    actors = int(getattr(runtime, "delivery_actors", 1) or 1)
    if runtime is None or not getattr(runtime, "deliver_in_host", False):
        return actors
    return actors + int(getattr(runtime, "min_hosts", 1) or 1)


def has_media(reply: Reply) -> bool:
    """The reply carries an attachment (image, audio, video, file): its media check may fetch it."""
    media = ImageSegment | AudioSegment | VideoSegment | FileSegment
    return any(isinstance(s, media) for s in reply.segments)


def bot_key(platform: str, bot_id: str) -> tuple[str, str]:
    """The key of a bot in a sender's tables: ``(platform, str(bot_id))``."""
    return platform, str(bot_id)


def bot_id_of(bot: Any) -> str:
    """A ``bots:`` entry's id (``self_id``, else ``bot_id``, else ``id``)."""
    return str(getattr(bot, "self_id", None) or getattr(bot, "bot_id", None) or getattr(bot, "id", ""))


def bot_media_policy(base: Any, bot: Any) -> MediaPolicy:
    """The media policy of one bot's replies: ``base`` (a ``MediaPolicy``; anything else: the
    defaults) with ``media_dir`` set to the bot's ``media_dir`` when it has one
    (``bots[].media_dir`` confines that bot's ``path`` media, per bot:
    docs/decisions.md#security-media-references)."""
    policy = base if isinstance(base, MediaPolicy) else MediaPolicy()
    media_dir = setting(bot, "media_dir", None)
    return replace(policy, media_dir=Path(media_dir)) if media_dir else policy

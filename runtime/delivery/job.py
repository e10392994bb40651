"""The one type a reply crosses the session/delivery boundary in: :class:`DeliveryJob` (and
:func:`partition_of`, the delivery actor of a chat).

The session core builds it (``runtime.session.core``), the delivery actor sends it
(:class:`runtime.delivery.core.DeliverySender`). It lives apart from the sender so the session
wing imports only this (pydantic, the reply model, the scene type) and not the sender's HTTP
client and SQL ledger: a session host process keeps ``httpx`` out until a provider needs it
(``actors.placement.hosts.support.skip_httpx_cli``).
"""

from __future__ import annotations

import zlib

from pydantic import BaseModel, ConfigDict, Field

from runtime.platforms.base import SceneType
from runtime.reply.segments import Reply

__all__ = ["DeliveryJob", "partition_of"]


class DeliveryJob(BaseModel):
    """One validated reply to send (actor interfaces, contract 3).

    Raises:
        pydantic.ValidationError: a ``scene_type`` other than ``private`` / ``group`` / ``channel``.
    """

    model_config = ConfigDict(frozen=True)

    reply_id: str
    """The idempotency key: stable for one turn's reply across retries and replays."""
    session_key: str
    platform: str
    bot_id: str
    scene_type: SceneType
    scene_id: str
    reply_to: str | None = None
    """The inbound message id being answered (codecs may quote it in groups)."""
    reply: Reply
    traceparent: str | None = None
    """W3C ``traceparent`` of the hand-over step of the message's trace (None: not traced); kept
    in the ledger row's ``job_json``, so a resumed delivery joins the same trace
    (docs/decisions.md#ops-traces)."""
    head_at: int | None = Field(default=None, exclude=True)
    """Set by the hand-over on the job it notifies delivery with when the reply's ``queued`` row
    was the only unfinished one of its chat as it was written: that row's ``created_at`` (Unix
    ms). The delivery actor then sends the reply without reading the chat's queue
    (docs/decisions.md#delivery-outbox). Never stored: not in ``job_json`` (excluded from every
    dump), so a job read back from the ledger has None."""


def partition_of(session_key: str, size: int) -> int:
    """``crc32(session_key) % size``: the delivery actor index of a session (stable across processes).

    Raises:
        ValueError: ``size`` < 1.
    """
    if size < 1:
        raise ValueError(f"delivery pool size must be >= 1, got {size}")
    return zlib.crc32(session_key.encode("utf-8")) % size

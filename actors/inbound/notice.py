"""The inbound policy's notice: when a bot's policy refuses a message with a notice (the cooldown
message, docs/decisions.md#platform-inbound-policy), the ingress sends it as a reply to the
message through the delivery pool, in the background, so the webhook's answer never waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from actors.delivery.pool import DeliveryPool
from runtime.delivery.job import DeliveryJob
from runtime.platforms.base import InboundMessage
from runtime.platforms.policy import Verdict
from runtime.reply.segments import Reply

__all__ = ["send_notice"]

log = logging.getLogger("sessionray.ingress")


def send_notice(
    runtime: Any, config: Any, msg: InboundMessage, verdict: Verdict, pending: set[asyncio.Task[None]]
) -> None:
    """Hand ``verdict.notice`` (if any) to ``runtime``'s delivery pool in the background, as a
    reply to ``msg`` (reply id ``cooldown:<platform>:<bot>:<message id>``: the ledger sends it
    once however often the event is redelivered). A runtime without a pool (attached from a
    Serve replica) looks the pool's named actors up (``config.runtime.delivery_actors``) and keeps
    it; failing that the notice is logged only. The task is held in ``pending`` until it ends."""
    if verdict.notice is None:
        return
    delivery = getattr(runtime, "delivery", None)
    if delivery is None:  # a Ray Serve replica's runtime: find the pool's actors by name
        try:
            delivery = runtime.delivery = DeliveryPool.lookup(config.runtime.delivery_actors)
        except Exception as exc:
            log.warning("cooldown notice for %s not sent: no delivery pool: %r", msg.session_key, exc)
            return
    job = DeliveryJob(
        reply_id=f"cooldown:{msg.platform}:{msg.bot_id}:{msg.message_id}",
        session_key=msg.session_key,
        platform=msg.platform,
        bot_id=msg.bot_id,
        scene_type=msg.scene_type,
        scene_id=msg.scene_id,
        reply_to=msg.message_id,
        reply=Reply.of_text(verdict.notice),
    )

    async def send() -> None:
        try:
            await delivery.deliver(job)
        except Exception:
            log.exception("cooldown notice for %s failed", msg.session_key)

    task = asyncio.create_task(send())
    pending.add(task)
    task.add_done_callback(pending.discard)

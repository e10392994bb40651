"""Names and health of the Telegram pollers (:mod:`actors.inbound.telegram_poll`), for the processes
that look at them without running one: ``GET /healthz`` of the ingress, the start/stop helpers.

The poller of a bot is the detached Ray actor :func:`poller_name` in namespace
:data:`NAMESPACE`; :func:`polling_health` asks each one for its status.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray

__all__ = ["NAMESPACE", "poller_name", "polling_bots", "polling_health"]

NAMESPACE = "sessionray"
"""The Ray namespace of every named sessionray actor."""


def poller_name(self_id: str, prefix: str = "sessionray") -> str:
    """``{prefix}-tgpoll-{self_id}``: the one poller actor of a bot."""
    return f"{prefix}-tgpoll-{self_id}"


def polling_bots(config: Any) -> list[Any]:
    """The ``bots:`` entries with ``mode: polling`` (Telegram only: the config model checks it)."""
    return [b for b in config.bots if getattr(b, "mode", "webhook") == "polling"]


async def polling_health(config: Any, prefix: str = "sessionray", timeout_s: float = 2.0) -> dict[str, Any]:
    """``{self_id: status}`` of every polling bot for ``GET /healthz``: the poller's
    ``PollLoop.status()`` (``state: "conflict"`` on a 409), ``{"state": "not running"}`` without a
    poller actor, ``{"state": "unknown"}`` when it did not answer within ``timeout_s`` seconds."""
    out: dict[str, Any] = {}
    for bot in polling_bots(config):
        sid = str(bot.self_id)
        try:
            handle = ray.get_actor(poller_name(sid, prefix), namespace=NAMESPACE)
        except ValueError:
            out[sid] = {"state": "not running"}
            continue
        try:
            out[sid] = await asyncio.wait_for(handle.status.remote(), timeout=timeout_s)
        except Exception:
            out[sid] = {"state": "unknown"}
    return out

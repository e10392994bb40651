"""Delivery without Ray: the idempotency ledger (one SQL row per reply, one step per platform
call) and the delivery core that renders a reply through a platform codec, runs the media and
leak checks and sends each step exactly once and in chat order. ``actors/delivery.py`` is only
the Ray shell around :class:`DeliverySender` (`docs/decisions.md#delivery-ledger`).
"""

from runtime.delivery.core import (
    DeliveryJob,
    DeliveryResult,
    DeliverySender,
    DeliverySettings,
    partition_of,
)

__all__ = [
    "DeliveryJob",
    "DeliveryResult",
    "DeliverySender",
    "DeliverySettings",
    "partition_of",
]

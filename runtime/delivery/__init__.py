"""Delivery without Ray: the idempotency ledger (one SQL row per reply, one step per platform
call) and the delivery core that renders a reply through a platform codec, runs the media and
leak checks and sends each step exactly once and in chat order. ``actors/delivery/pool.py`` is only
the Ray shell around :class:`~runtime.delivery.core.DeliverySender`
(`docs/decisions.md#delivery-ledger`).

Only :class:`DeliveryJob` (:mod:`runtime.delivery.job`, what the session wing hands over) is
re-exported here: the sender, its settings and results (:mod:`runtime.delivery.core`) and the
ledger (:mod:`runtime.delivery.ledger`) import an HTTP client and SQL, which a session host
process must not pay for when it imports this package. Importing :mod:`runtime.delivery.tables`
(the ledger and the outbox do) registers the delivery tables with those ``Database.create_tables``
creates; a session host registers them before it creates its tables
(:func:`actors.placement.hosts.support.open_repository`).
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from runtime.delivery.job import DeliveryJob
else:  # each name is imported on first use (docs/decisions.md#ops-lazy-exports)
    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = ["DeliveryJob"]

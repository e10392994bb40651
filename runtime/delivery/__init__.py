"""Delivery without Ray: the idempotency ledger (one SQL row per reply, one step per platform
call) and the delivery core that renders a reply through a platform codec, runs the media and
leak checks and sends each step exactly once and in chat order. ``actors/delivery/pool.py`` is only
the Ray shell around :class:`~runtime.delivery.core.DeliverySender`
(`docs/decisions.md#delivery-ledger`).

Only :class:`DeliveryJob` (:mod:`runtime.delivery.job`, what the session wing hands over) is
re-exported here: the sender, its settings and results (:mod:`runtime.delivery.core`) and the
ledger (:mod:`runtime.delivery.ledger`) import an HTTP client and SQL, which a session host
process must not pay for when it imports this package. Importing the package registers the
delivery tables (:mod:`runtime.delivery.tables`) with those ``Database.create_tables`` creates.
"""

from runtime.delivery import tables as _tables  # noqa: F401  (registers the delivery tables)
from runtime.delivery.job import DeliveryJob

__all__ = ["DeliveryJob"]

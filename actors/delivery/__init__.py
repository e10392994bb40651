"""A reply is sent: the delivery actors that claim queued rows of the delivery ledger and send
them to the IM platform (:mod:`~actors.delivery.pool`, ``DeliveryPool``; the sending rules
themselves are :mod:`runtime.delivery`), and the per-bot rendezvous with the process holding a
OneBot WebSocket (:mod:`~actors.delivery.onebot_link`). Above :mod:`actors.raylife` (metrics,
self-kick), below placement, which starts the pool and notifies it after each turn. Nothing is
re-exported here (both modules import Ray; import the module you need).
"""

__all__ = ["onebot_link", "pool"]
"""The modules other wings import."""

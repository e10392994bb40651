"""Owner ids of the delivery ledger's rows that are a session host's
(docs/decisions.md#delivery-in-host). Imports nothing: the host supervisor builds them at every
start, and a light actor process must not pay for the ledger's SQL to do so."""

from __future__ import annotations

__all__ = ["HOST_OWNER_PREFIX", "host_owner"]

HOST_OWNER_PREFIX = "host"
"""The first part of a session host's owner id, ``host:<its Ray actor id>``: never a delivery
actor's partition number, so no delivery actor takes a live host's row as its own dead
predecessor's, nor a host another's."""


def host_owner(actor_id: str) -> str:
    """The ledger owner id of the session host whose Ray actor id is ``actor_id`` (hex):
    ``host:<actor_id>``."""
    return f"{HOST_OWNER_PREFIX}:{actor_id}"

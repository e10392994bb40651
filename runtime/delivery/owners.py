"""Owner ids of the delivery ledger's rows that are a session host's
(docs/decisions.md#delivery-in-host). Imports nothing: the host supervisor builds them at every
start, and a light actor process must not pay for the ledger's SQL to do so."""

from __future__ import annotations

__all__ = ["HOST_OWNER_PREFIX", "host_owner", "incarnation_prefix"]

HOST_OWNER_PREFIX = "host"
"""The first part of a session host's owner id: never a delivery actor's partition number, so no
delivery actor takes a live host's row as its own dead predecessor's, nor a host another's."""


def incarnation_prefix(incarnation: str) -> str:
    """``host:<incarnation>:``, what every owner id of the hosts of one host-supervisor
    incarnation starts with: a supervisor that starts hands on the rows of every host owner
    without it (its previous incarnation's hosts died with it), with no list of its own hosts to
    race against a host it starts meanwhile."""
    return f"{HOST_OWNER_PREFIX}:{incarnation}:"


def host_owner(incarnation: str, actor_id: str) -> str:
    """The ledger owner id of the session host whose Ray actor id is ``actor_id`` (hex), started
    by the host-supervisor incarnation ``incarnation``: ``host:<incarnation>:<actor_id>``."""
    return f"{incarnation_prefix(incarnation)}{actor_id}"

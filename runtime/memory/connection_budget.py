"""The PostgreSQL connection budget of a sessionray deployment
(docs/decisions.md#memory-connection-budget).

Every process that talks SQL holds its own connection pool, so the server must accept, in the
worst case::

    most hosts × HOST_SQL_THREADS (4)                 (a SessionHost: 4 SQL threads, no overflow)
  + runtime.delivery_actors × 8                       (a DeliveryActor: 7 SQL threads + 1 overflow)
  + 8 per ingress process                             (the ingress's Database, also the admin's)
  ≤ max_connections − superuser_reserved_connections  (PostgreSQL: SHOW max_connections, 100 − 3)

``most hosts`` is the host supervisor's limit, :meth:`runtime.config.RuntimeConfig.host_capacity`
(``max(min_hosts, ceil(max_live_sessions / sessions_per_host))``): all sessions of one host share
its one :class:`~runtime.memory.db.Database`, so the budget grows with hosts, not with sessions.
A :class:`~runtime.memory.db.Database` runs every SQL call on one of its ``threads`` and each call
holds one connection. Session hosts, delivery actors and the ingress open theirs with
``max_overflow=0``, so the pool itself caps them at ``threads`` connections (on SQLite one more,
for the writer lock's holder writing inline: docs/decisions.md#memory-sql-off-loop), also for SQL run
outside those threads (``create_tables`` at start-up takes one of the same connections). A host
closes its connections after its warm-up and whenever its last live session is passivated, so an
empty host holds none. The ingress process holds one Database: the admin API's view of stored
sessions reads through it (``actors/inbound/ingress.py`` → ``actors/http/admin.py``). At start
``SessionRuntime.start`` opens one more connection for a moment (``create_tables`` and this check)
and closes it. The host supervisor opens no SQL connection; a router shard opens one only for the
moment it archives a passivated session (admin ``archive``; one at a time per shard), and its
inbox recovery loop one more (one SQL thread, no overflow) for each pass, kept only while the
shard's keys have open inbox rows (``actors/placement/recovery.py``) — at most two per shard, not counted
below. :func:`connection_budget` is the arithmetic (pure), :func:`budget_warning` the text, and
:func:`warn_if_over_connection_budget` the start-up check ``actors/placement/runtime.py`` runs once with the
configured PostgreSQL URL (a WARNING, never an error: the worst case is rare, and the operator
decides).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

from runtime.memory.db import DEFAULT_SQL_THREADS, Database

__all__ = [
    "DEFAULT_PROCESS_CONNECTIONS",
    "HOST_SQL_THREADS",
    "ConnectionBudget",
    "budget_warning",
    "connection_budget",
    "warn_if_over_connection_budget",
]

log = logging.getLogger("sessionray.sql")

HOST_SQL_THREADS = 4
"""SQL threads (and pooled connections, no overflow) of one session host's database, shared by
all its sessions (``actors/placement/hosts/support.py`` opens it with this). A session's appends are
serialized by its writer, so four threads let four sessions' SQL run at once; on SQLite the file
lock serializes writes anyway, on PostgreSQL each thread is one server connection per host."""
DEFAULT_PROCESS_CONNECTIONS = DEFAULT_SQL_THREADS
"""Connections of a process whose :class:`~runtime.memory.db.Database` keeps the default
``threads`` (8) with no pool overflow — each ingress process — or 7 threads and one overflow
connection for the on-the-wire mark written on its event loop's thread — each delivery actor."""


@dataclass(frozen=True, slots=True)
class ConnectionBudget:
    """Worst-case PostgreSQL connections per kind of process, and their ``total``."""

    hosts: int
    """Connections of all session hosts (``most hosts × HOST_SQL_THREADS``)."""
    delivery: int
    ingress: int

    @property
    def total(self) -> int:
        """All of them together (connections)."""
        return self.hosts + self.delivery + self.ingress


def connection_budget(
    *,
    hosts: int,
    delivery_actors: int,
    ingress_processes: int = 1,
    per_host: int = HOST_SQL_THREADS,
    per_process: int = DEFAULT_PROCESS_CONNECTIONS,
) -> ConnectionBudget:
    """The worst case of the module docstring's formula.

    Args:
        hosts: Session hosts at most (the second item of
            :meth:`runtime.config.RuntimeConfig.host_capacity`).
        delivery_actors: ``runtime.delivery_actors``.
        ingress_processes: Ingress processes (the ``sessionray serve`` driver, or the Ray Serve
            replicas of the ingress deployment).
        per_host: Connections of one session host.
        per_process: Connections of one delivery actor or ingress process.

    Raises:
        ValueError: a negative count.
    """
    counts = (hosts, delivery_actors, ingress_processes, per_host, per_process)
    if min(counts) < 0:
        raise ValueError(f"connection budget counts must be >= 0, got {counts}")
    return ConnectionBudget(
        hosts=hosts * per_host,
        delivery=delivery_actors * per_process,
        ingress=ingress_processes * per_process,
    )


def budget_warning(budget: ConnectionBudget, max_connections: int, reserved: int = 0) -> str | None:
    """The warning to log when ``budget.total`` exceeds what the server accepts
    (``max_connections − reserved``, ``reserved`` = ``superuser_reserved_connections``), else None.
    The text names the config keys to lower and the server setting to raise."""
    usable = max_connections - reserved
    if budget.total <= usable:
        return None
    return (
        f"PostgreSQL accepts {usable} connections (max_connections={max_connections} minus "
        f"{reserved} reserved for superusers) but sessionray may open {budget.total} at worst: "
        f"session hosts → {budget.hosts} ({HOST_SQL_THREADS} each; their number is "
        "max(runtime.min_hosts, runtime.max_live_sessions / runtime.sessions_per_host)), "
        f"runtime.delivery_actors → {budget.delivery} ({DEFAULT_PROCESS_CONNECTIONS} each), "
        f"ingress → {budget.ingress}. Raise runtime.sessions_per_host or lower "
        "runtime.max_live_sessions / runtime.min_hosts / runtime.delivery_actors, or raise "
        "max_connections on the server (or put PgBouncer in front); otherwise new connections fail "
        "with 'too many clients already' (deploy/README.md, "
        '"PostgreSQL connections").'
    )


def warn_if_over_connection_budget(db: Database, runtime: Any, ingress_processes: int = 1) -> str | None:
    """Start-up check (blocking; run it in a thread): on PostgreSQL read ``SHOW max_connections``
    and ``SHOW superuser_reserved_connections`` and log :func:`budget_warning` as a WARNING when
    the configured worst case does not fit. A no-op on SQLite. Never raises: a failed query is
    logged (the server's own error comes with the first real connection anyway).

    Args:
        db: A :class:`Database` on the configured URL (one connection is used briefly).
        runtime: The ``runtime`` config section (a :class:`runtime.config.RuntimeConfig`:
            its ``host_capacity()`` and ``delivery_actors``).
        ingress_processes: See :func:`connection_budget`.

    Returns:
        The warning text that was logged, or None.
    """
    if db.is_sqlite:
        return None
    try:
        with db.connection() as conn:
            max_connections = int(conn.execute(text("SHOW max_connections")).scalar_one())
            reserved = int(conn.execute(text("SHOW superuser_reserved_connections")).scalar_one())
    except Exception as exc:
        log.warning("could not read PostgreSQL max_connections (%s): connection budget not checked", exc)
        return None
    _, hosts = runtime.host_capacity()
    budget = connection_budget(
        hosts=hosts,
        delivery_actors=runtime.delivery_actors,
        ingress_processes=ingress_processes,
    )
    message = budget_warning(budget, max_connections, reserved)
    if message is not None:
        log.warning(message)
    return message

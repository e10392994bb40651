"""A session is placed and its turns submitted: ``SessionRuntime``, the handle every ingress,
the admin API and the CLI use (:mod:`~actors.placement.runtime`), the submit path with its
cache of live sessions (:mod:`~actors.placement.submit`), per-session-key ordering
(:mod:`~actors.placement.admission`), the router shards that own the directory of sessions
(:mod:`~actors.placement.router`, their control face :mod:`~actors.placement.router_control`,
inbox recovery :mod:`~actors.placement.recovery`) and, one floor down, the session hosts that
run the sessions (:mod:`actors.placement.hosts`). Above :mod:`actors.delivery` (the runtime
starts the delivery pool) and :mod:`actors.raylife`; below every way in (HTTP, inbound, serve,
CLI). Nothing is re-exported here (the modules import Ray; import the module you need).
"""

__all__ = ["admission", "runtime"]
"""The modules other wings import."""

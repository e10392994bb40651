"""The session hosts: the supervisor that keeps them started ahead of need
(:mod:`~actors.placement.hosts.supervisor`, ``HostSupervisor``), one host actor running many
sessions (:mod:`~actors.placement.hosts.host`, with its bookkeeping
:mod:`~actors.placement.hosts.state` and helpers :mod:`~actors.placement.hosts.support`) and
what each session's turns run with (:mod:`~actors.placement.hosts.setup`, the default
``SetupFactory``). The floor below the router and the runtime handle of
:mod:`actors.placement`, which place sessions on these hosts; hosts know nothing of routing.
Nothing is re-exported here (the modules import Ray; import the module you need).
"""

__all__ = ["setup", "supervisor"]
"""The modules other wings import."""

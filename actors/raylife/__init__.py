"""Ray's life on this machine and in the cluster: the local head that ``sessionray serve`` starts
(:mod:`~actors.raylife.local_ray`, :mod:`~actors.raylife.head`), the keeper that stops it once no
serve names it (:mod:`~actors.raylife.keeper`), the clean-up of instances a crashed serve left
(:mod:`~actors.raylife.stale`, :mod:`~actors.raylife.port_holders`), Ray's auth token
(:mod:`~actors.raylife.auth_token`), version shims (:mod:`~actors.raylife.compat`), the metrics
every actor exports (:mod:`~actors.raylife.metrics`), the start of a restarted actor's background
work (:mod:`~actors.raylife.self_kick`), the start-up check that SQL fits the cluster
(:mod:`~actors.raylife.cluster`) and the import root every worker shares
(:mod:`~actors.raylife.repo_root`). The bottom wing of ``actors``: it imports no other wing, so
everything above may start, watch or tune Ray through it. Nothing is re-exported here (several
modules import Ray; import the module you need).
"""

__all__ = [
    "auth_token",
    "cluster",
    "compat",
    "head",
    "local_ray",
    "metrics",
    "port_holders",
    "repo_root",
    "self_kick",
]
"""The modules other wings import."""

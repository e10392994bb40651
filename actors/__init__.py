"""The processes and Ray actors that run :mod:`runtime` as a service, in wings (bottom first;
imports run only downward, ``tests/layout/test_layers.py``): :mod:`actors.raylife` (Ray is
started, kept and cleaned up), :mod:`actors.limits` (the cluster-wide provider-limit granter),
:mod:`actors.models` (the built-in model, scripted faux providers, the image tool),
:mod:`actors.delivery` (a reply is sent), :mod:`actors.placement`
(a session is placed on a host and its turns submitted), :mod:`actors.http` (the admin and
console route groups), :mod:`actors.inbound` (a webhook, WebSocket event or polled update
arrives), :mod:`actors.serve` (``sessionray serve`` / ``check`` and the Ray Serve app) and
:mod:`actors.cli` (the ``sessionray`` command line).
"""

__all__: list[str] = []

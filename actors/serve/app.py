"""The ingress as a Ray Serve deployment — the import path a KubeRay ``RayService`` names.

On a cluster the same ASGI app that ``sessionray serve`` hosts locally
(:func:`actors.inbound.ingress.build_app`) runs in Serve replicas. Use it in a RayService's
``serveConfigV2``::

    applications:
      - name: sessionray
        import_path: actors.serve.app:app
        route_prefix: /
        runtime_env:
          env_vars: {SESSIONRAY_CONFIG: /etc/sessionray/sessionray.yaml}

With a ``console`` bot configured (the embedded defaults have one) every replica, delivery actor
and session must see the same ``SESSIONRAY_CONSOLE_API_TOKEN`` — set it on every node (the shipped
KubeRay config has no console bot). Nothing here generates it: a replica started without it fails
at once, naming the variable (:func:`runtime.platforms.console.require_console_api_token`),
instead of serving a console whose every reply is refused (401).

or locally: ``serve run actors.serve.app:app``. ``app`` reads its configuration from the file named by
``SESSIONRAY_CONFIG`` (default ``sessionray.yaml`` in the working directory, else the embedded
defaults); :func:`build` builds the application for an explicit config file (Serve's
"application builder" form: ``import_path: actors.serve.app:build`` with ``args: {config: ...}``).

Each replica attaches to the session runtime by actor name (namespace ``sessionray``): the first
replica to start creates the router shards, the host supervisor and the delivery pool
(``SessionRuntime.start`` is idempotent: it attaches to actors that already exist), the others only
attach. Costs measured on this machine (docs/decisions.md#ops-ingress-placement): Serve adds ≈ 240
MiB and p50 4 ms per request vs 0.7 ms for uvicorn in the driver, which is why ``sessionray serve``
does not use it locally.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ray import serve

__all__ = ["CONFIG_ENV", "SessionrayIngress", "app", "build", "replica_config"]

log = logging.getLogger("sessionray.serve_app")

CONFIG_ENV = "SESSIONRAY_CONFIG"
"""Environment variable naming the YAML configuration file of the Serve deployment."""


def replica_config(config_path: str | None = None) -> Any:
    """The replica's ``runtime.config.Config``: ``config_path``, else ``$SESSIONRAY_CONFIG``, else
    ``sessionray.yaml`` in the working directory, else the embedded defaults.

    Raises:
        runtime.config.ConfigError: a named file is missing or invalid.
    """
    from runtime.config import load_config

    return load_config(config_path or os.environ.get(CONFIG_ENV) or None)


@serve.deployment(name="sessionray-ingress", ray_actor_options={"num_cpus": 0})
@serve.ingress()
class SessionrayIngress:
    """A Serve replica hosting :func:`actors.inbound.ingress.build_app` over a shared ``SessionRuntime``.

    Args:
        config_path: YAML file; None: ``$SESSIONRAY_CONFIG``, else ``sessionray.yaml``/defaults.

    Raises:
        runtime.config.ConfigError: the configuration file is missing or invalid.
        ValueError: a console bot is configured and ``$SESSIONRAY_CONSOLE_API_TOKEN`` is unset, or
            the environment lacks what the configuration names (every unset variable with its
            config key, missing directories: :func:`actors.serve.preflight.environment_problems`) —
            checked before anything starts.
    """

    def __init__(self, config_path: str | None = None) -> None:
        from actors.serve.preflight import PreflightFailed, environment_problems
        from runtime.platforms.console import require_console_api_token

        self.config = replica_config(config_path)
        require_console_api_token(self.config)
        problems = environment_problems(self.config)
        if problems:
            raise ValueError(
                PreflightFailed(problems).report("sessionray ingress replica", when="", exit_line=False)
            )
        self.runtime: Any = None

    async def __serve_build_asgi_app__(self) -> Any:
        """Start (or attach to) the session runtime, then build the ASGI app (called once per replica)."""
        from actors.inbound.ingress import build_app
        from actors.inbound.telegram_poll import start_pollers
        from actors.placement.runtime import SessionRuntime

        self.runtime = SessionRuntime()
        await self.runtime.start(self.config)
        start_pollers(self.config)  # the one poller per `mode: polling` bot (get_if_exists)
        log.info("sessionray ingress replica ready (%d bots)", len(self.config.bots))
        return build_app(self.runtime, self.config)


def build(args: dict[str, Any]) -> Any:
    """Serve application builder: ``import_path: actors.serve.app:build``, ``args: {config: FILE}``."""
    return SessionrayIngress.bind(args.get("config"))  # type: ignore[attr-defined]


app = SessionrayIngress.bind()  # type: ignore[attr-defined]
"""The bound application (``import_path: actors.serve.app:app``)."""

"""``sessionray serve``: the whole runtime on one machine — local Ray, the actors, and the ingress
(uvicorn on uvloop in the driver process: 0.7 ms vs 4 ms for Ray Serve,
docs/decisions.md#ops-ingress-placement).

Start-up order: read the configuration (``--config FILE``, else ``sessionray.yaml``, else the
embedded defaults: console bot, built-in model, SQLite under ./data); run the pre-flight
(:mod:`actors.preflight`: variables, directories, database, ports — every problem in one message,
a distinct exit code per class, before Ray starts) and bind the HTTP port; print where
everything is (console URL, one webhook URL per configured bot, the metrics URLs, the admin
CLI); start or join Ray (``--address``); start the session runtime (routers, session hosts, delivery
pool); serve HTTP — ``ready`` is printed once the port is listening — until SIGINT/SIGTERM.
Ctrl-C stops uvicorn, then the runtime, then Ray (``ray.shutdown``).

Exit codes: 0 stopped normally; 2 configuration/usage (also: SQLite on a multi-node cluster);
3 environment; 4 database; 5 port in use (:mod:`actors.preflight` has the table).

Actor metrics (``ray.util.metrics``) are exported by Ray's per-node metrics agent on
``--metrics-export-port`` (default 8090; it must lie outside 10002–19999:
docs/decisions.md#ops-ray-pitfalls); the ingress's own metrics are at ``/metrics`` on the HTTP port.
``--port 0`` serves on a free port (the banner and ``ready`` line show which).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import uvicorn

from actors.preflight import (
    DEFAULT_METRICS_EXPORT_PORT,
    EPILOG,
    EXIT_CONFIG,
    EXIT_PORT,
    HTTP_PORT,
    REPO_ROOT,
    PortInUseError,
    PreflightFailed,
    Problem,
    add_start_options,
    config_source,
    ensure_repo_root_on_path,
    open_listeners,
    run_checks,
)
from actors.serve_banner import admin_token_for_run, banner, quiet_ray_auth, shown_host

__all__ = ["DEFAULT_METRICS_EXPORT_PORT", "IngressServer", "main", "serve", "with_ingress_address"]

log = logging.getLogger("sessionray.serve")


def with_ingress_address(config: Any, host: str, port: int) -> Any:
    """``config`` with ``server.host``/``server.port`` set, and every console bot whose ``api_base``
    is unset or a loopback URL pointed at this ingress: the console "platform API" is served by the
    ingress itself, so DeliveryActors must call the port actually served (``--port`` may differ
    from the default ``http://127.0.0.1:8000``). A non-loopback console ``api_base`` is kept."""

    def local(url: str | None) -> bool:
        return not url or urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")

    bots = [
        b.model_copy(update={"api_base": f"http://{shown_host(host)}:{port}"})
        if str(b.platform) == "console" and local(b.api_base)
        else b
        for b in config.bots
    ]
    server = config.server.model_copy(update={"host": host, "port": port})
    return config.model_copy(update={"bots": bots, "server": server})


class IngressServer(uvicorn.Server):
    """uvicorn's server, serving sockets bound beforehand (:func:`actors.preflight.open_listeners`):

    * ``on_ready()`` runs once the sockets are listening (so "ready" is never printed before a
      connection can be accepted);
    * a socket that cannot listen (another process took the port after it was bound) raises
      :class:`~actors.preflight.PortInUseError` instead of uvicorn's ``sys.exit(3)``;
    * Ctrl-C ends ``serve()`` normally (the captured SIGINT is not re-raised), so the runtime and
      Ray are stopped in order.
    """

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        except OSError as exc:
            where = ", ".join(str(s.getsockname()) for s in sockets or [])
            raise PortInUseError(f"{where} ({HTTP_PORT}): {exc}") from None
        if self.started and self._on_ready is not None:
            self._on_ready()

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sessionray serve",
        description="Run the sessionray runtime and its HTTP ingress (webhooks, console, admin, metrics).",
        epilog=EPILOG,
    )
    add_start_options(p)
    p.add_argument(
        "--dev-admin-token",
        action="store_true",
        help="when the admin token variable (server.admin_token_env) is unset, generate one for this "
        "run and print how to use the admin CLI with it (what `make run` does)",
    )
    return p


def _init_ray(address: str | None, metrics_port: int) -> None:
    import ray

    from runtime.platforms.console import API_TOKEN_ENV, console_api_token

    # Workers import from the repository root (and the caller's PYTHONPATH), and so does this
    # process: Python tools named in ai.python_tools (e.g. examples.bot.bot_tools) are loaded
    # here once at start-up to fail early, then in every session host.
    python_path = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    ensure_repo_root_on_path()
    # The console's internal endpoints need one shared token in the ingress and every Ray worker.
    env = {"PYTHONPATH": python_path, API_TOKEN_ENV: console_api_token(create=True) or ""}
    kwargs: dict[str, Any] = {
        "namespace": "sessionray",
        "logging_level": "warning",
        "runtime_env": {"env_vars": env},
    }
    if address:
        ray.init(address=address, **kwargs)
    else:
        os.environ.setdefault("RAY_metrics_report_interval_ms", "5000")
        ray.init(include_dashboard=False, _metrics_export_port=metrics_port, **kwargs)


async def serve(
    config: Any,
    source: str,
    *,
    address: str | None = None,
    host: str | None = None,
    port: int | None = None,
    metrics_port: int = DEFAULT_METRICS_EXPORT_PORT,
    listeners: list[socket.socket] | None = None,
    notes: list[str] | None = None,
    generated_token: str | None = None,
) -> None:
    """Start Ray (or join ``address``), the runtime and the ingress; serve until interrupted.

    Args:
        listeners: Sockets already bound to ``host``:``port`` (:func:`main` binds them before Ray
            starts); None: bound here.
        notes: Extra banner lines (e.g. the Ray token-authentication note).
        generated_token: The admin token made for this run (shown in the banner).

    Raises:
        PortInUseError: the HTTP port cannot be bound or listened on.
        Whatever the runtime start raises (e.g. ``ClusterConfigError`` for SQLite on a multi-node
        cluster); Ray is shut down before the error propagates.
    """
    host = host or config.server.host
    port = config.server.port if port is None else port
    if listeners is None:
        listeners = open_listeners(host, port)
    port = listeners[0].getsockname()[1]
    config = with_ingress_address(config, host, port)
    for line in banner(
        config, source, host, port, None if address else metrics_port, generated_token=generated_token
    ):
        print(line, flush=True)
    for line in notes or []:
        print(line, flush=True)
    print("sessionray: starting Ray and the session runtime ...", flush=True)

    import ray

    from actors.ingress import build_app
    from actors.runtime import SessionRuntime
    from actors.telegram_poll import start_pollers, stop_pollers

    _init_ray(address, metrics_port)
    runtime = SessionRuntime()
    where = "/console" if any(b.platform == "console" for b in config.bots) else "/healthz"

    def ready() -> None:
        print(f"sessionray: ready — open http://{shown_host(host)}:{port}{where} (Ctrl-C stops)", flush=True)

    try:
        # the port opens once runtime.min_hosts session hosts answer: no early message waits for a
        # process start, and sessions spread over every host (and node) from the first one
        await runtime.start(config, wait_warm=True)
        start_pollers(config)  # one getUpdates loop per `mode: polling` Telegram bot
        app = build_app(runtime, config)
        server = IngressServer(
            uvicorn.Config(
                app, host=host, port=port, loop="none", lifespan="on", log_level="warning", access_log=False
            ),
            on_ready=ready,
        )
        await server.serve(sockets=listeners)
    finally:
        for sock in listeners:
            sock.close()
        print("sessionray: stopping the runtime and Ray ...", flush=True)
        with contextlib.suppress(Exception):
            await stop_pollers(config)
        try:
            await asyncio.wait_for(runtime.stop(), timeout=30)
        except Exception as exc:  # still shut Ray down
            log.warning("runtime stop failed: %r", exc)
        ray.shutdown()
        print("sessionray: stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    """``sessionray serve [--config FILE] [--address RAY_ADDRESS] ...``; returns the exit code
    (module docstring). Nothing imports Ray until the pre-flight has passed."""
    import uvloop

    from actors.cluster import ClusterConfigError
    from runtime.config import ConfigError, load_config

    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"sessionray serve: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    host = args.host or config.server.host
    port = config.server.port if args.port is None else args.port
    metrics_port = None if args.address else args.metrics_export_port
    problems = run_checks(config, host=host, port=port, metrics_port=metrics_port, check_http_port=False)
    listeners: list[socket.socket] = []
    try:
        listeners = open_listeners(host, port)
    except PortInUseError as exc:
        problems.append(Problem(EXIT_PORT, str(exc)))
    if problems:
        for sock in listeners:
            sock.close()
        failed = PreflightFailed(problems)
        print(failed.report("sessionray serve"), file=sys.stderr)
        return failed.exit_code
    generated = admin_token_for_run(config) if args.dev_admin_token else None
    notes = [] if args.address else [quiet_ray_auth()]
    try:
        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(
                serve(
                    config,
                    config_source(args.config),
                    address=args.address,
                    host=host,
                    port=port,
                    metrics_port=args.metrics_export_port,
                    listeners=listeners,
                    notes=notes,
                    generated_token=generated,
                )
            )
    except ClusterConfigError as exc:  # a configuration that cannot run on this cluster: no traceback
        print(f"sessionray serve: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except PortInUseError as exc:  # the port was taken between the pre-flight and listen()
        print(f"sessionray serve: port in use: {exc}", file=sys.stderr)
        return EXIT_PORT
    return 0

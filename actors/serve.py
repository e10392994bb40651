"""``sessionray serve``: the whole runtime on one machine — local Ray, the actors, and the ingress
(uvicorn on uvloop in the driver process: 0.7 ms vs 4 ms for Ray Serve,
docs/decisions.md#ops-ingress-placement).

Start-up order: read the configuration (``--config FILE``, else ``sessionray.yaml``, else the
embedded defaults: console bot, built-in model, SQLite under ./data), print where everything is
(console URL, one webhook URL per configured bot, the metrics URLs), start or join Ray
(``--address``), start the session runtime (routers, warm pool, delivery pool), then serve HTTP
until SIGINT/SIGTERM. Ctrl-C stops uvicorn, then the runtime, then Ray (``ray.shutdown``).

Actor metrics (``ray.util.metrics``) are exported by Ray's per-node metrics agent on
``--metrics-export-port`` (default 8090; it must lie outside 10002–19999:
docs/decisions.md#ops-ray-pitfalls); the ingress's own metrics are at ``/metrics`` on the HTTP port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvicorn

__all__ = ["banner", "main", "serve"]

log = logging.getLogger("sessionray.serve")

DEFAULT_METRICS_EXPORT_PORT = 8090
_ROOT = str(Path(__file__).resolve().parent.parent)
"""The repository root: on the import path of this process and of every Ray worker."""


def banner(config: Any, source: str, host: str, port: int, metrics_port: int | None) -> list[str]:
    """The first log lines: configuration source, console URL, webhook URLs, metrics URLs."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    base = f"http://{shown}:{port}"
    lines = [f"sessionray: configuration from {source}"]
    if source == "<defaults>":
        lines.append(
            "sessionray: no sessionray.yaml: embedded defaults (local Ray, SQLite ./data/sessionray.db, "
            "console bot, built-in model)"
        )
    platforms = {str(b.platform) for b in config.bots}
    if "console" in platforms:
        lines.append(f"sessionray: console        {base}/console")
    for bot in config.bots:
        lines.append(f"sessionray: webhook        {base}/webhooks/{bot.platform}/{bot.self_id}")
    lines.append(f"sessionray: metrics        {base}/metrics  (ingress)")
    if metrics_port:
        lines.append(
            f"sessionray: actor metrics  http://{shown}:{metrics_port}/metrics  (Ray node metrics agent)"
        )
    token_env = config.server.admin_token_env
    if token_env and os.environ.get(token_env):
        lines.append(f"sessionray: admin API      {base}/admin/ (bearer token from ${token_env})")
    else:
        lines.append(
            f"sessionray: admin API      disabled (set {token_env or 'server.admin_token_env'} to enable)"
        )
    return lines


def with_ingress_address(config: Any, host: str, port: int) -> Any:
    """``config`` with ``server.host``/``server.port`` set, and every console bot whose ``api_base``
    is unset or a loopback URL pointed at this ingress: the console "platform API" is served by the
    ingress itself, so DeliveryActors must call the port actually served (``--port`` may differ
    from the default ``http://127.0.0.1:8000``). A non-loopback console ``api_base`` is kept."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host

    def local(url: str | None) -> bool:
        return not url or urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")

    bots = [
        b.model_copy(update={"api_base": f"http://{shown}:{port}"})
        if str(b.platform) == "console" and local(b.api_base)
        else b
        for b in config.bots
    ]
    server = config.server.model_copy(update={"host": host, "port": port})
    return config.model_copy(update={"bots": bots, "server": server})


class _Server(uvicorn.Server):
    """uvicorn's server, minus re-raising the captured SIGINT after shutdown: Ctrl-C ends
    ``serve()`` normally, so the runtime and Ray are stopped in order."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sessionray serve",
        description="Run the sessionray runtime and its HTTP ingress (webhooks, console, admin, metrics).",
    )
    p.add_argument(
        "--config", metavar="FILE", help="YAML configuration (default: ./sessionray.yaml, else defaults)"
    )
    p.add_argument(
        "--address",
        metavar="RAY_ADDRESS",
        help="join a running Ray cluster (e.g. auto or 10.0.0.5:6379); default: start a local Ray",
    )
    p.add_argument("--host", help="override server.host")
    p.add_argument("--port", type=int, help="override server.port")
    p.add_argument(
        "--metrics-export-port",
        type=int,
        default=DEFAULT_METRICS_EXPORT_PORT,
        help=f"Ray metrics agent port for a local Ray (default {DEFAULT_METRICS_EXPORT_PORT})",
    )
    return p


def _init_ray(address: str | None, metrics_port: int) -> None:
    import ray

    from runtime.platforms.console import API_TOKEN_ENV, console_api_token

    # Workers import from the repository root (and the caller's PYTHONPATH), and so does this
    # process: Python tools named in ai.python_tools (e.g. examples.bot.bot_tools) are loaded
    # here once at start-up to fail early, then in every session actor.
    python_path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    if _ROOT not in sys.path:
        sys.path.insert(0, _ROOT)
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
) -> None:
    """Start Ray (or join ``address``), the runtime and the ingress; serve until interrupted.

    Raises:
        Whatever the runtime start raises (e.g. ``ClusterConfigError`` for SQLite on a multi-node
        cluster); Ray is shut down before the error propagates.
    """
    import ray

    from actors.ingress import build_app
    from actors.runtime import SessionRuntime

    host = host or config.server.host
    port = config.server.port if port is None else port
    config = with_ingress_address(config, host, port)
    for line in banner(config, source, host, port, None if address else metrics_port):
        print(line, flush=True)
    print("sessionray: starting Ray and the session runtime ...", flush=True)
    _init_ray(address, metrics_port)
    runtime = SessionRuntime()
    try:
        await runtime.start(config)
        app = build_app(runtime, config)
        server = _Server(
            uvicorn.Config(
                app, host=host, port=port, loop="none", lifespan="off", log_level="warning", access_log=False
            )
        )
        print(
            f"sessionray: ready — open http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
            f"{'/console' if any(b.platform == 'console' for b in config.bots) else '/healthz'} "
            "(Ctrl-C stops)",
            flush=True,
        )
        await server.serve()
    finally:
        print("sessionray: stopping the runtime and Ray ...", flush=True)
        try:
            await asyncio.wait_for(runtime.stop(), timeout=30)
        except Exception as exc:  # still shut Ray down
            log.warning("runtime stop failed: %r", exc)
        ray.shutdown()
        print("sessionray: stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    """``sessionray serve [--config FILE] [--address RAY_ADDRESS]``; returns the exit code."""
    import uvloop

    from runtime.config import ConfigError, load_config

    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"sessionray serve: {exc}", file=sys.stderr)
        return 2
    source = args.config or ("sessionray.yaml" if Path("sessionray.yaml").exists() else "<defaults>")
    from actors.cluster import ClusterConfigError

    try:
        with contextlib.suppress(KeyboardInterrupt):
            uvloop.run(
                serve(
                    config,
                    source,
                    address=args.address,
                    host=args.host,
                    port=args.port,
                    metrics_port=args.metrics_export_port,
                )
            )
    except ClusterConfigError as exc:  # a configuration that cannot run on this cluster: no traceback
        print(f"sessionray serve: {exc}", file=sys.stderr)
        return 2
    return 0

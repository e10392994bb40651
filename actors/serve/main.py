"""``sessionray serve``: the whole runtime on one machine — local Ray, the actors, and the ingress
(uvicorn on uvloop in the driver process: 0.7 ms vs 4 ms for Ray Serve,
docs/decisions.md#ops-ingress-placement).

Start-up order: read the configuration (``--config FILE``, else ``sessionray.yaml``, else the
embedded defaults: console bot, built-in model, SQLite under ./data); join the local Ray a crashed
``sessionray serve`` of this user left running with the same configuration and code, and stop any
other it left (:mod:`actors.raylife.head`, docs/decisions.md#ops-ray-outlives-driver,
docs/decisions.md#ops-stale-ray); run the pre-flight (:mod:`actors.serve.preflight`: variables,
directories, database, ports — every problem in one message, a distinct exit code per class,
before Ray starts) and bind the HTTP port; print where everything is (console URL, one webhook URL
per configured bot, the metrics URLs, the admin CLI); open the port at once — events are stored
and answered ``queued`` while Ray (``--address``: joined) and the session runtime (routers, session
hosts, delivery pool) start (:mod:`actors.serve.gate`, docs/decisions.md#ops-early-accept) —;
``ready`` is printed once the runtime is up. SIGTERM or Ctrl-C stops in phases
(:mod:`actors.serve.shutdown`, docs/decisions.md#ops-graceful-shutdown): close the listener, let
turns in flight end and the delivery actors send for at most ``runtime.shutdown_grace_s``, stop
the runtime, then Ray — except after SIGTERM, a planned restart: the local Ray and its runtime are
left running and the next ``sessionray serve`` with the same configuration and code joins them,
ready in seconds (docs/decisions.md#ops-planned-restart).

Exit codes: 0 stopped normally; 2 configuration/usage (also: SQLite on a multi-node cluster);
3 environment (also: Ray's token cannot be created); 4 database; 5 port in use; 6 Ray did not
start or could not be joined (:mod:`actors.serve.preflight` has the table). Each failure is one line on
stderr, no traceback.

Actor metrics (``ray.util.metrics``) are exported by Ray's per-node metrics agent on
``--metrics-export-port`` (default 8090; it must lie outside 10002–19999:
docs/decisions.md#ops-ray-pitfalls); the ingress's own metrics are at ``/metrics`` on the HTTP port.
``--port 0`` serves on a free port (the banner and ``ready`` line show which).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import uvicorn

from actors.serve.banner import admin_token_for_run, banner, quiet_ray_auth, shown_host
from actors.serve.preflight import (
    DEFAULT_METRICS_EXPORT_PORT,
    EPILOG,
    EXIT_CONFIG,
    EXIT_ENVIRONMENT,
    EXIT_PORT,
    EXIT_RAY,
    HTTP_PORT,
    PortInUseError,
    PreflightFailed,
    Problem,
    add_start_options,
    config_source,
    load_start,
    open_listeners,
    run_checks,
)
from actors.serve.shutdown import REQUESTS_WAIT_S, ServeRun, ShutdownSignals, keeps_ray, say

__all__ = ["DEFAULT_METRICS_EXPORT_PORT", "IngressServer", "main", "serve", "with_ingress_address"]

RAY_AUTO_CONNECT_ENV = "RAY_ENABLE_AUTO_CONNECT"
"""Ray's switch for the ``ray.init()`` its API calls make when the process is not connected
(read when Ray is imported). ``sessionray serve`` sets it to ``0``: its one ``ray.init`` is its
own, in the ``ray-driver`` thread; a Ray call made before that (a bug) raises
``RaySystemError`` instead of starting a second Ray that races it (docs/decisions.md#ops-early-accept)."""

LISTEN_BACKLOG = 2048
"""Connections the kernel holds for the HTTP port until the server takes them (uvicorn's default)."""


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
    """uvicorn's server, serving sockets bound beforehand (:func:`actors.serve.preflight.open_listeners`):

    * ``on_ready()`` runs once the sockets are listening (nothing is announced before a
      connection can be accepted);
    * a socket that cannot listen (another process took the port after it was bound) raises
      :class:`~actors.serve.preflight.PortInUseError` instead of uvicorn's ``sys.exit(3)``;
    * it installs no signal handlers: ``serve`` handles SIGTERM/SIGINT for its whole life
      (:class:`~actors.serve.shutdown.ShutdownSignals`) and sets ``should_exit``.
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

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


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


def _ingress_server(app: Any, host: str, port: int, on_ready: Callable[[], None]) -> IngressServer:
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="none",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=REQUESTS_WAIT_S,
    )
    return IngressServer(config, on_ready=on_ready)


async def _first(*aws: asyncio.Future[Any]) -> None:
    """Until the first of ``aws`` is done (the others keep running)."""
    await asyncio.wait(aws, return_when=asyncio.FIRST_COMPLETED)


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
    local_ray: Any = None,
) -> None:
    """Open the HTTP port, start Ray (or join ``address``) and the runtime, serve until SIGTERM or
    SIGINT, then stop in phases (:mod:`actors.serve.shutdown`).

    The port accepts events as soon as the database and the listener are ready, before Ray and the
    session hosts (docs/decisions.md#ops-early-accept): until the runtime is up its ``submit``
    raises :class:`~actors.serve.gate.RuntimeNotReady` and the ingress answers the stored message
    as queued; ``/healthz`` answers 503 ``starting``. ``ready`` is printed once the runtime is up.

    Steps: bind the port (unless ``listeners``), :func:`_announce`, :func:`_start_ray`,
    :func:`_check_joined_cluster`, :func:`_open_ingress`, :func:`_serve_until_stop`, and always
    :func:`_shut_down`.

    Args:
        listeners: Sockets already bound to ``host``:``port`` (:func:`main` binds them before Ray
            starts); None: bound here.
        notes: Extra banner lines (e.g. the Ray token-authentication note).
        generated_token: The admin token made for this run (shown in the banner).
        local_ray: :class:`~actors.raylife.head.LocalRayPlan` (a local head: join a dead driver's
            instance or start one; None: computed here).

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
    _announce(config, source, host, port, None if address else metrics_port, generated_token, notes)
    ray_thread = _start_ray(config, address, metrics_port, local_ray, generated_token)
    await _check_joined_cluster(config, address, ray_thread)
    run = _open_ingress(config, host, port, listeners, ray_thread)
    try:
        await _serve_until_stop(run, ray_thread)
    finally:
        await _shut_down(run, ray_thread, address, failed=sys.exc_info()[1])


def _announce(
    config: Any,
    source: str,
    host: str,
    port: int,
    metrics_port: int | None,
    generated_token: str | None,
    notes: list[str] | None,
) -> None:
    """Step 1: print the banner (:func:`~actors.serve.banner.banner`: where everything is) and the
    extra ``notes``, then that Ray and the runtime are starting."""
    for line in banner(config, source, host, port, metrics_port, generated_token=generated_token):
        print(line, flush=True)
    for line in notes or []:
        print(line, flush=True)
    say("starting Ray and the session runtime ...")


_RAY_SIDE = (
    "actors.inbound.ingress",
    "actors.inbound.telegram_poll",
    "actors.placement.runtime",
    "actors.raylife.cluster",
    "actors.raylife.head",
    "actors.raylife.local_ray",
    "actors.serve.gate",
    "runtime.platforms.console",
)
"""The modules of the Ray side the steps of :func:`serve` use: imported in the event loop's
thread before ``ray.init`` runs in its own thread (two threads must not import Ray at once)."""


def _start_ray(
    config: Any, address: str | None, metrics_port: int, local_ray: Any, generated_token: str | None
) -> Any:
    """Step 2: start Ray (a local head, joining a dead driver's instance per ``local_ray``, or
    ``address``) in its own thread, while the port opens; returns the started
    :class:`~actors.raylife.local_ray.RayThread`.

    One console API token is shared by the ingress and every Ray worker, made before either
    starts (a joined instance's was put into the environment by ``plan_local_ray``); the admin
    token generated for this run travels the same way. Both are recorded with the instance.
    """
    for name in _RAY_SIDE:
        importlib.import_module(name)
    from actors.raylife.head import LocalRayPlan, instance_fingerprint
    from actors.raylife.local_ray import RayThread
    from runtime.platforms.console import API_TOKEN_ENV, console_api_token

    shared = {API_TOKEN_ENV: console_api_token(create=True) or ""}
    if not address and local_ray is None:
        local_ray = LocalRayPlan(instance_fingerprint(config), None)
    if generated_token and config.server.admin_token_env:
        shared[config.server.admin_token_env] = generated_token
    ray_thread = RayThread(
        address,
        metrics_port,
        adopt=local_ray.adopt if local_ray else None,
        fingerprint=local_ray.fingerprint if local_ray else None,
        shared_env=shared,
        keep_s=float(config.runtime.orphaned_ray_keep_s),
    )
    ray_thread.start()
    return ray_thread


async def _check_joined_cluster(config: Any, address: str | None, ray_thread: Any) -> None:
    """Step 3: joining a cluster (``address``) on SQLite, refuse a multi-node one before the
    database file is opened (docs/decisions.md#memory-postgres-multinode); joining takes seconds,
    not a Ray start. Nothing to do otherwise.

    Raises:
        ClusterConfigError: the cluster has more than one node (Ray is stopped first).
    """
    from actors.raylife.cluster import ensure_database_fits_cluster, is_sqlite

    if not (address and is_sqlite(config.database.url)):
        return
    try:
        await ray_thread.wait()
        ensure_database_fits_cluster(config.database.url)
    except BaseException:
        await asyncio.to_thread(ray_thread.stop, 5.0)
        raise


def _open_ingress(
    config: Any, host: str, port: int, listeners: list[socket.socket], ray_thread: Any
) -> ServeRun:
    """Step 4: build the ingress app over a :class:`~actors.serve.gate.RuntimeGate` (this opens the
    database), serve ``listeners`` with it, and start the session runtime once Ray is up
    (:func:`_start_runtime`); the two run as the returned run's ``serving`` and ``starting``."""
    from actors.inbound.ingress import build_app
    from actors.inbound.telegram_poll import stop_pollers
    from actors.placement.runtime import SessionRuntime
    from actors.serve.gate import RuntimeGate, StartupGate

    gate = RuntimeGate(config)
    runtime = SessionRuntime()
    shown = f"http://{shown_host(host)}:{port}"
    listening = asyncio.Event()

    def accepting() -> None:
        listening.set()
        if not gate.ready:
            say(f"accepting events on {shown} (stored now, answered once the session runtime is up)")

    app = build_app(gate, config)  # opens the database
    server = _ingress_server(StartupGate(app, gate), host, port, accepting)
    signals = ShutdownSignals(asyncio.get_running_loop())
    signals.on_request(lambda: setattr(server, "should_exit", True))
    serving = asyncio.ensure_future(server.serve(sockets=listeners))
    starting = asyncio.ensure_future(_start_runtime(config, ray_thread, signals, gate, runtime))
    db = app.state.ingress.db
    run = ServeRun(config, signals, server, serving, gate, runtime, db, starting, stop_pollers)
    run.listening, run.shown = listening, shown
    return run


async def _start_runtime(
    config: Any, ray_thread: Any, signals: ShutdownSignals, gate: Any, runtime: Any
) -> None:
    """Once Ray is up: install the signal handlers and start the runtime. It is up once
    ``runtime.min_hosts`` session hosts answer: no early message waits for a process start, and
    sessions spread over every host (and node) from the first one."""
    await ray_thread.wait()
    signals.install()
    gate.phase = "starting the session runtime"
    await runtime.start(config, wait_warm=True)


async def _serve_until_stop(run: ServeRun, ray_thread: Any) -> None:
    """Step 5: serve until a stop signal or the listener's end. Once the runtime is up it is
    attached to the gate, the Telegram pollers start (one ``getUpdates`` loop per ``mode: polling``
    bot), the instance's record is refreshed and ``ready`` is printed (when the port listens).

    Raises:
        Whatever the runtime start raised; PortInUseError: the listener failed.
    """
    from actors.inbound.telegram_poll import start_pollers

    where = "/console" if any(b.platform == "console" for b in run.config.bots) else "/healthz"
    stop_requested = asyncio.ensure_future(run.signals.requested.wait())
    try:
        await _first(run.starting, stop_requested, run.serving)
        if run.starting.done():
            run.starting.result()  # a failed start raises here
            run.gate.attach(run.runtime)
            start_pollers(run.config)
            run.pollers = True
            ray_thread.refresh_record()
            listened = asyncio.ensure_future(run.listening.wait())
            await _first(listened, run.serving)
            listened.cancel()
            if run.listening.is_set():
                say(f"ready — open {run.shown}{where} (Ctrl-C stops)")
            await _first(stop_requested, run.serving)
        if run.serving.done():
            run.serving.result()  # the listener failed (PortInUseError)
    finally:
        stop_requested.cancel()


async def _shut_down(
    run: ServeRun, ray_thread: Any, address: str | None, *, failed: BaseException | None
) -> None:
    """Step 6: stop in phases (:meth:`ServeRun.stop`), then Ray — left running, with its runtime,
    after SIGTERM (:func:`keeps_ray`). ``failed``: the error that ended the run, if any (named as
    the stop's reason when no signal came first)."""
    run.signals.request(f"start-up failed: {type(failed).__name__}" if failed else "the HTTP server ended")
    keep = keeps_ray(run.signals.name, address, run.gate.ready and ray_thread.connected)
    await run.stop(keep_runtime=keep)
    # off the loop, so a third signal is still heard; a ray.init still running gets the grace
    await asyncio.to_thread(ray_thread.stop, max(5.0, float(run.config.runtime.shutdown_grace_s)), keep=keep)
    run.signals.close()
    say("stopped")


def main(argv: list[str] | None = None) -> int:
    """``sessionray serve [--config FILE] [--address RAY_ADDRESS] ...``; returns the exit code
    (module docstring). Nothing imports Ray until the pre-flight has passed."""
    import uvloop

    from actors.raylife.auth_token import RayTokenError
    from actors.raylife.cluster import ClusterConfigError
    from actors.raylife.local_ray import RayStartError

    os.environ[RAY_AUTO_CONNECT_ENV] = "0"  # before anything imports Ray (docstring of the name)
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if (start := load_start(args, "sessionray serve")) is None:
        return EXIT_CONFIG
    config, host, port, metrics_port = start.config, start.host, start.port, start.metrics_port
    listeners: list[socket.socket] = []
    http_problem: Problem | None = None
    try:  # listening at once: a connection made during the checks waits, it is not refused
        listeners = open_listeners(host, port)
        for sock in listeners:
            sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        http_problem = Problem(EXIT_PORT, str(exc))
    plan = None
    if not args.address:  # join a crashed serve's local Ray, or stop what it left (it would block us)
        from actors.raylife.head import plan_local_ray

        plan = plan_local_ray(config, config.server.admin_token_env)
        if plan.adopt is not None:
            metrics_port = None  # held by the instance joined
    problems = run_checks(config, host=host, port=port, metrics_port=metrics_port, check_http_port=False)
    problems += [http_problem] if http_problem else []
    if problems:
        for sock in listeners:
            sock.close()
        failed = PreflightFailed(problems)
        print(failed.report("sessionray serve"), file=sys.stderr)
        return failed.exit_code
    generated = admin_token_for_run(config) if args.dev_admin_token else None
    if plan is not None and plan.admin_token and args.dev_admin_token:
        generated = plan.admin_token  # the joined instance's workers have this one
    try:
        notes = [] if args.address else [quiet_ray_auth()]
    except RayTokenError as exc:  # before Ray: one line (docs/decisions.md#ops-ray-token-first-start)
        for sock in listeners:
            sock.close()
        print(f"sessionray serve: {exc} (exit code {EXIT_ENVIRONMENT}, environment)", file=sys.stderr)
        return EXIT_ENVIRONMENT
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
                    local_ray=plan,
                )
            )
    except ClusterConfigError as exc:  # a configuration that cannot run on this cluster: no traceback
        print(f"sessionray serve: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except PortInUseError as exc:  # the port was taken between the pre-flight and listen()
        print(f"sessionray serve: port in use: {exc}", file=sys.stderr)
        return EXIT_PORT
    except RayStartError as exc:  # one line, no traceback (docs/decisions.md#ops-ray-token-first-start)
        print(f"sessionray serve: {exc} (exit code {EXIT_RAY})", file=sys.stderr)
        return EXIT_RAY
    return 0

"""Ray for ``sessionray serve``: a local instance (or ``--address``: a cluster's), started in a
thread of its own so the HTTP port can answer meanwhile (docs/decisions.md#ops-graceful-shutdown).

Why a dedicated thread that lives as long as Ray: on Linux, Ray starts its daemons so that the
kernel kills them when their parent *thread* ends (``PR_SET_PDEATHSIG``). A pool thread that
ends after ``ray.init`` would take the local Ray down with it; this thread waits until
:meth:`RayThread.stop` and only then ends.

A local node that misses Ray's fixed 30 s start-up deadline (a busy machine) is stopped and
started once more. A local instance is recorded before and after ``ray.init`` (:mod:`actors.stale_ray`,
docs/decisions.md#ops-stale-ray) so that the next start can stop what a crashed driver left, and
the record is removed by :meth:`RayThread.stop`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
from typing import Any

from actors.preflight import REPO_ROOT, ensure_repo_root_on_path
from actors.stale_ray import forget_local_ray, record_local_ray, stop_own_ray

__all__ = ["RAY_START_TIMEOUT", "RayThread", "init_ray"]

log = logging.getLogger("sessionray.serve")

RAY_START_TIMEOUT = "The current node timed out during startup"
"""Ray's error when a new local node did not register within its fixed 30 s."""
_THREAD_WARNING = "SIGTERM handler is not set because current thread is not the main thread"


class _DropThreadWarning(logging.Filter):
    """Ray warns when ``ray.init`` runs outside the main thread that it did not take SIGTERM over:
    intended here (``sessionray serve`` handles its signals itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _THREAD_WARNING not in record.getMessage()


def init_ray(address: str | None, metrics_port: int) -> None:
    """``ray.init`` for the driver: namespace ``sessionray``, the repository root on every worker's
    ``PYTHONPATH``, the console's API token shared with every worker; a local instance without
    the dashboard, its metrics agent on ``metrics_port``; ``address``: join that cluster.

    Raises:
        Whatever ``ray.init`` raises (e.g. Ray's start-up timeout of a local node).
    """
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


def _session_dir() -> str | None:
    """The local instance's session directory (Ray has no public accessor for it)."""
    import ray

    node = getattr(getattr(ray, "_private", None), "worker", None)
    node = getattr(node, "_global_node", None)
    with contextlib.suppress(Exception):
        return str(node.get_session_dir_path()) if node is not None else None
    return None


class RayThread:
    """Connects this process to Ray in the ``ray-driver`` thread (see the module docstring).

    Args:
        address: ``--address`` (join a cluster; nothing is recorded), or None: a local instance.
        metrics_port: The local instance's metrics export port.
    """

    def __init__(self, address: str | None, metrics_port: int) -> None:
        self.address = address
        self.metrics_port = metrics_port
        self._done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._release = threading.Event()
        self._thread: threading.Thread | None = None
        self.recorded = False

    def start(self) -> None:
        """Begin ``ray.init`` in the thread (returns at once; :meth:`wait` for the outcome)."""
        self._thread = threading.Thread(target=self._run, name="ray-driver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        quiet = _DropThreadWarning()
        worker_log = logging.getLogger("ray._private.worker")
        worker_log.addFilter(quiet)
        try:
            if not self.address:
                self._record(None)
            self._init()
            if not self.address:
                self._record(_session_dir())
        except BaseException as exc:
            self._done.set_exception(exc)
        else:
            self._done.set_result(None)
        finally:
            worker_log.removeFilter(quiet)
        self._release.wait()

    def _init(self) -> None:
        """``ray.init``; a local node that missed Ray's fixed 30 s start-up deadline (a busy
        machine) is stopped and started once more."""
        try:
            init_ray(self.address, self.metrics_port)
        except Exception as exc:
            if self.address or RAY_START_TIMEOUT not in str(exc):
                raise
            import ray

            with contextlib.suppress(Exception):
                ray.shutdown()
            stopped = stop_own_ray()
            print(
                "sessionray: Ray's local node missed Ray's 30 s start-up deadline (a busy machine?); "
                f"stopped its {len(stopped)} process(es), starting it once more",
                flush=True,
            )
            init_ray(self.address, self.metrics_port)

    def _record(self, session_dir: str | None) -> None:
        try:
            record_local_ray(session_dir)
            self.recorded = True
        except OSError as exc:  # the start goes on; only a crash clean-up would miss it
            log.warning("could not record the local Ray instance: %r", exc)

    def refresh_record(self) -> None:
        """Record the local instance again (its worker processes started since ``ray.init``)."""
        if self.recorded:
            self._record(_session_dir())

    async def wait(self) -> None:
        """Until ``ray.init`` returned. Raises what it raised. Cancelling the wait leaves
        ``ray.init`` running (it cannot be stopped half-way; :meth:`stop` waits for it)."""
        await asyncio.shield(asyncio.wrap_future(self._done))

    @property
    def connected(self) -> bool:
        """``ray.init`` returned without an error."""
        return self._done.done() and self._done.exception() is None

    def stop(self, timeout_s: float = 60.0) -> None:
        """``ray.shutdown`` (stops a local instance), forget its record, end the thread. Waits at
        most ``timeout_s`` for a ``ray.init`` still running to return first; if it does not, the
        record is kept and the next start stops what is left (docs/decisions.md#ops-stale-ray)."""
        with contextlib.suppress(concurrent.futures.TimeoutError, Exception):
            self._done.result(timeout=timeout_s)
        if not self._done.done():
            log.warning(
                "ray.init still running after %.0f s: leaving its processes to the next start", timeout_s
            )
            import ray

            # Ray's exit hook would wait for that ray.init; this thread ends with the process,
            # and the kernel stops the daemons it started (what else is left: the next start)
            atexit.unregister(ray.shutdown)
        else:  # a failed ray.init may have started part of the instance too
            import ray

            with contextlib.suppress(Exception):
                ray.shutdown()
            if self.recorded:
                forget_local_ray()
        self._release.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

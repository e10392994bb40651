"""Ray for ``sessionray serve``: a local head (or ``--address``: a cluster), joined in a thread of
its own so that the HTTP port can answer meanwhile (docs/decisions.md#ops-graceful-shutdown).

The local head is started by ``ray start --head`` in a session of its own (:mod:`actors.raylife.head`)
so that it outlives a driver killed with ``kill -9``: the next serve with the same configuration
and code joins it — its session hosts, router shards and delivery actors (all detached) went on
working meanwhile — instead of starting Ray again (docs/decisions.md#ops-ray-outlives-driver).
The instance is recorded before it starts, once its head process is spawned and once Ray runs
(:mod:`actors.raylife.stale`, docs/decisions.md#ops-stale-ray); :meth:`RayThread.stop` stops the
instance and removes the record, or (a planned restart: ``keep``) leaves both for the next serve
(docs/decisions.md#ops-planned-restart). A thread that lives as long as the connection because Ray
starts helper processes tied to the thread that connected (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

from actors.raylife.head import RayHeadError, start_head
from actors.raylife.keeper import spawn_keeper
from actors.raylife.repo_root import REPO_ROOT, ensure_repo_root_on_path
from actors.raylife.stale import LocalRayRun, forget_local_ray, ray_temp_root, stop_instance, write_record

__all__ = ["RayStartError", "RayThread", "init_ray"]

log = logging.getLogger("sessionray.serve")

_THREAD_WARNING = "SIGTERM handler is not set because current thread is not the main thread"


class RayStartError(RuntimeError):
    """Ray did not start (``ray start --head`` failed) or could not be joined (``ray.init``
    raised); the message is one line (docs/decisions.md#ops-ray-token-first-start)."""

    @classmethod
    def of(cls, exc: Exception, address: str | None) -> RayStartError:
        """The one-line error for ``exc``, raised while starting or joining Ray (``address``:
        the cluster given with ``--address``; None: the local head)."""
        if isinstance(exc, RayHeadError):  # already one line
            text = str(exc)
        else:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
        if address:
            return cls(f"the Ray cluster at {address} could not be joined: {text}")
        return cls(f"the local Ray did not start: {text}")


class _DropThreadWarning(logging.Filter):
    """Ray warns when ``ray.init`` runs outside the main thread that it did not take SIGTERM over:
    intended here (``sessionray serve`` handles its signals itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return _THREAD_WARNING not in record.getMessage()


def init_ray(address: str) -> None:
    """``ray.init(address=…)`` for the driver: namespace ``sessionray``, the repository root on every
    worker's ``PYTHONPATH``, the console's API token shared with every worker.

    Raises:
        Whatever ``ray.init`` raises (e.g. ``ConnectionError``: no GCS at ``address``).
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
    kwargs: dict[str, Any] = {"namespace": "sessionray", "logging_level": "warning"}
    ray.init(address=address, runtime_env={"env_vars": env}, **kwargs)


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
        address: ``--address`` (join a cluster; nothing is recorded), or None: a local head.
        metrics_port: The local head's metrics export port.
        adopt: ``(record file, record)`` of a dead driver's instance to join
            (:func:`actors.raylife.head.find_adoptable`); if it cannot be joined it is stopped and a
            new head started.
        fingerprint: :func:`actors.raylife.head.instance_fingerprint`, recorded for the next start.
        shared_env: Secrets recorded with the instance (``LocalRayRun.env``).
        keep_s: ``runtime.orphaned_ray_keep_s``: a head this driver starts is stopped by its keeper
            (:mod:`actors.raylife.keeper`) once no live serve has named it for that long; None: no keeper.
    """

    def __init__(
        self,
        address: str | None,
        metrics_port: int,
        *,
        adopt: tuple[Path, LocalRayRun] | None = None,
        fingerprint: str | None = None,
        shared_env: dict[str, str] | None = None,
        keep_s: float | None = None,
    ) -> None:
        self.address = address
        self.metrics_port = metrics_port
        self.adopt = adopt
        self.fingerprint = fingerprint
        self.shared_env = dict(shared_env or {})
        self.keep_s = keep_s
        self.joined: LocalRayRun | None = None
        """The dead driver's instance this start joined (None: a new head, or a cluster)."""
        self._run_info: dict[str, Any] = {}
        self._done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._release = threading.Event()
        self._thread: threading.Thread | None = None
        self.recorded = False
        self.record: LocalRayRun | None = None
        """The instance as last recorded (its session directory and processes)."""

    def start(self) -> None:
        """Begin joining Ray in the thread (returns at once; :meth:`wait` for the outcome)."""
        self._thread = threading.Thread(target=self._run, name="ray-driver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        quiet = _DropThreadWarning()
        worker_log = logging.getLogger("ray._private.worker")
        worker_log.addFilter(quiet)
        try:
            if self.address:
                init_ray(self.address)
            else:
                self._connect_local()
                self._record(_session_dir())
                if self.joined is not None and self.adopt is not None:
                    with contextlib.suppress(OSError):
                        self.adopt[0].unlink()  # this driver's record names the instance now
                else:
                    self._spawn_keeper()
        except Exception as exc:  # one line for the operator, no traceback
            self._done.set_exception(RayStartError.of(exc, self.address))
        except BaseException as exc:
            self._done.set_exception(exc)
        else:
            self._done.set_result(None)
        finally:
            worker_log.removeFilter(quiet)
        self._release.wait()

    def _connect_local(self) -> None:
        """Join the dead driver's instance, else start a head (:func:`actors.raylife.head.start_head`)."""
        import ray

        if self.adopt is not None:
            path, run = self.adopt
            try:
                self._run_info.update(gcs_address=run.gcs_address, head_pid=run.head_pid)
                self._record(run.session_dir)  # named by a live driver: its keeper leaves it be
                init_ray(str(run.gcs_address))
                self.joined = run
                return
            except Exception as exc:
                log.warning(
                    "could not join the local Ray left by pid %s (%r): stopping it", run.driver_pid, exc
                )
                with contextlib.suppress(Exception):
                    ray.shutdown()
                stop_instance(run)
                with contextlib.suppress(OSError):
                    path.unlink()
        self._run_info.clear()
        self._record(None)
        address = start_head(self.metrics_port, self._spawned)
        self._run_info["gcs_address"] = address
        init_ray(address)

    def _spawn_keeper(self) -> None:
        """Start :mod:`actors.raylife.keeper` for the head this driver started."""
        run = self.record
        raylet = [(pid, started) for pid, started, name in (run.processes if run else []) if name == "raylet"]
        if run is None or not run.session_dir or not raylet or self.keep_s is None:
            log.warning("no keeper for the local Ray (its raylet was not found): a crash leaves it running")
            return
        spawn_keeper(Path(run.temp_root), run.session_dir, raylet[0], self.keep_s)

    def _spawned(self, head_pid: int) -> None:
        self._run_info["head_pid"] = head_pid
        self._record(None)

    def _record(self, session_dir: str | None) -> None:
        try:
            root = ray_temp_root()
            root.mkdir(parents=True, exist_ok=True)
            extra = dict(fingerprint=self.fingerprint, env=self.shared_env, **self._run_info)
            self.record = LocalRayRun.capture(root, session_dir, **extra)
            write_record(self.record, root)
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

    def stop(self, timeout_s: float = 60.0, *, keep: bool = False) -> None:
        """Disconnect, stop the local head's processes and forget its record; end the thread.
        Waits at most ``timeout_s`` for a connection still being made; if it is not made by then
        the record is kept and the next start stops what is left (docs/decisions.md#ops-stale-ray).
        ``keep``: only disconnect — the instance and its record stay for the next serve to join,
        as after a crash; its keeper stops it if none does (docs/decisions.md#ops-planned-restart).
        """
        with contextlib.suppress(concurrent.futures.TimeoutError, Exception):
            self._done.result(timeout=timeout_s)
        import ray

        if not self._done.done():
            log.warning("Ray still starting after %.0f s: leaving its processes to the next start", timeout_s)
            # Ray's exit hook would wait for that ray.init; this thread ends with the process
            atexit.unregister(ray.shutdown)
        else:
            with contextlib.suppress(Exception):
                ray.shutdown()
            if self.recorded and not keep:
                if self.record is not None:
                    stop_instance(self.record)
                forget_local_ray()
        self._release.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

"""The HTTP port before the session runtime is up: ``sessionray serve`` opens it as soon as the
configuration, the database and the listener are ready, before Ray and the session hosts
(docs/decisions.md#ops-early-accept).

* :class:`RuntimeGate` is the runtime the ingress is built over. Until :meth:`RuntimeGate.attach`
  its ``submit`` (and every other runtime call) raises :class:`RuntimeNotReady`; the ingress has
  stored the message by then and answers it as not routed yet (the start-up recovery routes it
  once the runtime is up). Afterwards every call goes to the real ``SessionRuntime``.
* :class:`StartupGate` (ASGI middleware) answers, while the runtime is not up,
  ``GET /healthz`` with 503 ``{"status": "starting"}`` and the routes that need the runtime — the
  admin API, the console page and the console's session list, steer and follow-up — with 503 and
  a message (``Retry-After``). Webhooks, OneBot WebSockets, ``/metrics`` and the rest of the
  console (history, its reply stream, the console platform API) work from the first moment; what
  must reach a Ray actor (a OneBot socket's link, a forward dialer) first awaits
  :meth:`RuntimeGate.wait_ready`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any

from ray.exceptions import RayActorError
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["RETRY_AFTER_S", "RuntimeGate", "RuntimeNotReady", "StartupGate", "needs_runtime"]

RETRY_AFTER_S = 2
"""``Retry-After`` (seconds) of a 503 answered while starting."""

_RUNTIME_ROUTES = ("/console", "/console/api/sessions", "/console/api/steer", "/console/api/follow_up")


class RuntimeNotReady(RayActorError):
    """The session runtime is not up yet (Ray and the session hosts are starting): nothing was
    routed. A ``RayActorError`` — the router shard it would call does not exist yet — so an
    ingress that answers "a router shard is unavailable" answers this the same way."""

    def __init__(self, what: str = "the session runtime") -> None:
        super().__init__("", f"{what} is not up yet: sessionray is starting (Ray and the session hosts)")


def needs_runtime(path: str) -> bool:
    """True for the routes :class:`StartupGate` answers 503 while starting (module docstring)."""
    return path == "/admin" or path.startswith("/admin/") or path in _RUNTIME_ROUTES


class RuntimeGate:
    """Stands in for ``actors.placement.runtime.SessionRuntime`` until the real one is attached.

    Args:
        config: ``runtime.config.Config``.
        prefix: The runtime's actor name prefix (what the ingress reads as ``runtime.prefix``).

    Attributes:
        phase: What the process is doing: ``starting Ray``, ``starting the session runtime``,
            ``ready``, ``stopping`` (shown on ``/healthz`` while not ready).
    """

    def __init__(self, config: Any, prefix: str = "sessionray") -> None:
        self._config = config
        self._prefix = prefix
        self._target: Any = None
        self._delivery: Any = None
        self._inbox_db: Any = None
        self._attached = asyncio.Event()
        self.phase = "starting Ray"

    def attach(self, runtime: Any) -> None:
        """From now on every call goes to ``runtime`` (a started ``SessionRuntime``)."""
        if self._delivery is not None and getattr(runtime, "delivery", None) is None:
            runtime.delivery = self._delivery
        if self._inbox_db is not None and hasattr(runtime, "attach_inbox"):
            runtime.attach_inbox(self._inbox_db)
        self._target = runtime
        self.phase = "ready"
        self._attached.set()

    @property
    def ready(self) -> bool:
        """A runtime is attached."""
        return self._target is not None

    async def wait_ready(self) -> None:
        """Until :meth:`attach` ran (Ray and the session runtime are up). What accepts or dials a
        socket before then awaits this before it touches Ray (docs/decisions.md#ops-early-accept):
        ``sessionray serve``'s ``ray.init`` runs in its own thread meanwhile, and a Ray call made
        now would race it. Call :meth:`attach` on the loop that waits."""
        await self._attached.wait()

    @property
    def runtime(self) -> Any:
        """The attached runtime. Raises :class:`RuntimeNotReady` before :meth:`attach`."""
        if self._target is None:
            raise RuntimeNotReady()
        return self._target

    @property
    def config(self) -> Any:
        """The configuration (the runtime's once attached)."""
        return self._target.config if self._target is not None else self._config

    @property
    def prefix(self) -> str:
        """The actor name prefix."""
        return str(self._target.prefix) if self._target is not None else self._prefix

    @property
    def delivery(self) -> Any:
        """The runtime's delivery pool; None before :meth:`attach` (unless one was set)."""
        return self._target.delivery if self._target is not None else self._delivery

    @delivery.setter
    def delivery(self, pool: Any) -> None:
        if self._target is not None:
            self._target.delivery = pool
        else:
            self._delivery = pool

    async def submit(self, inbound: Any, attempt: int = 0) -> Any:
        """``SessionRuntime.submit``. Raises :class:`RuntimeNotReady` before :meth:`attach`."""
        if attempt:
            return await self.runtime.submit(inbound, attempt=attempt)
        return await self.runtime.submit(inbound)

    async def status(self) -> Any:
        """``SessionRuntime.status``. Raises :class:`RuntimeNotReady` before :meth:`attach`."""
        return await self.runtime.status()

    def attach_inbox(self, db: Any) -> None:
        """``SessionRuntime.attach_inbox`` (when the runtime has it): passed on now, or at
        :meth:`attach` — the ingress hands its database over before the runtime is up."""
        self._inbox_db = db
        if self._target is not None and hasattr(self._target, "attach_inbox"):
            self._target.attach_inbox(db)

    def __getattr__(self, name: str) -> Any:
        """Any other ``SessionRuntime`` attribute: the attached runtime's. Before :meth:`attach`,
        a method of ``SessionRuntime`` raises :class:`RuntimeNotReady` when called (a coroutine
        method when awaited); anything else is an ``AttributeError``."""
        if name.startswith("_"):
            raise AttributeError(name)
        target = self.__dict__.get("_target")
        if target is not None:
            return getattr(target, name)
        from actors.placement.runtime import SessionRuntime

        method = getattr(SessionRuntime, name, None)
        if not callable(method):
            raise AttributeError(name)
        if inspect.iscoroutinefunction(method):

            async def not_ready(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeNotReady()

            return not_ready

        def not_ready_now(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeNotReady()

        return not_ready_now


class StartupGate:
    """ASGI middleware: the answers of the routes that need the runtime while it is not up
    (module docstring)."""

    def __init__(self, app: ASGIApp, gate: RuntimeGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.gate.ready:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/healthz":
            await _answer(send, {"status": "starting", "phase": self.gate.phase})
        elif path == "/console":  # a browser: a line to read, and it reloads by itself
            text = f"sessionray is starting ({self.gate.phase}); this page reloads in {RETRY_AFTER_S} s\n"
            await _answer(
                send, text.encode(), b"text/plain; charset=utf-8", [(b"refresh", b"%d" % RETRY_AFTER_S)]
            )
        elif needs_runtime(path):
            error = f"sessionray is starting ({self.gate.phase}): try again in a few seconds"
            await _answer(send, {"error": error, "status": "starting"})
        else:
            await self.app(scope, receive, send)


async def _answer(
    send: Send,
    body: dict[str, Any] | bytes,
    media_type: bytes = b"application/json",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """503 with ``Retry-After`` :data:`RETRY_AFTER_S`."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    head = [
        (b"content-type", media_type),
        (b"content-length", str(len(data)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
        *(headers or []),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": head})
    await send({"type": "http.response.body", "body": data})

"""``SessionRuntime``: the handle the ingress, admin API and CLI use (actor interfaces, contract 2).

Topology it starts (all named actors in Ray namespace ``sessionray``; docs/decisions.md#session-hosts)::

    ingress (driver or Serve replica): SessionRuntime — cache session_key → (host, epoch)
        │ place (cache miss, "moved", host died)          shard = crc32(session_key) % N
        ▼
    {prefix}-router-{0..N-1}   RouterActor, detached   directory key → host, epoch, control
        │ activate / passivate / control                 ▲ forget (host passivated a session)
        ▼                                                │
    SessionHost × H  (owned by {prefix}-hosts, HostSupervisor, detached) ── one SessionCore per live session
        ▲ submit (turn group; streaming: accepted, then the TurnResult)
        │ straight from the ingress for a cached live session   │ DeliveryPool.notify(key)
                                                                ▼
                                              sessionray-delivery-{0..M-1}

A message for a live session whose host the ingress has cached takes one Ray call (ingress →
host) plus the hand-off to delivery; a cache miss adds one call to the router shard
(docs/decisions.md#session-direct-path).

:meth:`SessionRuntime.start` creates them (or attaches to running ones: ``get_if_exists``);
:meth:`SessionRuntime.connect` only attaches (a Ray Serve replica). Control of a live session is
one :class:`~runtime.session.control.ControlRequest` (:meth:`SessionRuntime.control`; ``steer``,
``follow_up``, ``abort`` and ``archive`` build one); a refusal is raised by the router shard as a
:class:`~runtime.session.control.ControlError` (``NotMasterError``, ``UnknownSessionError``,
re-exported here) and re-raised here as itself, without Ray's wrapper.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, Literal

import ray
from pydantic import BaseModel

from actors.placement.admission import KeyOrder
from actors.placement.hosts.setup import ConfigSetupFactory, agent_code, business_tools, output_schema
from actors.placement.hosts.supervisor import NAMESPACE, HostSupervisor
from actors.placement.router import RouterActor, shard_of
from actors.placement.submit import SubmitPath
from runtime.session.control import (
    ControlError,
    ControlKind,
    ControlReply,
    ControlRequest,
    NotMasterError,
    UnknownSessionError,
)
from runtime.session.turn import SetupFactory

__all__ = ["NotMasterError", "SessionInfo", "SessionRuntime", "SubmitResult", "UnknownSessionError"]


@contextlib.contextmanager
def _unwrapped() -> Iterator[None]:
    """Re-raise a :class:`~runtime.session.control.ControlError` that a router shard raised as
    itself: Ray hands it over wrapped in a ``RayTaskError`` that is also an instance of the
    error's class but whose message is the remote traceback (the admin API answers with the
    message)."""
    try:
        yield
    except ControlError as exc:
        cause = getattr(exc, "cause", None) if isinstance(exc, ray.exceptions.RayTaskError) else exc
        raise (cause if isinstance(cause, ControlError) else exc) from None


class SubmitResult(BaseModel):
    """Answer to :meth:`SessionRuntime.submit`.

    ``accepted``: the message will get a turn (``seq`` set) or was stored without one (``seq``
    None: un-triggered). ``duplicate``: already seen (same platform, bot_id, message_id) by the
    session's host. ``busy``: the session's mailbox is full or no host had room in time — nothing
    was accepted (the ingress leaves the message in its durable inbox for the recovery loop:
    docs/decisions.md#inbox-durable).
    """

    status: Literal["accepted", "duplicate", "busy"]
    retry_after_s: float | None = None
    seq: int | None = None


class SessionInfo(BaseModel):
    """One live session as the router shard sees it (``idle_s``: seconds since last activity)."""

    session_key: str
    session_id: str
    shard: int
    pending: int
    turns: int
    """Turns run, the steers / follow-ups that ran as a turn of their own included."""
    idle_s: float | None
    """None when its host did not answer."""
    host: int = -1
    """Slot index of the session's host."""
    actor_id: str | None = None
    """Hex Ray actor id of the session's host."""
    epoch: int = 0
    """The router shard's placement epoch."""
    actor: dict[str, Any] | None = None
    """The session core's ``status()`` on its host (only from :meth:`SessionRuntime.session`)."""


class SessionRuntime:
    """Handle on the router shards and the host supervisor; sends messages to the hosts.

    Args:
        prefix: Name prefix of the named actors (``sessionray`` → ``sessionray-router-0``,
            ``sessionray-hosts``); tests use a unique prefix per runtime.
    """

    def __init__(self, prefix: str = "sessionray") -> None:
        self.prefix = prefix
        self.config: Any = None
        self.routers: list[Any] = []
        self.hosts: Any = None
        self.delivery: Any = None
        self._owns_delivery = False
        self._path = SubmitPath(self._router, KeyOrder())

    @property
    def hosts_name(self) -> str:
        """Name of the host supervisor actor."""
        return f"{self.prefix}-hosts"

    def router_name(self, i: int) -> str:
        """Name of router shard ``i``."""
        return f"{self.prefix}-router-{i}"

    async def start(
        self,
        config: Any,
        *,
        setup_factory: SetupFactory | None = None,
        delivery: Any = None,
        wait_warm: bool = False,
    ) -> SessionRuntime:
        """Create (or attach to) the host supervisor and the router shards; Ray must be initialized.

        Args:
            config: ``runtime.config.Config``.
            setup_factory: ``(session_key) -> SessionSetup`` run inside session hosts; default
                :class:`actors.placement.hosts.setup.ConfigSetupFactory` (the configured model, IM preset).
            delivery: A delivery pool (``pick``/``deliver``); default: EDGE's ``DeliveryPool`` with
                ``runtime.delivery_actors`` actors.
            wait_warm: Return only once ``runtime.min_hosts`` hosts answer (benchmarks, tests).

        With ``ai.probe_on_start`` the configured models' structured-output tiers are probed here,
        before the hosts start.

        Raises:
            actors.raylife.cluster.ClusterConfigError: multi-node Ray cluster on SQLite.
            runtime.session.tool_md.ToolMdError: a ``*.tool.md`` in ``ai.tools_dir`` cannot be loaded.
            runtime.config.entry_points.PythonToolError: an ``ai.python_tools`` entry, a pre-tool,
                a deferred task or a faux ``ai.providers.<alias>.script`` cannot be loaded.
            runtime.reply.custom_output.OutputSchemaError: a custom ``ai.agent.output_schema``
                cannot be used.
        """
        from actors.models.faux_script import faux_scripts
        from actors.raylife.cluster import ensure_database_fits_cluster
        from runtime.memory.connection_budget import warn_if_over_connection_budget
        from runtime.memory.db import Database

        ensure_database_fits_cluster(config.database.url)
        # a bad *.tool.md or Python tool stops start-up (docs/decisions.md#tool-md-hard-fail)
        business_tools(config)
        agent_code(config)  # ai.agent.pre_tools / deferred_tasks: a bad reference stops start-up too
        faux_scripts(config.ai.providers)  # so does an ai.providers.<alias>.script that cannot be imported
        output_schema(config)  # a custom ai.agent.output_schema that cannot be used stops it too
        db = Database(config.database.url, threads=1)
        try:
            await asyncio.to_thread(db.create_tables)
            await asyncio.to_thread(warn_if_over_connection_budget, db, config.runtime)
            if config.ai.probe_on_start:  # docs/decisions.md#structured-capability-cache
                await _probe_on_start(config, db)
        finally:
            db.dispose()
        self.config = config
        rt = config.runtime
        if delivery is None:
            from actors.delivery.pool import DeliverySettings, create_pool

            delivery = create_pool(DeliverySettings.from_config(config), rt.delivery_actors)
            self._owns_delivery = True
        self.delivery = delivery
        factory = setup_factory or ConfigSetupFactory(config)
        self.hosts = HostSupervisor.options(  # type: ignore[attr-defined]
            name=self.hosts_name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True
        ).remote(config, factory, delivery)
        self.routers = [
            RouterActor.options(  # type: ignore[attr-defined]
                name=self.router_name(i), namespace=NAMESPACE, lifetime="detached", get_if_exists=True
            ).remote(config, i, rt.router_shards, self.hosts_name, self.router_name(i))
            for i in range(rt.router_shards)
        ]
        await self.hosts.start.remote(wait=wait_warm)
        await asyncio.gather(*(r.status.remote() for r in self.routers))
        return self

    @classmethod
    def connect(cls, config: Any, prefix: str = "sessionray") -> SessionRuntime:
        """Attach to a running runtime by actor names (e.g. from a Ray Serve replica).

        Raises:
            ValueError: an actor is missing (the runtime was not started).
        """
        rt = cls(prefix)
        rt.config = config
        rt.hosts = ray.get_actor(rt.hosts_name, namespace=NAMESPACE)
        rt.routers = [
            ray.get_actor(rt.router_name(i), namespace=NAMESPACE) for i in range(config.runtime.router_shards)
        ]
        return rt

    async def stop(self) -> None:
        """Kill the router shards, the host supervisor (and every host it owns) and, when this
        handle created it, the delivery pool. Session state is all in SQL."""
        await self._path.close()
        for r in self.routers:
            with contextlib.suppress(Exception):
                await r.shutdown.remote()
            with contextlib.suppress(Exception):
                ray.kill(r, no_restart=True)
        if self.hosts is not None:
            with contextlib.suppress(Exception):
                await self.hosts.shutdown.remote()
            with contextlib.suppress(Exception):
                ray.kill(self.hosts, no_restart=True)
        if self._owns_delivery and self.delivery is not None:
            with contextlib.suppress(Exception):
                self.delivery.stop()
        self.routers, self.hosts = [], None

    async def detach(self) -> None:
        """Let go of the runtime without stopping it: stop watching turns and write the buffered
        inbox marks; the detached actors go on running for the next serve to join
        (docs/decisions.md#ops-planned-restart)."""
        await self._path.close()
        self.routers, self.hosts = [], None

    async def in_flight(self) -> int:
        """Turns in flight in the whole instance: every host's accepted messages whose turn has not
        ended — this process's, another ingress's, the router shards' inbox recovery's — and at
        least those this process submitted and still watches (all it can count when the hosts do
        not answer). ``sessionray serve`` waits for them on SIGTERM
        (docs/decisions.md#ops-graceful-shutdown)."""
        mine = int(self._path.status()["pending"])
        if self.hosts is None:
            return mine
        try:
            return max(mine, int(await self.hosts.in_flight.remote()))
        except Exception:
            return mine

    def in_flight_ids(self, session_key: str) -> set[str]:
        """Message ids of ``session_key`` this process submitted whose turn is still running (the
        ingress does not send those again: docs/decisions.md#inbox-durable)."""
        return self._path.in_flight_ids(session_key)

    def attach_inbox(self, db: Any) -> None:
        """Mark this process's submissions in the durable inbox on ``db`` (a
        :class:`runtime.memory.db.Database`; the ingress passes its own): ``routed`` when a host
        accepts a message, ``handled`` when its turn result arrives, batched
        (docs/decisions.md#inbox-durable). :meth:`stop` writes what is buffered."""
        from runtime.memory.inbox_marks import InboxMarks

        self._path.marks = InboxMarks(db)

    def _router(self, session_key: str) -> Any:
        if not self.routers:
            raise RuntimeError("SessionRuntime is not started")
        return self.routers[shard_of(session_key, len(self.routers))]

    # ------------------------------------------------------------------ inbound

    async def submit(self, inbound: Any, attempt: int = 0) -> SubmitResult:
        """Send an ``InboundMessage`` to its session's host (see :class:`SubmitResult` and
        :class:`actors.placement.submit.SubmitPath`): straight to the cached host of a live
        session, through the key's router shard otherwise. Returns once the host accepted (or
        refused) it; the turn runs on, watched here (a host that dies mid-turn: the message is
        sent once more to the session's new host). ``attempt``: 0 for a first delivery, 1 for a
        stored message sent again (:meth:`actors.placement.submit.SubmitPath.submit`).

        Raises:
            ray.exceptions.RayActorError / ActorUnavailableError: the shard is down or restarting.
        """
        return SubmitResult(**await self._path.submit(inbound, attempt))

    # ------------------------------------------------------------------ control

    async def control(self, request: ControlRequest) -> ControlReply:
        """Carry out ``request`` on its live session through the key's router shard.

        Raises:
            NotMasterError: a ``steer`` / ``follow_up`` whose sender is not a master of the
                session's bot (counted).
            UnknownSessionError: no live session ``request.session_key``.
            MalformedKeyError: a malformed key.
        """
        with _unwrapped():
            reply: ControlReply = await self._router(request.session_key).control.remote(request)
        return reply

    async def steer(self, session_key: str, text: str, sender_id: str) -> str:
        """Steer the session's latest active turn (``"steered"``), or run the text as a turn when
        none is active (``"started"``). Raises like :meth:`control` (and
        :class:`~runtime.session.control.BadControlRequest` for an empty text or sender)."""
        request = ControlRequest(
            kind=ControlKind.STEER, session_key=session_key, text=text, sender_id=sender_id
        )
        return str((await self.control(request)).result)

    async def follow_up(self, session_key: str, text: str, sender_id: str) -> str:
        """Queue a follow-up on the latest active turn (``"queued"``) or run it as a turn
        (``"started"``). Raises like :meth:`steer`."""
        request = ControlRequest(
            kind=ControlKind.FOLLOW_UP, session_key=session_key, text=text, sender_id=sender_id
        )
        return str((await self.control(request)).result)

    async def abort(self, session_key: str) -> int:
        """Abort the session's running turns; returns how many. Raises like :meth:`control`."""
        request = ControlRequest(kind=ControlKind.ABORT, session_key=session_key)
        return int((await self.control(request)).result)

    async def archive(self, session_key: str) -> str:
        """Archive the live session's epoch (``/new``); returns the new ``session_id``. Raises
        like :meth:`control`."""
        request = ControlRequest(kind=ControlKind.ARCHIVE, session_key=session_key)
        return str((await self.control(request)).result)

    async def archive_stored(self, session_key: str) -> str:
        """Archive the epoch of ``session_key`` through its router shard, live or not (the admin
        ``archive`` of a passivated session): the shard holds the key while it archives, so no
        message can activate the session on the old epoch meanwhile. Returns the
        new ``session_id``.

        Raises:
            UnknownSessionError: not live and no active stored epoch.
            MalformedKeyError: a malformed key.
        """
        with _unwrapped():
            reply: ControlReply = await self._router(session_key).archive_stored.remote(session_key)
        return str(reply.result)

    async def passivate(self, session_key: str) -> bool:
        """Passivate an idle live session now; returns whether it was passivated."""
        return bool(await self._router(session_key).passivate.remote(session_key))

    # ------------------------------------------------------------------ introspection

    async def sessions(self) -> list[SessionInfo]:
        """Every live session over all shards, by key."""
        parts = await asyncio.gather(*(r.sessions.remote() for r in self.routers))
        return sorted((SessionInfo(**s) for part in parts for s in part), key=lambda s: s.session_key)

    async def session(self, session_key: str) -> SessionInfo | None:
        """One live session with its actor's status, or ``None``."""
        res = await self._router(session_key).session.remote(session_key)
        return SessionInfo(**res) if res is not None and "session_id" in res else None

    async def context(self, session_key: str) -> list[dict[str, Any]]:
        """The live context of a session as JSON dicts (debugging, tests); ``[]`` when not live."""
        return list(await self._router(session_key).context.remote(session_key))

    async def status(self) -> dict[str, Any]:
        """``{"live_sessions", "hosts", "pending", "turns", "throughput_msg_s", "submit": {...},
        "supervisor": {...}, "host_list": [...], "shards": [...]}`` — ``pending``, ``turns`` and
        ``throughput_msg_s`` (last 60 s) as this process sent and watched them; ``submit`` its
        counters; ``host_list`` one row per host (``index``, ``live``, ``uss_mib``, ...)."""
        shards = await asyncio.gather(*(r.status.remote() for r in self.routers))
        sup = dict(await self.hosts.status.remote()) if self.hosts is not None else {}
        host_list = sup.pop("hosts_detail", [])
        path = self._path.status()
        return {
            "live_sessions": sum(s["live"] for s in shards),
            "hosts": sup.get("hosts", 0),
            "pending": path["pending"],
            "turns": path["turns"],
            "throughput_msg_s": path["throughput_msg_s"],
            "submit": path,
            "supervisor": sup,
            "host_list": host_list,
            "shards": list(shards),
        }


async def _probe_on_start(config: Any, db: Any) -> None:
    """``ai.probe_on_start``: probe every configured model's structured-output tier now (each one
    unknown or older than ``ai.capability_ttl_s``) and store it for every process
    (docs/decisions.md#structured-capability-cache). A failed probe is logged, never fatal."""
    from actors.models.faux_script import register_configured_providers
    from runtime.session.capabilities import capability_cache, probe_configured

    register_configured_providers(config.ai.providers)  # api_key_env and scripted faux providers
    await probe_configured(config, capability_cache(config, db))

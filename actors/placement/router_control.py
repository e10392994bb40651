"""The admin face of a router shard: routing of a
:class:`~runtime.session.control.ControlRequest` (``steer`` / ``follow_up``, masters only,
docs/decisions.md#steer-masters-only; ``abort``; ``archive``) to a live session's host, with
refusals raised as :class:`~runtime.session.control.ControlError` subclasses
(docs/decisions.md#typed-control-request); the archive of a session that is not live
(:meth:`RouterAdminMixin.archive_stored`: in SQL, while the shard holds the key so no activation
can start meanwhile); and the introspection the admin API and CLI read (``sessions``,
``session``, ``context``, ``status``).

:class:`RouterAdminMixin` is a base class of :class:`actors.placement.router.RouterActor` (Ray exposes the
inherited methods as actor methods); it only reads the shard's directory, and drops an entry
through the shard's ``_drop`` when a control call finds the session gone from its host.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import ray

from actors.placement.admission import KeyOrder
from runtime import metrics
from runtime.session.control import (
    ControlKind,
    ControlReply,
    ControlRequest,
    MalformedKeyError,
    NotMasterError,
    UnknownSessionError,
)

if TYPE_CHECKING:
    from runtime.memory.repository import ContextRepository

__all__ = ["DEAD", "RouterAdminMixin", "archive_active_epoch"]

DEAD = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
"""A call failed because the actor (a session host) died or is unreachable."""


def _is_master(config: Any, platform: str, bot_id: str, sender_id: str) -> bool:
    for bot in getattr(config, "bots", []) or []:
        if getattr(bot, "platform", None) == platform and str(getattr(bot, "self_id", "")) == bot_id:
            return str(sender_id) in {str(m) for m in getattr(bot, "masters", []) or []}
    return False


async def archive_active_epoch(repo: ContextRepository, session_key: str) -> str | None:
    """Archive the stored *active* epoch of ``session_key`` (``/new`` on a passivated session) and
    start the next; the new ``session_id``, or ``None`` when the key has no active epoch (nothing
    is written then).

    Raises:
        SessionKeyError: malformed ``session_key``.
        RuntimeError: other processes changed the key's epochs 8 times in a row.
    """
    if not any(e.status == "active" for e in await repo.list_sessions(session_key)):
        return None
    return await repo.archive_session(session_key)


class RouterAdminMixin:
    """Control routing and introspection of one router shard (see the module docstring)."""

    config: Any
    shard: int
    counts: dict[str, int]
    _dir: dict[str, Any]
    _order: KeyOrder
    _sql_archives: asyncio.Lock | None = None
    """One SQL archive at a time per shard: a shard holds at most one SQL connection (rare admin calls)."""

    def _drop(self, entry: Any) -> None:  # pragma: no cover - provided by RouterActor
        raise NotImplementedError

    def _host_died(self, host_id: str) -> None:  # pragma: no cover - provided by RouterActor
        raise NotImplementedError

    async def _settled(self, key: str) -> Any:  # pragma: no cover - provided by RouterActor
        raise NotImplementedError

    # ------------------------------------------------------------------ control

    async def control(self, request: ControlRequest) -> ControlReply:
        """Forward ``request`` (steer, follow-up, abort, archive) to the session's host.

        ``steer`` and ``follow_up`` are for the bot's masters only
        (docs/decisions.md#steer-masters-only); a refusal is counted in
        ``sessionray_control_total{kind, outcome="refused"}``.

        Raises:
            NotMasterError: a master-only kind from a sender who is not a master of the bot.
            MalformedKeyError: a malformed key.
            UnknownSessionError: no live session, or its host lost it (the next message
                re-activates the session).
        """
        from runtime.keys import SessionKeyError, parse_session_key

        kind, session_key = request.kind, request.session_key
        label = kind.value  # the metric label: a plain str
        try:
            key = parse_session_key(session_key)
        except SessionKeyError as exc:
            raise MalformedKeyError(str(exc)) from None
        if kind.master_only and not _is_master(self.config, key.platform, key.bot_id, request.sender_id):
            metrics.CONTROL.inc(kind=label, outcome="refused")
            self.counts["refused"] += 1
            raise NotMasterError(
                f"{request.sender_id!r} is not a master of bot {key.platform}:{key.bot_id}; "
                f"only masters may {kind.replace('_', '-')}"
            )
        entry = await self._settled(session_key)
        if entry is None or entry.host is None:
            metrics.CONTROL.inc(kind=label, outcome="unknown")
            raise UnknownSessionError(f"no live session {session_key!r} (never seen, or passivated)")
        try:
            reply: ControlReply = await entry.host.control.remote(request)
        except UnknownSessionError:  # the host passivated it meanwhile (its ``forget`` is on the way)
            self._drop(entry)
            metrics.CONTROL.inc(kind=label, outcome="unknown")
            raise UnknownSessionError(f"no live session {session_key!r} (passivated)") from None
        except DEAD as exc:
            self._host_died(entry.host_id)
            metrics.CONTROL.inc(kind=label, outcome="unknown")
            raise UnknownSessionError(f"session {session_key!r} was lost with its host: {exc}") from None
        if kind == ControlKind.ARCHIVE:
            entry.session_id = str(reply.result)
        metrics.CONTROL.inc(kind=label, outcome=str(reply.result) if kind.master_only else "ok")
        return reply

    async def archive_stored(self, session_key: str) -> ControlReply:
        """Archive the epoch of ``session_key`` whether it is live or not (admin ``archive`` of a
        passivated session).

        The key's ordering ticket is taken before the first ``await`` and held to the end, and any
        passivation of the key in flight is awaited (``_settled``): no ``submit`` of the key can
        activate it meanwhile, so a message arriving during the archive is stamped on the new
        epoch, never on the archived one. A live session is archived by its actor (as
        :meth:`control` ``archive``); one that is not live is archived in SQL here
        (:func:`archive_active_epoch`) on a :class:`runtime.memory.db.Database` of
        ``database.url`` opened for this call only (one connection, closed before returning; one
        such call at a time per shard).

        Returns:
            The ``archive`` reply (``result``: the new ``session_id``).

        Raises:
            MalformedKeyError: a malformed key (nothing is written).
            UnknownSessionError: not live and no active stored epoch (nothing is written then).
        """
        from runtime.keys import SessionKeyError, parse_session_key

        try:
            parse_session_key(session_key)
        except SessionKeyError as exc:
            raise MalformedKeyError(str(exc)) from None
        request = ControlRequest(kind=ControlKind.ARCHIVE, session_key=session_key)
        async with self._order.turn(session_key):
            if await self._settled(session_key) is not None:
                return await self.control(request)
            new_id = await self._archive_in_sql(session_key)
        if new_id is None:
            metrics.CONTROL.inc(kind=request.kind.value, outcome="unknown")
            raise UnknownSessionError(f"no live session {session_key!r} and no active stored epoch")
        metrics.CONTROL.inc(kind=request.kind.value, outcome="ok")
        return ControlReply(kind=request.kind, session_key=session_key, result=new_id)

    async def _archive_in_sql(self, session_key: str) -> str | None:
        # SQL only on this rare admin path (docs/decisions.md#ops-lazy-exports)
        from runtime.memory.db import Database
        from runtime.memory.repository import ContextRepository

        if self._sql_archives is None:
            self._sql_archives = asyncio.Lock()
        url = getattr(getattr(self.config, "database", None), "url", None)
        async with self._sql_archives:
            db = await asyncio.to_thread(Database, url, threads=1, max_overflow=0)
            try:
                return await archive_active_epoch(ContextRepository(db), session_key)
            finally:
                await asyncio.to_thread(db.dispose)

    # ------------------------------------------------------------------ introspection

    async def sessions(self) -> list[dict[str, Any]]:
        """Live sessions of this shard: ``session_key``, ``session_id``, ``shard``, ``host`` (the
        host's slot index), ``actor_id`` (the hex Ray actor id of its host), ``epoch``, and from
        the host: ``pending``, ``turns`` (every turn run, steers / follow-ups that ran as a turn
        of their own included), ``idle_s``. A host that does not answer lists its sessions with
        ``pending`` 0 and ``idle_s`` None."""
        placed = [e for e in self._dir.values() if e.host is not None]
        by_host: dict[str, list[Any]] = {}
        for e in placed:
            by_host.setdefault(e.host_id, []).append(e)

        async def ask(entries: list[Any]) -> dict[str, dict[str, Any]]:
            try:
                rows = await entries[0].host.sessions.remote([e.key for e in entries])
            except Exception:
                return {}
            return {r["session_key"]: r for r in rows}

        answers: dict[str, dict[str, Any]] = {}
        for part in await asyncio.gather(*(ask(es) for es in by_host.values())):
            answers.update(part)
        return [
            {
                "session_key": e.key,
                "session_id": answers.get(e.key, {}).get("session_id", e.session_id),
                "shard": self.shard,
                "host": e.index,
                "actor_id": e.host_id or None,
                "epoch": e.epoch,
                "pending": answers.get(e.key, {}).get("pending", 0),
                "turns": answers.get(e.key, {}).get("turns", 0),
                "idle_s": answers.get(e.key, {}).get("idle_s"),
            }
            for e in placed
        ]

    async def session(self, session_key: str) -> dict[str, Any] | None:
        """Details of one live session (router view plus the host's ``status(session_key)`` under
        ``actor``), or ``None``."""
        entry = await self._settled(session_key)
        if entry is None or entry.host is None:
            return None
        base = next(
            (s for s in await self.sessions() if s["session_key"] == session_key),
            {"session_key": session_key},
        )
        with contextlib.suppress(Exception):
            base["actor"] = await entry.host.status.remote(session_key)
        return base

    async def context(self, session_key: str) -> list[dict[str, Any]]:
        """The live context of ``session_key`` as JSON dicts (empty when not live)."""
        entry = await self._settled(session_key)
        if entry is None or entry.host is None:
            return []
        try:
            return list(await entry.host.context_messages.remote(session_key))
        except UnknownSessionError:
            return []

    async def pid(self) -> int:
        """This shard's OS process id (tests kill it with SIGKILL)."""
        import os

        return os.getpid()

    async def status(self) -> dict[str, Any]:
        """Counters of this shard plus ``live`` (sessions placed on a host): ``placed``, ``forgotten``
        (passivations its hosts told), ``moved`` (stale cache entries callers reported),
        ``dead_hosts``, ``busy``, ``evictions`` (placements that passivated an idle session),
        ``refused`` (steer / follow-up from a non-master)."""
        # placed only, as ``sessions`` lists them: an entry still waiting for room is not live
        live = sum(1 for e in self._dir.values() if e.host is not None)
        return {"shard": self.shard, "live": live, **self.counts}

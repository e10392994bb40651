"""Archive of a session that is not live goes through its router shard, on real local
Ray: the admin ``POST /admin/sessions/{key}/archive`` keeps its HTTP contract (docs/operations.md,
"HTTP API and CLI") over a real ``SessionRuntime``, and a message that reaches the shard while the
archive runs activates the session on the *new* epoch, never on the archived one.

Ray does not order calls to an async actor, so the ordering test drives the router *class*
in-process (``RouterActor.__ray_metadata__.modified_class``) on the test's event loop against the
module's real host supervisor and session hosts, with a ``SubmitPath`` of its own whose placements
go to that shard: calls started one after the other reach the shard in that order. There the SQL
archive is held at its start by a gate (then runs for real) so the test sees that the message
waits for it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from actors.http.admin import admin_routes
from actors.placement.admission import KeyOrder
from actors.placement.router import RouterActor
from actors.placement.router_control import archive_active_epoch
from actors.placement.submit import SubmitPath
from runtime.keys import SessionKeyError, parse_session_key
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.session.control import ControlReply, MalformedKeyError, UnknownSessionError
from tests.actors.edge_support import serve_in_thread
from tests.actors.session_support import Harness, eventually, inbound, key_of, running_runtime

pytestmark = pytest.mark.ray

TOKEN_ENV = "ADMIN_ARCHIVE_STORED_TOKEN"
TOKEN = "admin-archive-stored-token"


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    with running_runtime(tmp_path_factory.mktemp("archive"), fixtures_dir) as harness:
        yield harness


@pytest.fixture
def repo(h: Harness) -> Iterator[ContextRepository]:
    db = Database(h.config.database.url, threads=1)
    try:
        yield ContextRepository(db)
    finally:
        db.dispose()


async def epochs(repo: ContextRepository, key: str) -> list[tuple[str, str]]:
    """``(session_id, status)`` of every stored epoch of ``key``, oldest first."""
    return [(e.session_id, e.status) for e in await repo.list_sessions(key)]


async def user_texts(repo: ContextRepository, session_id: str) -> list[str]:
    """The content of each user message stored in epoch ``session_id`` (plain text here)."""
    return [
        str(row.message.content) for row in await repo.load_stored(session_id) if row.message.role == "user"
    ]


async def reply(h: Harness, submit: Any, user: str, text: str) -> None:
    """Submit ``echo <text>`` for ``user`` through ``submit`` and wait for the reply at the platform API."""
    before = len(h.sent(user))
    res = await submit(inbound(user, f"echo {text}"))
    assert (res if isinstance(res, dict) else res.model_dump())["status"] == "accepted"
    await eventually(lambda: len(h.sent(user)) > before, 120, f"the reply to {user}")


class _Method:
    """``handle.method.remote(*args)`` of a Ray actor, for an object living in this process."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        return asyncio.ensure_future(self._fn(*args))


class LocalShard:
    """A router shard living in this process (real hosts and supervisor behind it) and a submit
    path whose placements go to it: ``submit(inbound)`` as ``SessionRuntime.submit`` answers."""

    def __init__(self, router: Any) -> None:
        self.router = router
        self.place = _Method(router.place)
        self.path = SubmitPath(lambda key: self, KeyOrder())

    async def submit(self, msg: Any) -> dict[str, Any]:
        return await self.path.submit(msg)


@contextlib.asynccontextmanager
async def local_router(h: Harness, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LocalShard]:
    """A router shard living in this process, bound to the module's host supervisor; its idle
    sessions are passivated at the end."""
    monkeypatch.setattr("actors.raylife.metrics.install_ray_metrics", lambda: None)
    router = RouterActor.__ray_metadata__.modified_class(  # type: ignore[attr-defined]
        h.config, 0, 1, h.rt.hosts_name, "local-shard"
    )
    shard = LocalShard(router)
    try:
        yield shard
    finally:
        for s in await router.sessions():
            with contextlib.suppress(Exception):
                await router.passivate(s["session_key"])
        await shard.path.close()
        await router.shutdown()


async def test_admin_archive_of_a_passivated_session_keeps_the_http_contract(
    h: Harness, repo: ContextRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    user = "71000"
    key = key_of(user)
    await reply(h, h.rt.submit, user, "before")
    await eventually(lambda: h.rt.passivate(key), 60, "the session to be idle and passivated")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with serve_in_thread(Starlette(routes=admin_routes(h.rt, TOKEN_ENV))) as url:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
            got = await http.post(f"/admin/sessions/{key}/archive")
            assert (got.status_code, got.json()) == (
                200,
                {"status": "ok", "kind": "archive", "session_key": key, "result": f"{key}#2"},
            )
            assert await epochs(repo, key) == [(f"{key}#1", "archived"), (f"{key}#2", "active")]

            # a key with no live session and no stored epoch stays 404 (the runtime's message)
            unknown = key_of("71099")
            missing = await http.post(f"/admin/sessions/{unknown}/archive")
            assert (missing.status_code, missing.json()) == (
                404,
                {"error": f"no live session {unknown!r} (never seen, or passivated)"},
            )
            assert await epochs(repo, unknown) == []

            # the next message continues on the new epoch; a live session is archived by its actor
            await reply(h, h.rt.submit, user, "after")
            info = await h.rt.session(key)
            assert info is not None and info.session_id == f"{key}#2"
            live = await http.post(f"/admin/sessions/{key}/archive")
            assert (live.status_code, live.json()) == (
                200,
                {"status": "ok", "kind": "archive", "session_key": key, "result": f"{key}#3"},
            )
    statuses = [(f"{key}#1", "archived"), (f"{key}#2", "archived"), (f"{key}#3", "active")]
    assert await epochs(repo, key) == statuses
    assert [await user_texts(repo, f"{key}#{n}") for n in (1, 2, 3)] == [["echo before"], ["echo after"], []]
    await eventually(lambda: h.rt.passivate(key), 60, "the session to be idle and passivated")


async def test_a_message_arriving_during_the_stored_archive_activates_on_the_new_epoch(
    h: Harness, repo: ContextRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with local_router(h, monkeypatch) as shard:
        router = shard.router
        user = "71100"
        key = key_of(user)
        await reply(h, shard.submit, user, "m1")
        await eventually(lambda: router.passivate(key), 60, "the session to be idle and passivated")
        # the SQL archive is held at its start (real SQL once released) while a message arrives:
        # the shard holds the key, so the message's placement neither activates nor answers meanwhile
        entered, gate = asyncio.Event(), asyncio.Event()

        async def held(repo: ContextRepository, session_key: str) -> str | None:
            entered.set()
            await gate.wait()
            return await archive_active_epoch(repo, session_key)

        monkeypatch.setattr("actors.placement.router_control.archive_active_epoch", held)
        archive = asyncio.ensure_future(router.archive_stored(key))
        await entered.wait()
        message = asyncio.ensure_future(shard.submit(inbound(user, "echo m2")))
        for _ in range(20):
            await asyncio.sleep(0)
        assert (message.done(), key in router._dir) == (False, False)
        gate.set()
        assert (await archive, await message) == (
            ControlReply(kind="archive", session_key=key, result=f"{key}#2"),
            {"status": "accepted", "retry_after_s": None, "seq": 1},
        )
        await eventually(lambda: len(h.sent(user)) == 2, 120, "the reply to m2")
        assert h.sent(user) == ["m1", "m2"]
        (live,) = [s for s in await router.sessions() if s["session_key"] == key]
        assert live["session_id"] == f"{key}#2"
        assert await epochs(repo, key) == [(f"{key}#1", "archived"), (f"{key}#2", "active")]
        # the message that waited for the archive is stored on the new epoch only
        assert [await user_texts(repo, f"{key}#{n}") for n in (1, 2)] == [["echo m1"], ["echo m2"]]

        # live now: the shard archives it through its actor (the same call, no admin fallback)
        assert await router.archive_stored(key) == ControlReply(
            kind="archive", session_key=key, result=f"{key}#3"
        )
        # neither live nor stored, or malformed: nothing is written
        with pytest.raises(UnknownSessionError) as unknown:
            await router.archive_stored(key_of("71199"))
        assert str(unknown.value) == f"no live session {key_of('71199')!r} and no active stored epoch"
        with pytest.raises(SessionKeyError) as malformed:
            parse_session_key("no-such-key")
        with pytest.raises(MalformedKeyError) as bad_key:
            await router.archive_stored("no-such-key")
        assert str(bad_key.value) == str(malformed.value)
        assert await epochs(repo, key_of("71199")) == []

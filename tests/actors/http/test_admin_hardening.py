"""The admin API under attack (docs/decisions.md#security-input-limits): steer / follow-up text that
cannot be stored is a 400 naming the field, text over ``server.max_text_chars`` a 413, a deeply
nested body a 400 without the exception text; a passivated (stored) session is shown from SQL and
archived in SQL, an unknown key stays 404.

Real HTTP over loopback (the admin routes in a uvicorn thread), a real SQLite file written by the
real ``ContextRepository``. The runtime is a stand-in with ``SessionRuntime``'s control methods and
errors (nothing is live unless a test says so); the router itself is tested on Ray elsewhere."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from actors.http import admin as admin_module
from actors.http.admin import admin_routes
from actors.placement.router_control import archive_active_epoch
from actors.placement.runtime import SessionInfo, UnknownSessionError
from runtime.keys import SessionKeyError, parse_session_key
from runtime.llm.types import UserMessage
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.session.control import ControlReply, ControlRequest
from tests.actors.edge_support import serve_in_thread

TOKEN_ENV = "ADMIN_HARDEN_TOKEN"
TOKEN = "admin-harden-token"
MAX_TEXT = 50
KEY = "onebot11:10001:private:7400"
LIVE = "onebot11:10001:private:7401"
DEEP = b'{"a":' * 100_000 + b"1" + b"}" * 100_000


class StandInRuntime:
    """``SessionRuntime``'s admin surface: ``LIVE`` is the only live session."""

    def __init__(self, db_url: str) -> None:
        self.config = SimpleNamespace(
            database=SimpleNamespace(url=db_url), server=SimpleNamespace(max_text_chars=MAX_TEXT)
        )
        self.calls: list[tuple[str, ...]] = []
        self._repo: ContextRepository | None = None

    def _live(self, key: str) -> None:
        if key != LIVE:
            raise UnknownSessionError(f"no live session {key!r}")

    async def control(self, request: ControlRequest) -> ControlReply:
        """Steer ``"started"``, follow-up ``"queued"``, archive ``{key}#9`` (``LIVE`` only)."""
        key, kind = request.session_key, request.kind
        self._live(key)
        if kind.master_only:
            self.calls.append((kind, key, request.text, request.sender_id))
        else:
            self.calls.append((kind, key))
        result = {"steer": "started", "follow_up": "queued", "archive": f"{key}#9"}[kind]
        return ControlReply(kind=kind, session_key=key, result=result)

    async def archive_stored(self, key: str) -> str:
        """``SessionRuntime.archive_stored`` without router shards: the stored active epoch of a
        session that is not live, archived in SQL; UnknownSessionError when it has none."""
        if self._repo is None:
            db = Database(self.config.database.url)
            db.create_tables()
            self._repo = ContextRepository(db)
        new = await archive_active_epoch(self._repo, key)
        if new is None:
            raise UnknownSessionError(f"no live session {key!r}")
        return new

    async def session(self, key: str) -> SessionInfo | None:
        if key != LIVE:
            return None
        return SessionInfo(session_key=LIVE, session_id=f"{LIVE}#1", shard=0, pending=0, turns=3, idle_s=1.5)


@dataclass
class Served:
    url: str
    runtime: StandInRuntime
    repo: ContextRepository

    def call(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        content = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        return httpx.request(method, self.url + path, content=content, headers=headers, timeout=30)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    db_url = f"sqlite:///{tmp_path / 'admin.db'}"
    db = Database(db_url)
    db.create_tables()
    runtime = StandInRuntime(db_url)
    with serve_in_thread(Starlette(routes=admin_routes(runtime, TOKEN_ENV))) as url:
        yield Served(url, runtime, ContextRepository(db))


def stored_session(repo: ContextRepository, key: str, n: int) -> str:
    """Epoch 1 of ``key`` with ``n`` user messages, as a passivated session leaves it."""

    async def work() -> str:
        sid = await repo.get_or_create_active(key, model="faux/echo")
        await repo.append_messages(sid, [UserMessage(content=f"m{i}", timestamp=i) for i in range(n)])
        return sid

    return asyncio.run(work())


# --------------------------------------------------------------------------- item 2: bad input


@pytest.mark.parametrize("kind", ["steer", "follow_up"])
def test_text_that_cannot_be_stored_is_a_400(served: Served, kind: str) -> None:
    raw = json.dumps({"text": "aXb", "sender_id": "20002"}).replace("X", "\\ud800").encode()
    resp = served.call("POST", f"/admin/sessions/{LIVE}/{kind}", raw=raw)
    assert (resp.status_code, resp.json()) == (
        400,
        {"error": "`text` is not valid Unicode text (it contains a lone surrogate)"},
    )
    raw = json.dumps({"text": "ok", "sender_id": "2X"}).replace("X", "\\udfff").encode()
    resp = served.call("POST", f"/admin/sessions/{LIVE}/{kind}", raw=raw)
    assert (resp.status_code, resp.json()) == (
        400,
        {"error": "`sender_id` is not valid Unicode text (it contains a lone surrogate)"},
    )
    assert served.runtime.calls == []


@pytest.mark.parametrize("kind", ["steer", "follow_up"])
def test_text_over_max_text_chars_is_a_413(served: Served, kind: str) -> None:
    long = served.call("POST", f"/admin/sessions/{LIVE}/{kind}", {"text": "A" * 51, "sender_id": "20002"})
    assert (long.status_code, long.json()) == (
        413,
        {"error": f"`text` is too long: 51 characters, at most {MAX_TEXT} (server.max_text_chars)"},
    )
    fits = served.call("POST", f"/admin/sessions/{LIVE}/{kind}", {"text": "A" * 50, "sender_id": 20002})
    outcome = "started" if kind == "steer" else "queued"
    assert (fits.status_code, fits.json()) == (
        200,
        {"status": "ok", "kind": kind, "session_key": LIVE, "result": outcome},
    )
    assert served.runtime.calls == [(kind, LIVE, "A" * 50, "20002")]


def test_deeply_nested_body_is_a_400_without_the_exception(served: Served) -> None:
    for kind in ("steer", "follow_up"):
        resp = served.call("POST", f"/admin/sessions/{LIVE}/{kind}", raw=DEEP)
        assert (resp.status_code, resp.json()) == (400, {"error": "JSON body is nested too deeply"})
    deep_list = b"[" * 200_000 + b"]" * 200_000
    resp = served.call("POST", f"/admin/sessions/{LIVE}/steer", raw=deep_list)
    assert (resp.status_code, resp.json()) == (400, {"error": "JSON body is nested too deeply"})
    assert served.runtime.calls == []


# --------------------------------------------------------------------------- item 3: stored sessions


def test_get_shows_a_stored_session_from_sql(served: Served) -> None:
    sid = stored_session(served.repo, KEY, 8)
    (row,) = asyncio.run(served.repo.list_sessions(KEY))
    resp = served.call("GET", f"/admin/sessions/{KEY}")
    assert (resp.status_code, resp.json()) == (
        200,
        {
            "session_key": KEY,
            "live": False,
            "session_id": sid,
            "status": "active",
            "model": "faux/echo",
            "created_at": row.created_at,
            "updated_at": row.updated_at,
            "messages": 8,
            "epochs": 1,
        },
    )
    live = served.call("GET", f"/admin/sessions/{LIVE}")
    assert live.json() == {
        "session_key": LIVE,
        "session_id": f"{LIVE}#1",
        "shard": 0,
        "pending": 0,
        "turns": 3,
        "idle_s": 1.5,
        "host": -1,
        "actor_id": None,
        "epoch": 0,
        "actor": None,
    }


def test_archive_of_a_stored_session_archives_it_in_sql(served: Served) -> None:
    stored_session(served.repo, KEY, 8)
    resp = served.call("POST", f"/admin/sessions/{KEY}/archive")
    assert (resp.status_code, resp.json()) == (
        200,
        {"status": "ok", "kind": "archive", "session_key": KEY, "result": f"{KEY}#2"},
    )
    epochs = asyncio.run(served.repo.list_sessions(KEY))
    assert [(e.session_id, e.status) for e in epochs] == [(f"{KEY}#1", "archived"), (f"{KEY}#2", "active")]
    shown = served.call("GET", f"/admin/sessions/{KEY}").json()
    assert (shown["session_id"], shown["messages"], shown["epochs"]) == (f"{KEY}#2", 0, 2)
    # a live session is still archived by the runtime (its actor owns the epoch)
    live = served.call("POST", f"/admin/sessions/{LIVE}/archive")
    assert live.json()["result"] == f"{LIVE}#9"
    assert served.runtime.calls == [("archive", LIVE)]


def test_unknown_keys_stay_404(served: Served) -> None:
    key = "onebot11:10001:private:unknown"
    stored_session(served.repo, KEY, 1)
    got = served.call("GET", f"/admin/sessions/{key}")
    assert (got.status_code, got.json()) == (404, {"error": f"no live or stored session {key!r}"})
    archived = served.call("POST", f"/admin/sessions/{key}/archive")
    assert (archived.status_code, archived.json()) == (404, {"error": f"no live session {key!r}"})
    assert [e.session_id for e in asyncio.run(served.repo.list_sessions(KEY))] == [f"{KEY}#1"]


@pytest.mark.parametrize("key", ["no-such-key", "onebot11:10001:private:x y"])
def test_malformed_keys_answer_400_on_every_session_route(served: Served, key: str) -> None:
    """A key that is not platform:bot_id:scope:scene_id is the caller's mistake (400, the key
    parser's message), not an unknown session (404); the runtime is never asked."""
    stored_session(served.repo, KEY, 1)
    with pytest.raises(SessionKeyError) as parsed:
        parse_session_key(key)
    calls = [
        ("GET", f"/admin/sessions/{key}", None),
        ("POST", f"/admin/sessions/{key}/archive", None),
        ("POST", f"/admin/sessions/{key}/abort", None),
        ("POST", f"/admin/sessions/{key}/steer", {"text": "hi", "sender_id": "20002"}),
        ("POST", f"/admin/sessions/{key}/follow_up", {"text": "hi", "sender_id": "20002"}),
    ]
    for method, path, body in calls:
        got = served.call(method, path, body)
        assert (got.status_code, got.json()) == (400, {"error": str(parsed.value)}), path
    assert served.runtime.calls == []
    assert [e.session_id for e in asyncio.run(served.repo.list_sessions(KEY))] == [f"{KEY}#1"]


# --------------------------------------------------------------------------- SQL off the event loop


class OpenCounter:
    """Wraps ``actors.http.admin._open_repository``: records, per call, whether it ran on an event loop."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.on_loop: list[bool] = []

    def __call__(self, url: str) -> ContextRepository:
        try:
            asyncio.get_running_loop()
            self.on_loop.append(True)
        except RuntimeError:
            self.on_loop.append(False)
        return self.real(url)


def test_the_stored_view_is_opened_once_and_off_the_event_loop(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first stored-session request builds the repository (engine + create_tables) in a worker
    thread, not on the ingress's event loop; later requests reuse it."""
    counter = OpenCounter(admin_module._open_repository)
    monkeypatch.setattr(admin_module, "_open_repository", counter)
    stored_session(served.repo, KEY, 2)
    answers = [served.call("GET", f"/admin/sessions/{KEY}") for _ in range(2)]
    assert [(r.status_code, r.json()["messages"]) for r in answers] == [(200, 2), (200, 2)]
    assert counter.on_loop == [False]


async def test_racing_first_uses_share_one_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = OpenCounter(admin_module._open_repository)
    monkeypatch.setattr(admin_module, "_open_repository", counter)
    stored = admin_module._StoredSessions(StandInRuntime(f"sqlite:///{tmp_path / 'race.db'}"), None)
    first, second = await asyncio.gather(stored.repo(), stored.repo())
    assert first is not None and first is second
    assert counter.on_loop == [False]
    first.db.dispose()

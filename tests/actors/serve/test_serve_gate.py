"""The HTTP port before the session runtime is up (actors/serve/gate.py,
docs/decisions.md#ops-early-accept): the runtime stand-in refuses every runtime call with
``RuntimeNotReady`` until a runtime is attached, then forwards; the startup gate answers
``/healthz``, the admin API and the console's runtime routes with 503 while starting, over real
HTTP on loopback (uvicorn), and lets everything else through.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from ray.exceptions import RayActorError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from actors.serve.gate import RETRY_AFTER_S, RuntimeGate, RuntimeNotReady, StartupGate, needs_runtime


class FakeRuntime:
    """A started runtime: what the stand-in forwards to."""

    def __init__(self) -> None:
        self.prefix = "sr-test"
        self.config = "the runtime's config"
        self.delivery: Any = None
        self.inbox_db: Any = None
        self.submitted: list[str] = []

    async def submit(self, inbound: str, attempt: int = 0) -> str:
        self.submitted.append(f"{inbound}#{attempt}" if attempt else inbound)
        return "accepted"

    async def status(self) -> dict[str, int]:
        return {"live_sessions": 3}

    async def sessions(self) -> list[str]:
        return ["k"]

    def attach_inbox(self, db: Any) -> None:
        self.inbox_db = db


async def test_the_stand_in_refuses_until_attached_then_forwards() -> None:
    gate = RuntimeGate("the config", prefix="sr-test")
    assert (gate.ready, gate.phase, gate.prefix, gate.config, gate.delivery) == (
        False, "starting Ray", "sr-test", "the config", None,
    )  # fmt: skip
    with pytest.raises(RuntimeNotReady) as refused:
        await gate.submit("m1")
    assert isinstance(refused.value, RayActorError)  # "a router shard is unavailable" to the ingress
    assert str(refused.value) == (
        "the session runtime is not up yet: sessionray is starting (Ray and the session hosts)"
    )
    with pytest.raises(RuntimeNotReady):
        await gate.status()
    with pytest.raises(RuntimeNotReady):
        await gate.sessions()  # any SessionRuntime coroutine method
    with pytest.raises(RuntimeNotReady):
        await gate.in_flight()
    with pytest.raises(RuntimeNotReady):
        gate.router_name(0)  # and a plain one
    with pytest.raises(AttributeError):
        gate.no_such_method  # noqa: B018 - not a SessionRuntime attribute: getattr(..., None) is None
    assert getattr(gate, "no_such_method", None) is None
    gate.attach_inbox("the ingress db")  # handed over before the runtime is up
    gate.delivery = "a pool looked up meanwhile"

    runtime = FakeRuntime()
    gate.attach(runtime)

    assert (gate.ready, gate.phase, gate.config) == (True, "ready", "the runtime's config")
    assert (runtime.inbox_db, runtime.delivery) == ("the ingress db", "a pool looked up meanwhile")
    assert await gate.submit("m2") == "accepted" and runtime.submitted == ["m2"]
    # a stored message sent again by the ingress (docs/decisions.md#inbox-durable) keeps its attempt
    assert await gate.submit("m1", attempt=1) == "accepted" and runtime.submitted == ["m2", "m1#1"]
    assert await gate.status() == {"live_sessions": 3}
    assert await gate.sessions() == ["k"]
    gate.delivery = "another pool"
    assert runtime.delivery == "another pool"


def test_routes_that_need_the_runtime() -> None:
    assert [
        needs_runtime(p)
        for p in (
            "/admin", "/admin/status", "/console", "/console/api/sessions", "/console/api/steer",
            "/console/api/follow_up", "/webhooks/onebot11/1", "/console/api/history",
            "/console/api/stream", "/console/api/deliver", "/console/static/app.js", "/metrics",
            "/administrator",
        )
    ] == [True] * 6 + [False] * 7  # fmt: skip


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, RuntimeGate]]:
    """The gate in front of a tiny app (every route answers 200 ``{"route": path}``) on a real
    loopback port."""

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"route": request.url.path})

    paths = ["/healthz", "/admin/status", "/console", "/console/api/steer", "/console/api/history",
             "/webhooks/onebot11/1", "/metrics"]  # fmt: skip
    app = Starlette(routes=[Route(p, echo, methods=["GET", "POST"]) for p in paths])
    gate = RuntimeGate(None)
    server = uvicorn.Server(
        uvicorn.Config(StartupGate(app, gate), host="127.0.0.1", port=0, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", gate
    server.should_exit = True
    await task


async def test_while_starting_the_gate_answers_503_then_lets_everything_through(
    served: tuple[str, RuntimeGate],
) -> None:
    base, gate = served
    async with httpx.AsyncClient(base_url=base) as client:
        health = await client.get("/healthz")
        admin = await client.get("/admin/status")
        page = await client.get("/console")
        steer = await client.post("/console/api/steer", json={})
        passing = [await client.post("/webhooks/onebot11/1"), await client.get("/console/api/history"),
                   await client.get("/metrics")]  # fmt: skip
        gate.phase = "starting the session runtime"
        health2 = await client.get("/healthz")
        gate.attach(FakeRuntime())
        after = [await client.get(p) for p in ("/healthz", "/admin/status", "/console")]

    assert (health.status_code, health.json()) == (503, {"status": "starting", "phase": "starting Ray"})
    assert health.headers["retry-after"] == str(RETRY_AFTER_S)
    message = "sessionray is starting (starting Ray): try again in a few seconds"
    assert (admin.status_code, admin.json()) == (503, {"error": message, "status": "starting"})
    assert (steer.status_code, steer.json()) == (503, {"error": message, "status": "starting"})
    assert (page.status_code, page.text) == (
        503, f"sessionray is starting (starting Ray); this page reloads in {RETRY_AFTER_S} s\n",
    )  # fmt: skip
    assert (page.headers["refresh"], page.headers["content-type"]) == (
        str(RETRY_AFTER_S),
        "text/plain; charset=utf-8",
    )
    assert [(r.status_code, r.json()) for r in passing] == [
        (200, {"route": "/webhooks/onebot11/1"}),
        (200, {"route": "/console/api/history"}),
        (200, {"route": "/metrics"}),
    ]
    assert health2.json() == {"status": "starting", "phase": "starting the session runtime"}
    assert [(r.status_code, r.json()) for r in after] == [
        (200, {"route": "/healthz"}), (200, {"route": "/admin/status"}), (200, {"route": "/console"}),
    ]  # fmt: skip

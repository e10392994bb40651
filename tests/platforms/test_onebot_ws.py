"""OneBot v11 over WebSocket end to end on a real local Ray, real sockets on loopback:

* a OneBot implementation stand-in dials the reverse WS, pushes recorded events and answers the
  API calls by ``echo`` — the bot's reply arrives as an API call on the same socket, meta events
  show in ``/healthz`` and the connected gauge, a redelivered event is not answered twice;
* the handshake refuses a bad or missing token, an unknown ``X-Self-ID`` and a wrong role;
* ``/event`` + ``/api`` sockets (two roles) work like one ``Universal`` socket;
* a forward-WS stand-in server drops the connection mid-run: sessionray redials, the reply that
  found no socket is sent on the new one, the implementation's replay of an event is deduplicated
  — every inbound message is answered exactly once.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from prometheus_client import REGISTRY

from tests.actors.session_support import eventually
from tests.platforms.e2e_support import free_port
from tests.platforms.ws_support import (
    FORWARD_BOT,
    REVERSE_BOT,
    TOKEN,
    USER,
    WsStack,
    event,
    meta,
    ok_answer,
    reply_text,
    ws_stack,
)

pytestmark = pytest.mark.ray


class ForwardStandIn:
    """A OneBot implementation's forward-WS server in its own thread and event loop.

    Connection 1: pushes ``alpha`` and answers its reply, pushes ``beta`` and drops the
    connection at once. Connection 2 (sessionray's redial): replays ``beta``, pushes ``gamma``,
    answers every call until the reply to ``gamma`` came, then sets :attr:`done`.
    """

    def __init__(self, fixtures_dir: Path) -> None:
        self.fixtures_dir = fixtures_dir
        self.port = free_port()
        self.calls: list[tuple[int, dict[str, Any]]] = []
        """(connection number, API call frame), in arrival order."""
        self.auth: list[str | None] = []
        self.done = threading.Event()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def __enter__(self) -> ForwardStandIn:
        self._thread.start()
        assert self._ready.wait(10), "forward stand-in did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with websockets.serve(self._handler, "127.0.0.1", self.port):
            self._ready.set()
            await self._stop.wait()

    def _event(self, message_id: int, text: str) -> str:
        return event(self.fixtures_dir, FORWARD_BOT, message_id, text)

    async def _answer_next(self, conn: Any, n: int) -> dict[str, Any]:
        call = json.loads(await conn.recv())
        self.calls.append((n, call))
        await conn.send(ok_answer(self.fixtures_dir, call["echo"], 7000 + len(self.calls)))
        return dict(call)

    async def _handler(self, conn: Any) -> None:
        self.auth.append(conn.request.headers.get("Authorization"))
        n = len(self.auth)
        if n == 1:
            await conn.send(meta(self.fixtures_dir, FORWARD_BOT, "lifecycle"))
            await conn.send(self._event(91001, "alpha"))
            await self._answer_next(conn, n)
            await conn.send(self._event(91002, "beta"))
            await conn.close()  # dropped mid-run: the reply to beta finds no socket
            return
        await conn.send(self._event(91002, "beta"))  # the implementation replays it
        await conn.send(self._event(91003, "gamma"))
        while "re: gamma" not in [reply_text(c) for _, c in self.calls]:
            await self._answer_next(conn, n)
        self.done.set()
        await conn.wait_closed()


@pytest.fixture(scope="module")
def forward(fixtures_dir: Path) -> Iterator[ForwardStandIn]:
    with ForwardStandIn(fixtures_dir) as server:
        yield server


@pytest.fixture(scope="module")
def stack(
    ray_session: None, tmp_path_factory: pytest.TempPathFactory, forward: ForwardStandIn
) -> Iterator[WsStack]:
    with ws_stack(tmp_path_factory.mktemp("onebot-ws"), forward.url) as s:
        yield s


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def connected_gauge(bot: str) -> float | None:
    return REGISTRY.get_sample_value("sessionray_onebot_ws_connected", {"bot": bot})


async def healthz(stack: WsStack) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.get(stack.base_url + "/healthz")
    assert resp.status_code == 200
    return dict(resp.json())


async def next_call(conn: Any) -> dict[str, Any]:
    """The next frame on the socket, which must be an API call."""
    frame = json.loads(await asyncio.wait_for(conn.recv(), 60))
    assert set(frame) == {"action", "params", "echo"}, frame
    return dict(frame)


async def test_reverse_universal_event_reply_health_and_no_second_answer(
    stack: WsStack, fixtures_dir: Path
) -> None:
    headers = {**auth(), "X-Self-ID": REVERSE_BOT, "X-Client-Role": "Universal"}
    async with websockets.connect(stack.ws_url, additional_headers=headers) as conn:
        await conn.send(meta(fixtures_dir, REVERSE_BOT, "lifecycle"))
        await conn.send(meta(fixtures_dir, REVERSE_BOT, "heartbeat"))
        await conn.send(event(fixtures_dir, REVERSE_BOT, 81001, "33"))
        call = await next_call(conn)
        assert call["action"] == "send_private_msg"
        assert call["params"] == {"user_id": USER, "message": [{"type": "text", "data": {"text": "re: 33"}}]}
        await conn.send(ok_answer(fixtures_dir, call["echo"], 1936658337))
        rows = await eventually(
            lambda: _rows(stack, REVERSE_BOT, str(USER), 2), 30, "outbound transcript after the answer"
        )
        assert rows == [("inbound", "33"), ("outbound", "re: 33")]
        health = (await healthz(stack))["onebot_ws"][REVERSE_BOT]
        assert health["connected"] is True and health["roles"] == ["Universal"]
        assert health["transport"] == "ws-reverse"
        assert (health["lifecycle"], health["heartbeat_interval_ms"], health["online"]) == (
            "connect",
            60000,
            True,
        )
        assert connected_gauge(REVERSE_BOT) == 1.0
        # The implementation redelivers the event, then a new one: only the new one is answered
        # (a second answer to 81001 would come first: one chat's turns run in order).
        await conn.send(event(fixtures_dir, REVERSE_BOT, 81001, "33"))
        await conn.send(event(fixtures_dir, REVERSE_BOT, 81002, "second"))
        call = await next_call(conn)
        assert reply_text(call) == "re: second"
        await conn.send(ok_answer(fixtures_dir, call["echo"], 1936658338))
    await eventually(lambda: connected_gauge(REVERSE_BOT) == 0.0, 30, "gauge back to 0 after close")
    health = (await healthz(stack))["onebot_ws"][REVERSE_BOT]
    assert health["connected"] is False and health["roles"] == []
    rows = await eventually(lambda: _rows(stack, REVERSE_BOT, str(USER), 4), 30, "transcript")
    # (rows sort by time: inbound rows carry the event's own time, outbound rows the send time)
    assert sorted(rows) == [
        ("inbound", "33"),
        ("inbound", "second"),
        ("outbound", "re: 33"),
        ("outbound", "re: second"),
    ]


async def _rows(stack: WsStack, bot: str, scene: str, n: int) -> list[tuple[str, str]] | None:
    rows = await stack.scene(bot, scene)
    return rows if len(rows) >= n else None


@pytest.mark.parametrize(
    ("path", "headers", "why"),
    [
        ("/onebot/v11/ws", {"Authorization": "Bearer wrong", "X-Self-ID": REVERSE_BOT}, "bad token"),
        ("/onebot/v11/ws", {"X-Self-ID": REVERSE_BOT}, "no token"),
        ("/onebot/v11/ws?access_token=wrong", {"X-Self-ID": REVERSE_BOT}, "bad query token"),
        ("/onebot/v11/ws", {"Authorization": f"Bearer {TOKEN}", "X-Self-ID": "1000000999"}, "unknown bot"),
        ("/onebot/v11/ws", {"Authorization": f"Bearer {TOKEN}", "X-Self-ID": FORWARD_BOT}, "forward bot"),
        ("/onebot/v11/ws", {"Authorization": f"Bearer {TOKEN}"}, "no X-Self-ID"),
        (
            "/onebot/v11/ws/event",
            {"Authorization": f"Bearer {TOKEN}", "X-Self-ID": REVERSE_BOT, "X-Client-Role": "API"},
            "role does not fit the path",
        ),
    ],
)
async def test_reverse_handshake_refused(
    stack: WsStack, path: str, headers: dict[str, str], why: str
) -> None:
    before = REGISTRY.get_sample_value(
        "sessionray_inbound_messages_total", {"platform": "onebot11", "outcome": "bad_signature"}
    )
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(f"ws://127.0.0.1:{stack.port}{path}", additional_headers=headers):
            pass
    assert refused.value.response.status_code == 403, why
    after = REGISTRY.get_sample_value(
        "sessionray_inbound_messages_total", {"platform": "onebot11", "outcome": "bad_signature"}
    )
    assert (after or 0) - (before or 0) == 1


async def test_reverse_event_and_api_roles_on_two_sockets(stack: WsStack, fixtures_dir: Path) -> None:
    user = 200000003
    base = f"ws://127.0.0.1:{stack.port}/onebot/v11/ws"
    api_headers = {"X-Self-ID": REVERSE_BOT, "X-Client-Role": "API"}
    event_headers = {**auth(), "X-Self-ID": REVERSE_BOT, "X-Client-Role": "Event"}
    async with (
        websockets.connect(f"{base}/api?access_token={TOKEN}", additional_headers=api_headers) as api,
        websockets.connect(f"{base}/event", additional_headers=event_headers) as events,
    ):
        health = await eventually(lambda: _roles(stack, ["API", "Event"]), 30, "both sockets registered")
        assert health["connected"] is True
        await events.send(event(fixtures_dir, REVERSE_BOT, 82001, "split", user=user))
        call = await next_call(api)
        assert call["params"]["user_id"] == user and reply_text(call) == "re: split"
        await api.send(ok_answer(fixtures_dir, call["echo"], 555))
        rows = await eventually(lambda: _rows(stack, REVERSE_BOT, str(user), 2), 30, "outbound transcript")
        assert rows == [("inbound", "split"), ("outbound", "re: split")]


async def _roles(stack: WsStack, roles: list[str]) -> dict[str, Any] | None:
    health = (await healthz(stack))["onebot_ws"][REVERSE_BOT]
    return health if health["roles"] == roles else None


async def test_forward_ws_dropped_mid_run_nothing_lost_nothing_twice(
    stack: WsStack, forward: ForwardStandIn
) -> None:
    assert await asyncio.to_thread(forward.done.wait, 120), f"forward script did not finish: {forward.calls}"
    texts = [(n, reply_text(call)) for n, call in forward.calls]
    # alpha answered on the first connection; beta's reply waited for the redial; the replayed
    # beta was not answered again; gamma answered once.
    assert texts == [(1, "re: alpha"), (2, "re: beta"), (2, "re: gamma")]
    assert forward.auth == [f"Bearer {TOKEN}", f"Bearer {TOKEN}"]
    rows = await eventually(lambda: _rows(stack, FORWARD_BOT, str(USER), 6), 30, "forward transcript")
    assert sorted(rows) == [
        ("inbound", "alpha"),
        ("inbound", "beta"),
        ("inbound", "gamma"),
        ("outbound", "re: alpha"),
        ("outbound", "re: beta"),
        ("outbound", "re: gamma"),
    ]
    health = (await healthz(stack))["onebot_ws"][FORWARD_BOT]
    assert health["transport"] == "ws-forward"
    assert (health["connected"], health["reconnects"], health["lifecycle"]) == (True, 1, "connect")
    assert connected_gauge(FORWARD_BOT) == 1.0


@pytest.mark.parametrize(("bot", "transport"), [(REVERSE_BOT, "ws-reverse"), (FORWARD_BOT, "ws-forward")])
async def test_a_websocket_bot_has_no_webhook_route(
    stack: WsStack, fixtures_dir: Path, bot: str, transport: str
) -> None:
    # access_token_env set, no secret_env: an unsigned POST of a group message that mentions the
    # bot used to be stored and answered over the socket (docs/decisions.md#security-socket-bots-no-webhook)
    ev = json.loads((fixtures_dir / "onebot11" / "event_group_message_array.json").read_bytes())
    ev |= {"self_id": int(bot), "message_id": 84001 if transport == "ws-reverse" else 84002}
    ev["message"] = [{"type": "at", "data": {"qq": bot}}, *ev["message"]]
    async with httpx.AsyncClient(timeout=10) as client:
        resp = await client.post(f"{stack.base_url}/webhooks/onebot11/{bot}", json=ev)
    error = f"bot onebot11/{bot} takes its events over its WebSocket ({transport}): no webhook"
    assert (resp.status_code, resp.json()) == (404, {"error": error})
    assert await stack.scene(bot, str(ev["group_id"])) == []  # nothing stored

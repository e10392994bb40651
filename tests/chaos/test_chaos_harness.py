"""The chaos harness's own parts, without a serve: the platform API's outages and reply ledger
(real HTTP over loopback), and the figures computed from load records."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.chaos.figures import figures, restart_recovery, table
from tests.chaos.load import Sent, backoff_s, event_body, group_template
from tests.chaos.platform import FaultyPlatform


def _reply(group: int, quoted: int | None, text: str) -> bytes:
    segments = [{"type": "reply", "data": {"id": str(quoted)}}] if quoted is not None else []
    segments.append({"type": "text", "data": {"text": text}})
    return json.dumps({"group_id": group, "message": segments}).encode()


def _post(client: httpx.Client, api: FaultyPlatform, body: bytes) -> int | str:
    try:
        return client.post(
            f"{api.base_url}/send_group_msg", content=body, headers={"Content-Type": "application/json"}
        ).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def test_replies_are_matched_by_the_quoted_id_else_by_the_text(fixtures_dir: Path) -> None:
    with FaultyPlatform(fixtures_dir) as api, httpx.Client() as client:
        assert _post(client, api, _reply(5, 41, "You said: chaos 41")) == 200
        assert _post(client, api, _reply(5, 41, "again")) == 200
        assert _post(client, api, _reply(5, None, "You said: chaos 42")) == 200
        assert _post(client, api, _reply(5, None, "no id here")) == 200
        replies = api.replies()
    assert sorted(replies) == [41, 42]
    assert (len(replies[41]), len(replies[42]), api.stray) == (2, 1, 1)


def test_a_send_cut_mid_body_is_neither_answered_nor_delivered(fixtures_dir: Path) -> None:
    """A sender killed between its headers and its body (kill -9 of a delivery actor) leaves the
    platform half a request: it is not processed, so it is no delivered reply and no stray one."""
    body = _reply(5, 41, "You said: chaos 41")
    with FaultyPlatform(fixtures_dir) as api:
        host, port = api.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            head = f"POST /send_group_msg HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
            sock.sendall(head.encode() + body[:10])
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(1024) == b""  # cut, never answered
        with httpx.Client() as client:
            assert _post(client, api, body) == 200  # the same server still answers a whole request
        assert (sorted(api.replies()), api.stray) == ([41], 0)


@pytest.mark.parametrize(("kind", "status"), [("500", 500), ("429", 429)])
def test_an_http_outage_fails_every_send_and_delivers_nothing(
    fixtures_dir: Path, kind: str, status: int
) -> None:
    with FaultyPlatform(fixtures_dir) as api, httpx.Client() as client:
        api.outage(kind, 30.0)
        resp = client.post(
            f"{api.base_url}/send_group_msg",
            content=_reply(5, 7, "x"),
            headers={"Content-Type": "application/json"},
        )
        assert resp.status_code == status
        assert resp.headers.get("retry-after") == ("1" if kind == "429" else None)
        assert (api.replies(), api.failed_answers) == ({}, 1)


def test_a_refused_outage_stops_listening_then_serves_on_the_same_port(fixtures_dir: Path) -> None:
    with FaultyPlatform(fixtures_dir) as api, httpx.Client() as client:
        base = api.base_url
        assert _post(client, api, _reply(5, 1, "x")) == 200  # a keep-alive connection is open
        api.outage("refused", 0.5)
        assert _post(client, api, _reply(5, 2, "x")) == "ConnectError"
        deadline = time.monotonic() + 30
        while (outcome := _post(client, api, _reply(5, 3, "x"))) != 200:
            assert outcome == "ConnectError" and time.monotonic() < deadline
        assert api.base_url == base
        assert sorted(api.replies()) == [1, 3]


def test_figures_count_each_outcome() -> None:
    def sent(mid: int, due: float, *outcomes: int | str) -> Sent:
        s = Sent(mid=mid, chat=0, due=due, attempts=[(due + i, o) for i, o in enumerate(outcomes)])
        s.accepted_at = due + 0.5 if 200 in outcomes else None
        return s

    records = [
        sent(1, 0.0, 200),  # answered once
        sent(2, 1.0, 503, 200),  # redelivered, answered twice
        sent(3, 2.0, 200),  # lost
        sent(4, 3.0, "ConnectError"),  # never accepted, still answered
        sent(5, 4.0, 503),  # never accepted
    ]
    replies = {1: [0.2], 2: [2.2, 2.4], 4: [9.0]}
    out = figures(records, replies, fault_end=6.0, stray=0)
    assert {
        k: out[k] for k in ("sent", "accepted", "answered_once", "duplicated", "lost", "never_accepted")
    } == {
        "sent": 5,
        "accepted": 3,
        "answered_once": 2,
        "duplicated": 1,
        "lost": 1,
        "never_accepted": 2,
    }
    assert out["answered_not_accepted"] == 1
    assert out["stall_s"] == 2.0  # no reply from 0.2 to 2.2
    assert out["drain_s"] == 3.0  # last reply 9.0, fault over at 6.0
    assert out["unavailable_s"] == 2.0  # 503 at 1.0 → a 200 at 2.0; refused at 3.0 → the 503 at 4.0
    assert out["answers"] == {"200": 3, "503": 2, "ConnectError": 1}
    assert out["redeliveries"] == 1
    assert "lost" in table({"x": out}).splitlines()[0]


def test_restart_recovery_is_the_first_window_back_at_the_pre_restart_p50() -> None:
    """Ten messages a second; 0.03 s before the restart (down at 10, ready at 13), 5 s until
    ready + 4, 0.04 s (within 1.5 x) from then on."""
    sent = [Sent(mid=i, chat=0, due=i / 10) for i in range(300)]

    def latency(due: float) -> float:
        return 0.03 if due < 10 else 5.0 if due < 17 else 0.04

    replies = {s.mid: [s.due + latency(s.due)] for s in sent if not 10 <= s.due < 13}
    out = restart_recovery(sent, replies, down_at=10.0, ready_at=13.0)
    # the window from ready + 3.75 s holds 2 slow and 8 fast messages: its p50 is back
    timeline = out.pop("p50_by_s_after_ready")
    assert out == {"pre_p50_s": 0.03, "recovery_s": 3.75, "p50_after_10s_s": 0.04}
    assert timeline[:6] == [5.0, 5.0, 5.0, 5.0, 0.04, 0.04] and len(timeline) == 25
    never = {s.mid: [s.due + (0.03 if s.due < 10 else 5.0)] for s in sent}  # slow for ever after
    assert restart_recovery(sent, never, down_at=10.0, ready_at=13.0)["recovery_s"] is None


def test_redelivery_backoff_and_event_body(fixtures_dir: Path) -> None:
    assert [backoff_s(n) for n in range(10)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0, 10.0, 10.0]
    event = json.loads(event_body(group_template(fixtures_dir), "10002", 300, 200, 99))
    assert (event["self_id"], event["group_id"], event["user_id"], event["message_id"]) == (
        10002,
        300,
        200,
        99,
    )
    assert event["message"] == [{"type": "text", "data": {"text": "chaos 99"}}]
    assert event["message_type"] == "group" and event["sender"]["user_id"] == 200

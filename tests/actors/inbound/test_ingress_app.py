"""The ingress on real local Ray, over real HTTP: webhook → runtime → delivery → platform API;
duplicates, signatures, malformed events, a full mailbox (queued, then answered by the inbox
recovery loop), health and metrics.

One runtime + ingress for the module (one session host ahead of need, mailbox 1, one delivery
actor); each test uses its own chat (OneBot user id) and message ids."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import REGISTRY

from tests.actors.edge_support import (
    BOT_ID,
    MASTER,
    TOKEN,
    TOKEN_ENV,
    IngressHarness,
    onebot_event,
    private_call,
    running_ingress,
    signed,
    transcript_rows,
)

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[3]

OK_MID = "1936658337"
"""``data.message_id`` of tests/fixtures/onebot11/api_response_ok_napcat.json."""


@pytest.fixture(scope="module")
def h(
    ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path
) -> Iterator[IngressHarness]:
    with running_ingress(tmp_path_factory.mktemp("ingress"), fixtures_dir, mailbox_size=1) as harness:
        mid = json.loads(harness.api.onebot_ok)["data"]["message_id"]
        assert str(mid) == OK_MID
        yield harness


def post(h: IngressHarness, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{h.url}/webhooks/onebot11/{BOT_ID}", content=body, headers=headers, timeout=30)


async def post_until_accepted(h: IngressHarness, body: bytes, timeout_s: float = 60) -> httpx.Response:
    """POST, and after a 503 retry as a platform does (bounded); returns the first non-503 answer."""
    deadline = time.monotonic() + timeout_s
    while (resp := post(h, body, signed(body))).status_code == 503:
        assert time.monotonic() < deadline, "still busy"
        await asyncio.sleep(min(0.2, float(resp.headers["Retry-After"])))
    return resp


def sent_to(h: IngressHarness, user: str) -> list[dict]:
    return [
        r.json
        for r in list(h.api.requests)
        if r.path == "/send_private_msg" and str(r.json["user_id"]) == user
    ]


async def wait_sent(h: IngressHarness, user: str, n: int, timeout_s: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while len(sent_to(h, user)) < n:
        assert time.monotonic() < deadline, f"{n} replies to {user} not delivered: {sent_to(h, user)}"
        await asyncio.sleep(0.02)
    return sent_to(h, user)


def inbound_count(outcome: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "sessionray_inbound_messages_total", {"platform": "onebot11", "outcome": outcome}
        )
        or 0.0
    )


async def test_full_chain_webhook_to_platform_api(h: IngressHarness) -> None:
    user, body = "200000002", onebot_event(h.api.fixtures_dir, "200000002", "33", 799899884)
    before = inbound_count("accepted")
    resp = post(h, body, signed(body))
    assert (resp.status_code, resp.json()) == (200, {"status": "accepted"})
    assert await wait_sent(h, user, 1) == [private_call(user, "re: 33")]
    deadline = time.monotonic() + 30  # the outbound row follows the platform's answer
    while len(rows := [r for r in transcript_rows(h.db_url) if r[2] == user]) < 2:
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.02)
    assert rows == [
        ("inbound", "799899884", user, user, "33"),
        ("outbound", OK_MID, user, BOT_ID, "re: 33"),
    ]
    assert inbound_count("accepted") == before + 1


async def test_duplicate_webhook_runs_one_turn(h: IngressHarness) -> None:
    user = "200000010"
    body = onebot_event(h.api.fixtures_dir, user, "once", 5001)
    first, second = post(h, body, signed(body)), post(h, body, signed(body))
    assert [first.json(), second.json()] == [{"status": "accepted"}, {"status": "duplicate"}]
    assert await wait_sent(h, user, 1) == [private_call(user, "re: once")]
    assert post(h, body, signed(body)).json() == {"status": "duplicate"}  # also after the turn
    # a later message proves the session moved on: its reply comes after exactly one "re: once"
    later = onebot_event(h.api.fixtures_dir, user, "later", 5002)
    assert (await post_until_accepted(h, later)).json() == {"status": "accepted"}
    assert await wait_sent(h, user, 2) == [private_call(user, "re: once"), private_call(user, "re: later")]
    # (outbound rows are keyed by the platform's message id, which the test server repeats)
    inbound_rows = [r for r in transcript_rows(h.db_url) if r[2] == user and r[0] == "inbound"]
    assert inbound_rows == [("inbound", "5001", user, user, "once"), ("inbound", "5002", user, user, "later")]


async def test_bad_signature_401_and_malformed_400_store_nothing(h: IngressHarness) -> None:
    user = "200000020"
    body = onebot_event(h.api.fixtures_dir, user, "forged", 6001)
    before = (inbound_count("bad_signature"), inbound_count("malformed"))
    unsigned = post(h, body, {"Content-Type": "application/json"})
    forged = post(h, body, signed(body, secret="not-the-secret"))
    malformed_body = b'{"post_type": "message", "self_id": '
    malformed = post(h, malformed_body, signed(malformed_body))
    assert [unsigned.status_code, forged.status_code, malformed.status_code] == [401, 401, 400]
    assert forged.json()["error"].startswith("bad signature")
    assert malformed.json()["error"].startswith("malformed event")
    assert (inbound_count("bad_signature"), inbound_count("malformed")) == (before[0] + 2, before[1] + 1)
    assert [r for r in transcript_rows(h.db_url) if r[2] == user] == []
    assert f"onebot11:{BOT_ID}:private:{user}" not in {s.session_key for s in await h.runtime.sessions()}
    unknown = httpx.post(f"{h.url}/webhooks/onebot11/424242", content=body, headers=signed(body))
    assert unknown.status_code == 404


def inbox_states(h: IngressHarness, user: str) -> list[str]:
    """States of the inbox rows of ``user``'s private chat, in inbox order."""
    from runtime.memory.db import Database
    from runtime.memory.inbox import InboxRow

    table = InboxRow.__table__  # type: ignore[attr-defined]
    db = Database(h.db_url, threads=1)
    try:
        with db.connection() as conn:
            key = f"onebot11:{BOT_ID}:private:{user}"
            rows = conn.execute(table.select().where(table.c.session_key == key).order_by(table.c.id)).all()
        return [r.state for r in rows]
    finally:
        db.dispose()


async def test_full_mailbox_is_queued_then_answered_once_in_order(h: IngressHarness) -> None:
    """A full mailbox no longer answers 503: the message is stored and ``queued``, later messages
    of the chat are queued behind it, and the recovery loop answers each once, in order
    (docs/decisions.md#inbox-durable)."""
    user = "200000030"
    texts = ["slow 3", "second", "third", "fourth", "fifth"]
    before = inbound_count("queued")
    bodies = [onebot_event(h.api.fixtures_dir, user, text, 7000 + i) for i, text in enumerate(texts)]
    # "slow 3" holds the session in a tool call; with mailbox_size=1 the session's host refuses the
    # next message: it is stored and left for the recovery loop, and so is every later one.
    answers = [post(h, body, signed(body)) for body in bodies]
    statuses = [(r.status_code, r.json()["status"]) for r in answers]
    taken = sum(1 for _, status in statuses if status == "accepted")
    assert 1 <= taken < len(texts), statuses
    assert statuses == [(200, "accepted")] * taken + [(200, "queued")] * (len(texts) - taken)
    assert inbound_count("queued") == before + len(texts) - taken
    assert post(h, bodies[-1], signed(bodies[-1])).json() == {"status": "duplicate"}  # stored once
    replies = await wait_sent(h, user, len(texts), timeout_s=120)
    deadline = time.monotonic() + 60  # every turn result came back: nothing is left to replay
    while inbox_states(h, user) != ["handled"] * len(texts):
        assert time.monotonic() < deadline, inbox_states(h, user)
        await asyncio.sleep(0.05)
    replies = sent_to(h, user)
    assert [r["message"][0]["data"]["text"] for r in replies] == [
        "tool: slept 3; then: []",
        *[f"re: {t}" for t in texts[1:]],
    ]
    recovery = await h.runtime.routers[0].inbox_status.remote()
    assert recovery["resubmitted"] >= len(texts) - taken and recovery["failed"] == 0


async def test_healthz_and_metrics(h: IngressHarness) -> None:
    assert httpx.get(f"{h.url}/healthz").json() == {"status": "ok"}
    resp = httpx.get(f"{h.url}/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    text = resp.text
    assert 'sessionray_http_requests_total{route="/healthz",status="200"}' in text
    assert 'sessionray_http_requests_total{route="/webhooks/{platform}/{bot_id}",status="200"}' in text
    assert 'sessionray_inbound_messages_total{outcome="accepted",platform="onebot11"}' in text
    status = await h.runtime.status()
    assert f"sessionray_live_sessions {float(status['live_sessions'])}" in text
    assert f"sessionray_hosts {float(status['hosts'])}" in text


# --------------------------------------------------------------------------- admin API


def admin(
    h: IngressHarness, method: str, path: str, token: str | None = TOKEN, **kw: object
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.request(method, f"{h.url}{path}", headers=headers, timeout=30, **kw)  # type: ignore[arg-type]


async def test_admin_api_requires_the_bearer_token(h: IngressHarness) -> None:
    key = f"onebot11:{BOT_ID}:private:200000040"
    for method, path in [
        ("GET", "/admin/sessions"),
        ("GET", "/admin/status"),
        ("GET", f"/admin/sessions/{key}"),
        ("POST", f"/admin/sessions/{key}/steer"),
        ("POST", f"/admin/sessions/{key}/follow_up"),
        ("POST", f"/admin/sessions/{key}/abort"),
        ("POST", f"/admin/sessions/{key}/archive"),
    ]:
        missing, wrong = admin(h, method, path, token=None), admin(h, method, path, token="wrong")
        assert (missing.status_code, missing.headers["www-authenticate"]) == (
            401,
            'Bearer realm="sessionray-admin"',
        )
        assert missing.json() == {"error": "missing bearer token (Authorization: Bearer <token>)"}
        assert (wrong.status_code, wrong.json()) == (401, {"error": "wrong bearer token"})


async def test_admin_api_lists_steers_and_refuses(h: IngressHarness) -> None:
    user = "200000050"
    key = f"onebot11:{BOT_ID}:private:{user}"
    body = onebot_event(h.api.fixtures_dir, user, "hi", 8001)
    assert (await post_until_accepted(h, body)).json() == {"status": "accepted"}
    await wait_sent(h, user, 1)
    listed = admin(h, "GET", "/admin/sessions").json()["sessions"]
    assert key in [s["session_key"] for s in listed]
    one = admin(h, "GET", f"/admin/sessions/{key}").json()
    assert (one["session_key"], one["session_id"]) == (key, f"{key}#1")
    steer = {"text": "now in French", "sender_id": MASTER}
    not_master = admin(h, "POST", f"/admin/sessions/{key}/steer", json={"text": "x", "sender_id": user})
    assert not_master.status_code == 403 and "not a master" in not_master.json()["error"]
    bad = admin(h, "POST", f"/admin/sessions/{key}/follow_up", json={"text": ""})
    assert (bad.status_code, bad.json()) == (400, {"error": "`text` must be a non-empty string"})
    unknown = admin(h, "POST", f"/admin/sessions/onebot11:{BOT_ID}:private:1/steer", json=steer)
    assert unknown.status_code == 404
    ok = admin(h, "POST", f"/admin/sessions/{key}/follow_up", json=steer)
    assert ok.status_code == 200 and ok.json()["kind"] == "follow_up" and ok.json()["session_key"] == key
    replies = await wait_sent(h, user, 2)
    assert replies[1] == private_call(user, "re: now in French")
    assert admin(h, "POST", f"/admin/sessions/{key}/abort").json()["kind"] == "abort"
    archived = admin(h, "POST", f"/admin/sessions/{key}/archive").json()
    assert archived == {"status": "ok", "kind": "archive", "session_key": key, "result": f"{key}#2"}
    status = admin(h, "GET", "/admin/status").json()
    assert {"live_sessions", "hosts", "turns", "throughput_msg_s"} <= set(status)


async def test_cli_control_commands_against_the_running_ingress(h: IngressHarness) -> None:
    user = "200000060"
    key = f"onebot11:{BOT_ID}:private:{user}"
    body = onebot_event(h.api.fixtures_dir, user, "hello cli", 9001)
    assert (await post_until_accepted(h, body)).json() == {"status": "accepted"}
    await wait_sent(h, user, 1)
    env = {**os.environ, TOKEN_ENV: TOKEN}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "actors.cli.main", *args, "--url", h.url, "--token-env", TOKEN_ENV],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            cwd=ROOT,
        )

    sessions = await asyncio.to_thread(cli, "sessions")
    assert sessions.returncode == 0, sessions.stderr
    assert key in sessions.stdout
    refused = await asyncio.to_thread(cli, "steer", key, "do it", "--as", user)
    assert refused.returncode == 1 and "HTTP 403" in refused.stderr
    follow = await asyncio.to_thread(cli, "follow-up", key, "more please", "--as", MASTER)
    assert (follow.returncode, follow.stdout.strip()) == (0, "follow_up: started"), follow.stderr
    assert (await wait_sent(h, user, 2))[1] == private_call(user, "re: more please")
    status = await asyncio.to_thread(cli, "status", "--json")
    assert status.returncode == 0 and "live_sessions" in json.loads(status.stdout)
    # readable tables, not Python reprs: the session's host slot, every turn (the follow-up's included)
    listed = next(s for s in admin(h, "GET", "/admin/sessions").json()["sessions"] if s["session_key"] == key)
    assert listed["turns"] == 2 and listed["actor_id"]
    table = await asyncio.to_thread(cli, "sessions")
    lines = table.stdout.splitlines()
    assert lines[1].split() == [
        "SESSION",
        "KEY",
        "SESSION",
        "ID",
        "SHARD",
        "HOST",
        "TURNS",
        "PENDING",
        "IDLE",
        "S",
    ]
    row = next(line.split() for line in lines[2:] if line.startswith(key + " "))
    assert row[:6] == [key, f"{key}#1", str(listed["shard"]), str(listed["host"]), "2", "0"]
    assert "None" not in table.stdout and "{" not in table.stdout
    shown = await asyncio.to_thread(cli, "status")
    assert shown.returncode == 0 and "{'" not in shown.stdout and "['" not in shown.stdout
    assert shown.stdout.splitlines()[0].split() == ["RUNTIME", "VALUE"]
    assert any(line.split()[0] == "live_sessions" for line in shown.stdout.splitlines()[1:4])
    aborted = await asyncio.to_thread(cli, "abort", key)
    assert (aborted.returncode, aborted.stdout) == (0, "aborted 0 running turns (none was running)\n")
    archived = await asyncio.to_thread(cli, "archive", key)
    assert (archived.returncode, archived.stdout) == (0, f"archived {key}: now on {key}#2\n")
    malformed = await asyncio.to_thread(cli, "abort", "no-such-key")
    assert malformed.returncode == 1 and "HTTP 400: malformed session key 'no-such-key'" in malformed.stderr
    no_token = subprocess.run(
        [sys.executable, "-m", "actors.cli.main", "sessions", "--url", h.url,
         "--token-env", "EDGE_UNSET_TOKEN"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert (no_token.returncode, no_token.stderr.strip()) == (
        2,
        "sessionray: $EDGE_UNSET_TOKEN is not set (the admin API needs its bearer token)",
    )

"""One message's trace through the real chain on a real local Ray (docs/decisions.md#ops-traces).

The ingress (starlette under uvicorn, in this process) takes a OneBot webhook over loopback,
stores it in the SQLite inbox and submits it to a real :class:`SessionRuntime` (router shard and
session host actors, the scripted faux model calling the ``sleep`` tool once), whose reply goes
through a real delivery actor to the platform-API stand-in. This process exports to the SDK's
in-memory exporter; the actors, in their own processes, to JSON-lines files under
``tracing.spans_dir``. Every step must be there, in one trace, each under the right parent.
With tracing off the same chain makes no span and writes no file.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from actors.cli.trace import sql_record
from actors.delivery.pool import DeliverySettings, create_pool
from actors.inbound.ingress import build_app
from actors.placement.runtime import SessionRuntime
from runtime import tracing
from runtime.config import BotConfig, Config, DatabaseConfig, RuntimeConfig, ServerConfig
from runtime.config.tracing import TracingConfig
from runtime.memory.db import Database
from runtime.memory.inbox import InboxRow
from runtime.tracing.records import read_spans, trace_of
from runtime.tracing.sdk import span_record
from tests.actors.edge_support import serve_in_thread
from tests.actors.session_scripts import ScriptedSetup
from tests.platform_api_server import PlatformApiServer

BOT, USER = "10001", "20002"
STEPS = {
    "webhook": ("ingress", None),
    "inbox.store": ("ingress", "webhook"),
    "submit": ("ingress", "webhook"),
    "activation": ("ingress", "submit"),
    "host.accept": ("host", "submit"),
    "turn": ("host", "host.accept"),
    "llm.call": ("host", "turn"),
    "tool": ("host", "turn"),
    "reply.validate": ("host", "turn"),
    "handoff": ("host", "turn"),
    "delivery": ("delivery", "handoff"),
    "delivery.claim": ("delivery", "delivery"),
    "delivery.send": ("delivery", "delivery"),
    "delivery.close": ("delivery", "delivery"),
}
"""Each step's process and its parent step."""


@dataclass
class Chain:
    url: str
    api: PlatformApiServer
    spans_dir: Path
    db_url: str
    memory: InMemorySpanExporter | None

    def post(self, message_id: int, text: str) -> httpx.Response:
        event = {
            "post_type": "message",
            "message_type": "private",
            "sub_type": "friend",
            "self_id": int(BOT),
            "user_id": int(USER),
            "message_id": message_id,
            "time": 1756168635,
            "message": [{"type": "text", "data": {"text": text}}],
            "sender": {"user_id": int(USER), "nickname": "u"},
        }
        body = json.dumps(event).encode()
        return httpx.post(
            f"{self.url}/webhooks/onebot11/{BOT}", content=body, headers={"Content-Type": "application/json"}
        )

    def sent(self) -> list[str]:
        return [
            "".join(seg["data"].get("text", "") for seg in r.json["message"])
            for r in list(self.api.requests)
            if r.path == "/send_private_msg"
        ]


def wait_for(pred: Any, what: str, timeout_s: float = 60.0) -> Any:
    """Poll ``pred`` every 20 ms until truthy (a wait for an outcome, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while not (value := pred()):
        assert time.monotonic() < deadline, f"{what} not reached within {timeout_s} s"
        time.sleep(0.02)
    return value


@contextmanager
def running_chain(tmp: Path, fixtures_dir: Path, *, traced: bool) -> Iterator[Chain]:
    """The whole chain (see the module docstring) with ``tracing.enabled = traced``."""
    spans_dir = tmp / "traces"
    db_url = f"sqlite:///{tmp / 'sessionray.db'}"
    settings = TracingConfig(enabled=traced, spans_dir=str(spans_dir))
    memory = InMemorySpanExporter() if traced else None
    tracing.configure(settings, "ingress", exporter=memory)  # the ingress keeps this set-up
    with PlatformApiServer(fixtures_dir) as api:
        bot = BotConfig(platform="onebot11", self_id=BOT, api_base=api.base_url)
        config = Config(
            bots=[bot],
            database=DatabaseConfig(url=db_url),
            server=ServerConfig(admin_token_env="TRACE_NO_TOKEN"),
            runtime=RuntimeConfig(min_hosts=1, router_shards=1, delivery_actors=1),
            tracing=settings,
        )
        prefix = f"trace-{uuid.uuid4().hex[:8]}"
        delivery = create_pool(DeliverySettings.from_config(config), 1, prefix=f"{prefix}-d", sweep_s=0)
        rt = SessionRuntime(prefix=prefix)
        setup = ScriptedSetup(str(tmp / "markers"))
        asyncio.run(rt.start(config, setup_factory=setup, delivery=delivery, wait_warm=True))
        app = build_app(rt, config)
        app.state.ingress.gate.submit_wait_s = 60.0  # a loaded machine's slow first activation: one trace
        try:
            with serve_in_thread(app) as url:
                yield Chain(url, api, spans_dir, db_url, memory)
        finally:
            tracing.reset()
            asyncio.run(rt.stop())
            delivery.stop()


def spans_of(chain: Chain) -> list[dict[str, Any]]:
    """This process's spans (in memory) and the actors' (files)."""
    assert chain.memory is not None
    return [span_record(s) for s in chain.memory.get_finished_spans()] + read_spans(chain.spans_dir)


def stored_message(db_url: str, message_id: str) -> dict[str, Any]:
    db = Database(db_url)
    try:
        with db.session() as s:
            row = s.get(InboxRow, 1)
            assert row is not None and row.message_id == message_id
            return dict(json.loads(row.message_json))
    finally:
        db.dispose()


def sql_of(db_url: str, ident: str) -> list[tuple[str, str, int]]:
    db = Database(db_url)
    try:
        return sql_record(db, ident)
    finally:
        db.dispose()


def steps_of(record: list[tuple[str, str, int]]) -> list[tuple[str, str]]:
    return sorted((step.split()[0], state) for step, state, _ in record)


@pytest.mark.usefixtures("ray_session")
def test_one_message_is_one_trace_with_every_step(tmp_path: Path, fixtures_dir: Path) -> None:
    with running_chain(tmp_path, fixtures_dir, traced=True) as chain:
        assert chain.post(4242, "slow 0").json() == {"status": "accepted"}
        wait_for(lambda: chain.sent(), "the reply at the platform")
        names = lambda: {s["name"] for s in spans_of(chain)}  # noqa: E731
        wait_for(lambda: set(STEPS) <= names(), "every step's span exported")  # actors flush in 0.5 s
        spans = spans_of(chain)
        stored = stored_message(chain.db_url, "4242")
    assert chain.sent() == ["tool: slept 0; then: []"]
    assert len({s["trace_id"] for s in spans}) == 1, "one trace for the message"
    by_id = {s["span_id"]: s for s in spans}
    for s in spans:
        process, parent = STEPS[s["name"]]
        assert s["process"] == process, s["name"]
        got = by_id[s["parent_id"]]["name"] if s["parent_id"] is not None else None
        assert got == parent, f"{s['name']} is under {got}, not {parent}"
    counts = {n: sum(1 for s in spans if s["name"] == n) for n in STEPS}
    assert counts == {**dict.fromkeys(STEPS, 1), "llm.call": 2}  # the tool call, then the answer
    llm = [s for s in spans if s["name"] == "llm.call"]
    assert all("first_token" in [e["name"] for e in s["events"]] for s in llm)
    assert [s["attributes"]["stop_reason"] for s in llm] == ["toolUse", "stop"]
    # the faux model reports no usage: the token attributes are there, with its zeros
    assert [(s["attributes"]["model"], s["attributes"]["output_tokens"]) for s in llm] == [
        ("script-model", 0)
    ] * 2
    step = {s["name"]: s for s in spans}
    # the reply was its chat's only unfinished one: notified with it, the delivery reads no queue;
    # the claim is decided at once (an instant) and made by step 0's mark on the wire, in the send
    claim, delivery = step["delivery.claim"], step["delivery"]
    assert delivery["start_ns"] <= claim["start_ns"] == claim["end_ns"] <= step["delivery.send"]["start_ns"]
    assert claim["attributes"] == {"at_wire": True}
    reply_id = step["handoff"]["attributes"]["reply_id"]
    everything = sorted(s["span_id"] for s in spans)
    assert sorted(s["span_id"] for s in trace_of(spans, reply_id)) == everything  # sessionray trace <reply>
    assert sorted(s["span_id"] for s in trace_of(spans, "4242")) == everything  # sessionray trace <message>
    root = next(s for s in spans if s["name"] == "webhook")
    assert root["attributes"]["message_id"] == "4242"
    assert stored["traceparent"].split("-")[1:3] == [root["trace_id"], root["span_id"]]  # kept in the inbox


@pytest.mark.usefixtures("ray_session")
def test_tracing_off_makes_no_span_and_exports_nothing(tmp_path: Path, fixtures_dir: Path) -> None:
    with running_chain(tmp_path, fixtures_dir, traced=False) as chain:
        assert chain.post(4343, "echo hi").json() == {"status": "accepted"}
        wait_for(lambda: chain.sent(), "the reply at the platform")
        assert not tracing.enabled()
        stored = stored_message(chain.db_url, "4343")
        # sessionray trace without spans: the SQL-side record of the message and its reply (the
        # inbox mark "handled" is written batched, after the turn: waited for)
        want = [
            ("inbox.changed", "handled"),
            ("inbox.received", "stored"),
            ("ledger.changed", "sent"),
            ("ledger.queued", "queued"),
        ]
        record = wait_for(
            lambda: (r := sql_of(chain.db_url, "4343")) and steps_of(r) == want and r, "the whole record"
        )
    assert chain.sent() == ["hi"]
    assert stored["traceparent"] is None
    assert not chain.spans_dir.exists()
    assert record[0][:2] == ("inbox.received", "stored") and record[0][2] == 0
    assert all(at >= 0 for _, _, at in record)

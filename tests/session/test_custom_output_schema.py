"""A custom ``ai.agent.output_schema`` (docs/decisions.md#structured-custom-schema) through a real
(Ray-free) session turn: the config setup factory, SessionCore on SQLite, a faux model that fakes
only the model's answers, and a loopback HTTP callback. The validated object is POSTed to the sink
and/or recorded in the transcript, nothing goes to the chat, and an answer that stays invalid
after the one correction call delivers nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from actors.placement.hosts.setup import ConfigSetupFactory, output_schema
from providers.faux import faux_assistant_message, faux_text, faux_tool_call, register_faux_provider
from runtime.config import ConfigError, parse_config
from runtime.delivery.job import DeliveryJob
from runtime.llm.types import CustomMessage
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.reply.custom_output import OUTPUT_TOOL, OutputSchemaError
from runtime.reply.im_reply import IM_INSTRUCTIONS
from runtime.session.core import SessionCore
from runtime.session.output_sink import STRUCTURED_OUTPUT_MARKER, OutputSink
from runtime.session.turn import TurnInput
from tests.session.output_types import TICKET_SCHEMA, Decision

KEY = "onebot11:10001:private:42"
DECISION = "tests.session.output_types:Decision"
GOOD = {"intent": "REFUND", "action": "ASK_ORDER_ID", "arguments": {"product": "shoes"}}


class Callback:
    """A loopback HTTP receiver: answers each POST with the next status of ``statuses`` (then 200)
    and records ``(path, headers, json body)``."""

    def __init__(self, *statuses: int) -> None:
        self.statuses = list(statuses)
        self.posts: list[tuple[str, dict[str, str], Any]] = []
        cb = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                cb.posts.append((self.path, dict(self.headers), json.loads(raw)))
                status = cb.statuses.pop(0) if cb.statuses else 200
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def callback() -> Iterator[Callback]:
    cb = Callback()
    yield cb
    cb.close()


def config(tmp_path: Path, tier: str = "native", **agent: Any) -> Any:
    cfg = parse_config(
        {
            "ai": {
                "default_model": "cs/m",
                "providers": {"cs": {"api": "faux", "models": [{"id": "m", "structured_tier": tier}]}},
                "agent": agent,
            },
            "database": {"url": f"sqlite:///{tmp_path / 'cs.db'}"},
        }
    )
    Database(cfg.database.url).create_tables()
    return cfg


def a_turn(text: str = "I want to return the shoes") -> TurnInput:
    return TurnInput(
        seq=1,
        session_key=KEY,
        platform="onebot11",
        bot_id="10001",
        message_id="m1",
        scene_type="private",
        scene_id="42",
        sender={"id": "42", "name": "Bob", "roles": []},
        text=text,
    )


async def run(cfg: Any, *steps: Any) -> tuple[Any, list[DeliveryJob], list[Any], Any]:
    """One turn; returns (turn result, chat deliveries, stored messages, faux handle)."""
    handle = register_faux_provider(list(steps), provider="cs", models=["m"])
    setup = ConfigSetupFactory(cfg)(KEY)
    db = Database(cfg.database.url)
    repo = ContextRepository(db)
    jobs: list[DeliveryJob] = []

    async def deliver(job: DeliveryJob) -> None:
        jobs.append(job)

    core = await SessionCore.open(KEY, repo, setup, deliver, max_concurrent_turns=2)
    result = await core.submit(a_turn())
    stored = [m.message for m in await repo.load_stored(core.session_id)]
    db.dispose()
    return result, jobs, stored, handle


def outputs(stored: list[Any]) -> list[dict[str, Any]]:
    return [
        m.data for m in stored if isinstance(m, CustomMessage) and m.custom_type == STRUCTURED_OUTPUT_MARKER
    ]


async def test_the_typed_object_is_posted_to_the_callback(tmp_path: Path, callback: Callback, metric) -> None:
    cfg = config(tmp_path, output_schema=DECISION, output_sink={"url": callback.url, "transcript": False})
    result, jobs, stored, handle = await run(cfg, faux_assistant_message([faux_text(json.dumps(GOOD))]))
    assert (result.outcome, jobs) == ("empty", [])  # nothing goes to the chat
    [(path, headers, body)] = callback.posts
    assert (path, body) == ("/hook", GOOD)
    assert Decision.model_validate(body, strict=False) == Decision.model_validate(GOOD, strict=False)
    assert headers["Idempotency-Key"] == f"{KEY}/m1"
    assert (headers["X-Sessionray-Schema"], headers["X-Sessionray-Message-Id"]) == ("Decision", "m1")
    assert outputs(stored) == []  # transcript: false
    # the request: the schema natively, no IM message prompt
    [call] = handle.calls
    assert call.options.output_schema["required"] == ["intent", "action", "arguments"]
    assert call.options.output_schema_name == OUTPUT_TOOL
    assert IM_INSTRUCTIONS not in call.context.system_prompt
    assert metric("sessionray_structured_sink_total", sink="url", outcome="delivered") == 1
    assert metric("sessionray_structured_replies_total", mode="native", outcome="first_try") == 1


async def test_transcript_variant_records_the_validated_json(tmp_path: Path, metric) -> None:
    schema_file = tmp_path / "ticket.json"
    schema_file.write_text(json.dumps(TICKET_SCHEMA))
    cfg = config(tmp_path, tier="tool", output_schema=str(schema_file))  # no output_sink: transcript
    ticket = {"priority": "high", "summary": "return shoes", "count": 1}
    result, jobs, stored, handle = await run(
        cfg, faux_assistant_message([faux_tool_call(OUTPUT_TOOL, ticket)], stop_reason="toolUse")
    )
    assert (result.outcome, jobs) == ("empty", [])
    [record] = outputs(stored)
    assert record == {
        "message_id": "m1",
        "idempotency_key": f"{KEY}/m1",
        "schema": "Ticket",
        "tier": "tool",
        "outcome": "first_try",
        "value": ticket,
    }
    [call] = handle.calls
    assert [t.name for t in call.context.tools or []][-1] == OUTPUT_TOOL
    assert call.options.output_schema is None
    assert metric("sessionray_structured_sink_total", sink="transcript", outcome="delivered") == 1


async def test_a_corrected_answer_is_delivered(tmp_path: Path, callback: Callback, metric) -> None:
    cfg = config(tmp_path, tier="prompt", output_schema=DECISION, output_sink={"url": callback.url})
    drift = {**GOOD, "intent": "refund please"}
    result, jobs, stored, handle = await run(
        cfg,
        faux_assistant_message([faux_text(json.dumps(drift))]),
        faux_assistant_message([faux_text(json.dumps(GOOD))]),  # the one correction call
    )
    assert (result.outcome, jobs, [body for _, _, body in callback.posts]) == ("empty", [], [GOOD])
    assert [r["outcome"] for r in outputs(stored)] == ["corrected"]
    assert handle.call_count == 2
    assert '"$defs"' in handle.calls[0].context.system_prompt  # the prompt tier embeds the schema
    assert metric("sessionray_structured_replies_total", mode="prompt", outcome="corrected") == 1


async def test_invalid_after_the_correction_delivers_nothing(
    tmp_path: Path, callback: Callback, metric
) -> None:
    cfg = config(tmp_path, output_schema=DECISION, output_sink={"url": callback.url, "transcript": True})
    result, jobs, stored, handle = await run(
        cfg,
        faux_assistant_message([faux_text('{"intent": "REFUND", "action": "x"}')]),  # arguments missing
        faux_assistant_message([faux_text('Sure! {"intent": "REFUND"}')]),  # still invalid
    )
    assert handle.call_count == 2  # the answer and exactly one correction call
    assert (result.outcome, jobs, callback.posts, outputs(stored)) == ("empty", [], [], [])
    assert metric("sessionray_structured_replies_total", mode="native", outcome="failed") == 1
    assert metric("sessionray_structured_sink_total", sink="url", outcome="delivered") == 0


async def test_callback_retries_transient_errors_and_stops_on_a_refusal(metric) -> None:
    from runtime.reply.custom_output import spec_from_model

    spec, value = spec_from_model(Decision), Decision.model_validate(GOOD, strict=False)
    pauses: list[float] = []

    async def sleep(s: float) -> None:
        pauses.append(s)

    flaky = Callback(503, 429)
    refusing = Callback(400)
    try:
        common = {"key": "k", "message_id": "m", "session_key": KEY, "tier": "native", "outcome": "first_try"}
        ok = await OutputSink(url=flaky.url, transcript=False, sleep=sleep, backoff_s=0.5).deliver(
            spec, value, record=None, **common
        )
        refused = await OutputSink(url=refusing.url, transcript=False, sleep=sleep).deliver(
            spec, value, record=None, **common
        )
    finally:
        flaky.close()
        refusing.close()
    assert (ok, len(flaky.posts), pauses[:2]) == ({"url": True}, 3, [0.5, 1.0])
    assert (refused, len(refusing.posts), len(pauses)) == ({"url": False}, 1, 2)
    assert metric("sessionray_structured_sink_total", sink="url", outcome="failed") == 1


def test_output_schema_forms_and_refusals(tmp_path: Path) -> None:
    assert output_schema(config(tmp_path, output_schema=DECISION)).output_type is Decision
    inline = output_schema(config(tmp_path, output_schema=TICKET_SCHEMA))
    assert inline.schema["additionalProperties"] is False and inline.name == "Ticket"
    assert output_schema(config(tmp_path, output_schema=False)) is False
    bad = {
        "tests.session.output_types:OpenDecision": "an object must be closed",
        "tests.session.output_types:Missing": "cannot be imported",
        str(tmp_path / "nowhere.json"): "cannot read a JSON Schema",
    }
    for ref, why in bad.items():
        with pytest.raises(OutputSchemaError, match=why):
            output_schema(config(tmp_path, output_schema=ref))
    optional = {**TICKET_SCHEMA, "required": ["priority"]}
    with pytest.raises(OutputSchemaError, match=r"every property must be required.*summary, count"):
        output_schema(config(tmp_path, output_schema=optional))
    open_map = {"type": "object", "properties": {"a": {"type": "object"}}, "required": ["a"]}
    with pytest.raises(OutputSchemaError, match="/properties/a: an object needs properties"):
        output_schema(config(tmp_path, output_schema=open_map))
    from actors.serve.preflight import EXIT_CONFIG, environment_problems  # `sessionray check` / serve

    [problem] = environment_problems(
        config(tmp_path, output_schema="tests.session.output_types:OpenDecision")
    )
    assert problem.code == EXIT_CONFIG and problem.text.startswith("ai.agent.output_schema: ")
    with pytest.raises(ConfigError, match="only used with a custom output_schema"):
        config(tmp_path, output_sink={"url": "http://127.0.0.1:1/x"})
    with pytest.raises(ConfigError, match="would go nowhere"):
        config(tmp_path, output_schema=DECISION, output_sink={"transcript": False})
    with pytest.raises(ConfigError, match="must start with http"):
        config(tmp_path, output_schema=DECISION, output_sink={"url": "ftp://x"})

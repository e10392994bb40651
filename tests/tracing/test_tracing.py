"""runtime.tracing in one process (docs/decisions.md#ops-traces): off makes nothing and imports
nothing of OpenTelemetry; on, spans nest, cross a "process" through a ``traceparent`` string,
link a replay to its first attempt, go to JSON-lines files that ``sessionray trace`` reads back,
and go over real OTLP/HTTP to a loopback receiver that decodes the protobuf it gets."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from actors.cli import trace as trace_cli
from runtime import tracing
from runtime.config.tracing import TracingConfig
from runtime.tracing.records import read_spans, timeline, trace_of
from runtime.tracing.sdk import span_record
from tests.bench.trace_table import step_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def memory() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.configure(TracingConfig(enabled=True), "test", exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.reset()


def sampled(traceparent: str) -> bool:
    """The W3C ``sampled`` flag (bit 0 of the last field)."""
    return bool(int(traceparent.rsplit("-", 1)[1], 16) & 1)


def records(exporter: InMemorySpanExporter) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in (span_record(s) for s in exporter.get_finished_spans())}


def test_off_makes_no_span_and_imports_no_opentelemetry() -> None:
    code = (
        "import sys\n"
        "from runtime import tracing\n"
        "from runtime.config.tracing import TracingConfig\n"
        "assert not tracing.configure(TracingConfig(), 'x')\n"
        "with tracing.span('a', x=1) as s:\n"
        "    s.set(y=2); s.event('e')\n"
        "    assert s is tracing.NOOP and s.traceparent() is None and tracing.traceparent() is None\n"
        "tracing.event('e')\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_spans_nest_and_cross_a_process_by_traceparent(memory: InMemorySpanExporter) -> None:
    with tracing.span("webhook", message_id="m1") as root:
        with tracing.span("inbox.store"):
            pass
        carried = root.traceparent()
    assert carried is not None and carried.startswith("00-") and sampled(carried)
    with tracing.span("turn", parent=carried, seq=1) as turn:  # as a host would, from the message
        tracing.event("first_token")
        turn.set(outcome="ok", skipped=None)
        assert tracing.traceparent() == turn.traceparent()
    got = records(memory)
    assert set(got) == {"webhook", "inbox.store", "turn"}
    assert len({r["trace_id"] for r in got.values()}) == 1
    assert got["webhook"]["parent_id"] is None
    assert got["inbox.store"]["parent_id"] == got["webhook"]["span_id"]
    assert got["turn"]["parent_id"] == got["webhook"]["span_id"]
    assert got["turn"]["attributes"] == {"seq": 1, "outcome": "ok"}
    assert [e["name"] for e in got["turn"]["events"]] == ["first_token"]


def test_a_replay_links_its_first_attempt(memory: InMemorySpanExporter) -> None:
    with tracing.span("webhook", message_id="m2") as first:
        stored = first.traceparent()
    assert stored is not None
    with tracing.span("replay", links=(stored, "not-a-traceparent")):
        pass
    got = records(memory)
    assert got["replay"]["parent_id"] is None
    assert got["replay"]["trace_id"] != got["webhook"]["trace_id"]
    first_span = {"trace_id": got["webhook"]["trace_id"], "span_id": got["webhook"]["span_id"]}
    assert got["replay"]["links"] == [first_span]


def test_a_malformed_parent_starts_a_new_trace(memory: InMemorySpanExporter) -> None:
    with tracing.span("turn", parent="00-garbage"):
        pass
    assert records(memory)["turn"]["parent_id"] is None


def test_sample_ratio_zero_records_nothing_and_carries_the_decision() -> None:
    exporter = InMemorySpanExporter()
    tracing.configure(TracingConfig(enabled=True, sample_ratio=0.0), "test", exporter=exporter)
    try:
        with tracing.span("webhook") as root:
            carried = root.traceparent()
        with tracing.span("turn", parent=carried):
            pass
    finally:
        tracing.reset()
    assert exporter.get_finished_spans() == ()
    assert carried is not None and not sampled(carried)  # not sampled: later steps follow


def test_jsonl_files_give_the_timeline_and_the_cli_prints_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spans_dir = tmp_path / "traces"
    tracing.configure(TracingConfig(enabled=True, spans_dir=str(spans_dir)), "ingress")
    try:
        with tracing.span("webhook", message_id="m3") as root, tracing.span("submit"):
            pass
        with tracing.span("replay", links=(root.traceparent() or "",)), tracing.span("activation"):
            pass
        with tracing.span("webhook", message_id="other"):
            pass
        assert tracing.flush()
    finally:
        tracing.reset()
    (spans_dir / "spans-host-1.jsonl").open("a").write("{cut off by a crash\n")
    spans = trace_of(read_spans(spans_dir), "m3")
    assert [s["name"] for s in spans] == ["webhook", "submit", "replay", "activation"]
    rows = timeline(spans)
    assert [(r.step, r.process, r.depth) for r in rows] == [
        ("webhook", "ingress", 0),
        ("submit", "ingress", 1),
        ("replay", "ingress", 0),
        ("activation", "ingress", 1),
    ]
    assert rows[0].start_ms == 0.0 and all(r.duration_ms >= 0 for r in rows)
    assert rows[1].start_ms >= rows[0].start_ms and rows[2].start_ms >= rows[0].start_ms + rows[0].duration_ms
    table = step_table(read_spans(spans_dir))
    counts = [(r.step, r.count) for r in table]
    assert counts == [("activation", 1), ("replay", 1), ("submit", 1), ("webhook", 2)]

    config = tmp_path / "sessionray.yaml"
    db = tmp_path / "x.db"
    config.write_text(f"database: {{url: 'sqlite:///{db}'}}\ntracing: {{spans_dir: '{spans_dir}'}}\n")
    assert trace_cli.main(["m3", "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["step", "process", "start", "ms", "duration", "ms"]
    assert [line.split()[0] for line in lines[1:]] == ["webhook", "submit", "replay", "activation"]
    assert trace_cli.main(["nothing-like-it", "--config", str(config)]) == 1


class _Receiver(BaseHTTPRequestHandler):
    bodies: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


def test_otlp_http_spans_arrive_at_a_loopback_receiver() -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    try:
        tracing.configure(TracingConfig(enabled=True, otlp_endpoint=endpoint), "delivery")
        try:
            with tracing.span("delivery", reply_id="r1") as root, tracing.span("delivery.send", step=0):
                pass
            assert tracing.flush()
        finally:
            tracing.reset()
    finally:
        server.shutdown()
    assert _Receiver.bodies, "the receiver got nothing"
    spans = []
    for path, content_type, body in _Receiver.bodies:
        assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
            assert attrs["sessionray.process"] == "delivery" and attrs["service.name"] == "sessionray"
            spans += [s for ss in rs.scope_spans for s in ss.spans]
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"delivery", "delivery.send"}
    assert by_name["delivery.send"].parent_span_id == by_name["delivery"].span_id
    assert by_name["delivery"].trace_id.hex() == (root.traceparent() or "").split("-")[1]
    assert {a.key: a.value.string_value for a in by_name["delivery"].attributes} == {"reply_id": "r1"}


class _Path:
    """The recovery loop's submit path, recording what it is given."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, int]] = []

    async def submit(self, inbound: Any, attempt: int = 0) -> dict[str, Any]:
        self.sent.append((inbound, attempt))
        return {"status": "accepted", "retry_after_s": None, "seq": 1}


async def test_the_recovery_loop_replays_as_a_new_trace_linked_to_the_first(
    tmp_path: Path, memory: InMemorySpanExporter
) -> None:
    from actors.placement.recovery import InboxRecovery
    from runtime.platforms.base import InboundMessage, Sender

    async def place(*args: Any) -> Any:
        raise AssertionError("not called: the submit path is a stand-in")

    with tracing.span("webhook", message_id="m9") as first:
        stored = first.traceparent()
    msg = InboundMessage(
        platform="onebot11",
        bot_id="1",
        message_id="m9",
        scene_type="private",
        scene_id="2",
        sender=Sender(id="2", name="u"),
        text="hi",
        time_ms=1,
        traceparent=stored,
    )
    # as stored in its inbox row and read back by the loop
    again = InboundMessage.model_validate_json(msg.model_dump_json())
    recovery = InboxRecovery(f"sqlite:///{tmp_path / 'r.db'}", place, shard=0, shards=1, replay_window_s=600)
    path = _Path()
    recovery.path = path  # type: ignore[assignment]
    try:
        assert (await recovery._resubmit(again))["status"] == "accepted"
    finally:
        recovery.db.dispose()
    got = records(memory)
    ((sent, attempt),) = path.sent
    assert attempt == 1 and sent.message_id == "m9"
    assert got["replay"]["links"] == [
        {"trace_id": got["webhook"]["trace_id"], "span_id": got["webhook"]["span_id"]}
    ]
    assert sent.traceparent.split("-")[1:3] == [got["replay"]["trace_id"], got["replay"]["span_id"]]

"""The capability probe and the downgrade on evidence through the real path: the config session
setup (``actors.placement.hosts.setup.ConfigSetupFactory``), a Ray-free ``SessionCore`` on SQLite, the
openai-completions provider talking HTTP to a loopback stub that answers 200 with prose under
``response_format`` (docs/decisions.md#structured-capability-cache,
docs/decisions.md#structured-downgrade-on-evidence)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from actors.placement.hosts.setup import ConfigSetupFactory
from runtime.config import parse_config
from runtime.delivery.job import DeliveryJob
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from runtime.reply.segments import Reply
from runtime.session.capability_store import SqlCapabilityStore
from runtime.session.core import SessionCore
from runtime.session.turn import TurnInput
from tests.reply.openai_stub import PROMPT_TEXT, PROSE, TOOL_TEXT, OpenAIStub, is_probe, tool_names

ROOT = Path(__file__).resolve().parents[2]
FAIL = "Sorry, something went wrong while answering. Please try again."
KEY = "onebot11:10001:private:42"


def config(db_url: str, base_url: str, ai: dict[str, Any] | None = None, **model: Any) -> Any:
    """The session's configuration: the stub's one model (``model``: its ``models[]`` keys) as the
    default, and the ``ai`` section's other keys from ``ai``."""
    return parse_config(
        {
            "database": {"url": db_url},
            "ai": {
                **(ai or {}),
                "default_model": "stub/prose-model",
                "providers": {
                    "stub": {
                        "api": "openai-completions",
                        "base_url": base_url,
                        "models": [{"id": "prose-model", **model}],
                    }
                },
            },
        }
    )


def turn(seq: int, text: str, message_id: str | None = None) -> TurnInput:
    """Turn ``seq`` of one activation (a new activation counts from 1 again)."""
    return TurnInput(
        seq=seq,
        session_key=KEY,
        platform="onebot11",
        bot_id="10001",
        message_id=message_id or f"m{seq}",
        scene_type="private",
        scene_id="42",
        sender={"id": "42", "name": "Bob", "roles": ["master"]},
        text=text,
        segments=[{"type": "text", "data": {"text": text}}],
        time_ms=1_700_000_000_000 + seq,
    )


class Sent:
    def __init__(self) -> None:
        self.replies: list[Reply] = []

    async def __call__(self, job: DeliveryJob) -> None:
        self.replies.append(job.reply)


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as s:
        yield s


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'caps.db'}"


async def session(cfg: Any) -> tuple[SessionCore, Sent, Database]:
    db = Database(cfg.database.url)
    db.create_tables()
    factory = ConfigSetupFactory(cfg)
    factory.prepare(database=db)
    sent = Sent()
    core = await SessionCore.open(KEY, ContextRepository(db), factory(KEY), sent, max_concurrent_turns=1)
    return core, sent, db


def downgrades(src: str, dst: str) -> float:
    labels = {"from_mode": src, "to_mode": dst}
    return REGISTRY.get_sample_value("sessionray_structured_downgrades_total", labels) or 0.0


async def test_two_off_schema_turns_move_the_model_to_the_tool_tier(stub: OpenAIStub, db_url: str) -> None:
    before = downgrades("native", "tool")
    core, sent, db = await session(config(db_url, stub.base_url))
    try:
        for seq in (1, 2):
            assert (await core.submit(turn(seq, f"question {seq}"))).outcome == "ok"
        # probe at first use: the tiny schema works natively, so the model starts at native
        assert [is_probe(b) for b in stub.requests[:1]] == [True]
        # each turn: its correction call is also prose, so the user gets the fixed failure text
        assert sent.replies == [Reply.of_text(FAIL), Reply.of_text(FAIL)]
        assert downgrades("native", "tool") - before == 1
        n = len(stub.requests)
        assert (await core.submit(turn(3, "question 3"))).outcome == "ok"
    finally:
        await core.close()
    third = stub.requests[n]
    assert "response_format" not in third and "reply" in tool_names(third)
    assert sent.replies[-1] == Reply.of_text(TOOL_TEXT)
    # the turns of the native tier: request + correction each, all under response_format
    native = [b for b in stub.requests[1:n] if not is_probe(b)]
    assert len(native) == 4 and all("response_format" in b for b in native)
    rec = await SqlCapabilityStore(db).load("stub", "prose-model")
    db.dispose()
    assert rec is not None
    assert (rec.tier, rec.source, rec.failures) == ("tool", "downgrade", 0)
    assert rec.reason.startswith("2 consecutive off-schema answers at native: ")
    assert rec.evidence == PROSE


async def test_downgrade_after_from_the_config_sets_how_many_off_schema_turns_it_takes(
    stub: OpenAIStub, db_url: str
) -> None:
    """``ai.downgrade_after: 3`` reaches the session's cache through the config setup: two
    off-schema turns are counted, not acted on; the third moves the model."""
    before = downgrades("native", "tool")
    core, sent, db = await session(config(db_url, stub.base_url, ai={"downgrade_after": 3}))
    store = SqlCapabilityStore(db)
    try:
        for seq in (1, 2):
            await core.submit(turn(seq, f"question {seq}"))
        rec = await store.load("stub", "prose-model")
        assert rec is not None and (rec.tier, rec.failures) == ("native", 2)
        assert downgrades("native", "tool") - before == 0
        await core.submit(turn(3, "question 3"))
        rec = await store.load("stub", "prose-model")
        assert rec is not None and (rec.tier, rec.source) == ("tool", "downgrade")
        assert rec.reason.startswith("3 consecutive off-schema answers at native: ")
        n = len(stub.requests)
        await core.submit(turn(4, "question 4"))
    finally:
        await core.close()
        db.dispose()
    assert downgrades("native", "tool") - before == 1
    assert sent.replies == [*[Reply.of_text(FAIL)] * 3, Reply.of_text(TOOL_TEXT)]
    assert "response_format" not in stub.requests[n] and "reply" in tool_names(stub.requests[n])


@pytest.mark.parametrize(("ttl_s", "probed"), [(60, True), (None, False)])
async def test_capability_ttl_from_the_config_decides_when_a_stored_tier_is_probed_again(
    stub: OpenAIStub, db_url: str, ttl_s: int | None, probed: bool
) -> None:
    """A stored ``tool`` tier 120 s old: with ``ai.capability_ttl_s: 60`` the session's first turn
    probes again (the stub's tiny schema works natively: back to ``native``, the only way up);
    with the default TTL (7 days) the stored tier is used as is."""
    import time

    from runtime.reply.capability import CapabilityRecord

    cfg = config(db_url, stub.base_url, ai={"capability_ttl_s": ttl_s} if ttl_s else None)
    stale = CapabilityRecord("stub", "prose-model", "tool", "probe", int(time.time() * 1000) - 120_000)
    core, sent, db = await session(cfg)
    store = SqlCapabilityStore(db)
    await store.save(stale)
    try:
        await core.submit(turn(1, "hi"))
        rec = await store.load("stub", "prose-model")
    finally:
        await core.close()
        db.dispose()
    assert any(is_probe(b) for b in stub.requests) is probed
    assert rec is not None
    if probed:
        assert (rec.tier, rec.source) == ("native", "probe")
        assert sent.replies == [Reply.of_text(FAIL)]  # native again: prose, as this model does
    else:
        assert rec == stale
        assert sent.replies == [Reply.of_text(TOOL_TEXT)]


async def test_probe_at_first_use_stores_tier_source_and_evidence(stub: OpenAIStub, db_url: str) -> None:
    core, _, db = await session(config(db_url, stub.base_url))
    store = SqlCapabilityStore(db)
    try:
        assert await store.load("stub", "prose-model") is None
        await core.submit(turn(1, "hi"))
    finally:
        await core.close()
    rec = await store.load("stub", "prose-model")
    db.dispose()
    assert rec is not None
    assert (rec.tier, rec.source, rec.reason) == ("native", "probe", "native: valid")
    assert rec.evidence == 'native: {"ok": true}'
    assert sum(is_probe(b) for b in stub.requests) == 1


async def test_tier_survives_a_restart_and_a_second_process_sees_it(stub: OpenAIStub, db_url: str) -> None:
    core, _, db = await session(config(db_url, stub.base_url))
    try:
        for seq in (1, 2):
            await core.submit(turn(seq, "q"))
    finally:
        await core.close()
    db.dispose()
    # another OS process on the same SQLite file reads the shared row
    script = (
        "import asyncio, sys\n"
        "from runtime.memory.db import Database\n"
        "from runtime.session.capability_store import SqlCapabilityStore\n"
        "db = Database(sys.argv[1])\n"
        "r = asyncio.run(SqlCapabilityStore(db).load('stub', 'prose-model'))\n"
        "print(r.tier, r.source)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, db_url], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "tool downgrade"
    # a restarted setup (new Database, new factory, empty in-memory cache) starts at tool: no probe
    probes = sum(is_probe(b) for b in stub.requests)
    core, sent, db = await session(config(db_url, stub.base_url))
    try:
        await core.submit(turn(1, "after restart", "m3"))
    finally:
        await core.close()
        db.dispose()
    assert sum(is_probe(b) for b in stub.requests) == probes
    assert sent.replies == [Reply.of_text(TOOL_TEXT)]


async def test_config_tier_wins_over_the_probe(stub: OpenAIStub, db_url: str) -> None:
    core, sent, db = await session(config(db_url, stub.base_url, structured_tier="prompt"))
    try:
        await core.submit(turn(1, "hi"))
        await core.submit(turn(2, "/models"))
    finally:
        await core.close()
    rows = await SqlCapabilityStore(db).load_all()
    db.dispose()
    assert not any(is_probe(b) for b in stub.requests)
    assert all("response_format" not in b and "reply" not in tool_names(b) for b in stub.requests)
    assert sent.replies[0] == Reply.of_text(PROMPT_TEXT)
    assert sent.replies[1] == Reply.of_text(
        "Configured models:\n- stub/prose-model (default): api openai-completions, context 128000 tokens, "
        "input text, structured output prompt (config)"
    )
    assert rows == []


async def test_models_command_shows_the_downgrade(stub: OpenAIStub, db_url: str) -> None:
    core, sent, db = await session(config(db_url, stub.base_url))
    try:
        for seq in (1, 2):
            await core.submit(turn(seq, "q"))
        await core.submit(turn(3, "/models"))
    finally:
        await core.close()
        db.dispose()
    assert sent.replies[-1] == Reply.of_text(
        "Configured models:\n- stub/prose-model (default): api openai-completions, context 128000 tokens, "
        "input text, structured output tool (downgrade, <1 min old)"
    )


def test_stub_answers_like_the_model_it_stands_for() -> None:
    def content(sse: bytes) -> str:
        first = json.loads(sse.split(b"\n\n")[0].removeprefix(b"data: "))
        return str(first["choices"][0]["delta"]["content"])

    with OpenAIStub() as s:
        assert content(s.answer({"response_format": {"json_schema": {"name": "reply"}}})) == PROSE
        assert content(s.answer({"response_format": {"json_schema": {"name": "probe"}}})) == '{"ok": true}'
        assert json.loads(content(s.answer({"messages": []}))) == {
            "segments": [{"type": "text", "data": {"text": PROMPT_TEXT}}]
        }

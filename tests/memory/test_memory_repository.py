"""ContextRepository on SQLite and PostgreSQL: round trip, epochs, concurrency, start-up rules."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from runtime.llm.types import (
    AssistantMessage,
    Context,
    Cost,
    CustomMessage,
    ImageContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from runtime.memory import (
    ContextRepository,
    Database,
    SessionInfo,
    SessionKeyError,
    UnknownSessionError,
)

KEY = "onebot11:10001:group:123456"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def every_kind_of_message() -> list[object]:
    """One of each message type, each content block type and every optional field set."""
    return [
        UserMessage(content="plain text 你好", timestamp=1_764_500_000_000),
        UserMessage(
            content=[
                TextContent(text="look", text_signature="sig-t"),
                ImageContent(data=PNG, mime_type="image/png"),
            ],
            timestamp=1_764_500_000_001,
            sender={"id": "20002", "name": "Alice", "roles": ["admin", "member"]},
        ),
        AssistantMessage(
            content=[
                ThinkingContent(thinking="let me think", signature="sig-th"),
                ThinkingContent(thinking="", signature="ENCRYPTED", redacted=True),
                TextContent(text="calling a tool"),
                ToolCall(
                    id="call_1",
                    name="weather",
                    arguments={"city": "Paris", "days": 3, "opts": {"units": ["c"], "x": None}},
                    thought_signature="ts",
                ),
            ],
            api="openai-completions",
            provider="local",
            model="qwen2.5",
            usage=Usage(
                input=10,
                output=20,
                cache_read=5,
                cache_write=1,
                total_tokens=36,
                cost=Cost(input=0.1, output=0.2, cache_read=0.01, cache_write=0.02, total=0.33),
            ),
            stop_reason="toolUse",
            response_id="resp-1",
            timestamp=1_764_500_000_002,
        ),
        ToolResultMessage(
            tool_call_id="call_1",
            tool_name="weather",
            content=[TextContent(text="sunny"), ImageContent(data=PNG, mime_type="image/png")],
            details={"raw": {"t": 21.5, "list": [1, 2]}},
            is_error=False,
            timestamp=1_764_500_000_003,
        ),
        ToolResultMessage(
            tool_call_id="call_2", tool_name="x", content=[], is_error=True, timestamp=1_764_500_000_004
        ),
        AssistantMessage(
            content=[], stop_reason="error", error_message="upstream 500", timestamp=1_764_500_000_005
        ),
        CustomMessage(
            custom_type="im_notice", data={"text": "Bob joined", "n": 1}, timestamp=1_764_500_000_006
        ),
    ]


async def test_round_trip_of_every_message_and_block_type(db: Database) -> None:
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY, model="local/qwen2.5")
    assert sid == f"{KEY}#1"
    msgs = every_kind_of_message()
    ids = await repo.append_messages(sid, msgs)  # type: ignore[arg-type]
    assert len(ids) == len(msgs) and ids == sorted(ids)
    ctx = await repo.load_context(sid)
    assert ctx == Context(messages=msgs)  # type: ignore[arg-type]
    # and through a second repository (a re-activated actor) on a new engine
    db2 = Database(str(db.url.render_as_string(hide_password=False)))
    try:
        assert await ContextRepository(db2).load_context(sid) == Context(messages=msgs)  # type: ignore[arg-type]
    finally:
        db2.dispose()
    info = await repo.get_session(sid)
    assert info is not None
    assert (info.session_key, info.platform, info.bot_id, info.scene_id, info.scene_type, info.status) == (
        KEY,
        "onebot11",
        "10001",
        "123456",
        "group",
        "active",
    )
    assert info.model == "local/qwen2.5"
    assert await repo.count_messages(sid) == len(msgs)


async def test_epoch_archive_starts_empty_and_keeps_old_rows(db: Database) -> None:
    repo = ContextRepository(db)
    first = await repo.get_or_create_active(KEY)
    assert await repo.get_or_create_active(KEY) == first
    old = [
        UserMessage(content="remember 42", timestamp=1),
        AssistantMessage(content=[TextContent(text="ok")]),
    ]
    await repo.append_messages(first, old)  # type: ignore[arg-type]

    second = await repo.archive_session(KEY)
    assert second == f"{KEY}#2"
    assert await repo.get_or_create_active(KEY) == second
    assert await repo.load_context(second) == Context()
    assert await repo.load_context(first) == Context(messages=old)  # type: ignore[arg-type]
    sessions = await repo.list_sessions(KEY)
    assert [(s.session_id, s.status) for s in sessions] == [(first, "archived"), (second, "active")]
    assert all(isinstance(s, SessionInfo) for s in sessions)

    third = await repo.archive_session(KEY)
    assert third == f"{KEY}#3"
    assert [s.status for s in await repo.list_sessions(KEY)] == ["archived", "archived", "active"]
    # a turn still running in the archived epoch finishes there
    await repo.append_messages(first, [UserMessage(content="late", timestamp=2)])
    assert [m.content for m in (await repo.load_context(first)).messages if isinstance(m, UserMessage)] == [
        "remember 42",
        "late",
    ]
    assert await repo.load_context(third) == Context()


async def test_concurrent_appends_none_lost_order_stable(db: Database) -> None:
    """1,000 appends to one session from 50 coroutines over two repositories (two engines, as two
    processes would have): every message stored once, each call's messages contiguous, each
    coroutine's calls in its own order, and the load order is the append (row id) order."""
    db2 = Database(db.url.render_as_string(hide_password=False))
    repos = [ContextRepository(db), ContextRepository(db2)]
    sid = await repos[0].get_or_create_active(KEY)
    returned: dict[tuple[int, int], list[int]] = {}

    async def writer(c: int) -> None:
        repo = repos[c % 2]
        for j in range(20):
            batch = [
                UserMessage(content=f"{c}:{j}:q", timestamp=1000 + j),
                AssistantMessage(content=[TextContent(text=f"{c}:{j}:a")], timestamp=1000 + j),
            ]
            returned[(c, j)] = await repo.append_messages(sid, batch)  # type: ignore[arg-type]

    try:
        await asyncio.gather(*(writer(c) for c in range(50)))
        ctx = await repos[1].load_context(sid)
    finally:
        db2.dispose()
    texts = [m.content if isinstance(m, UserMessage) else m.text() for m in ctx.messages]  # type: ignore[union-attr]
    assert len(texts) == 2000
    assert sorted(texts) == sorted(f"{c}:{j}:{k}" for c in range(50) for j in range(20) for k in "qa")
    # each call contiguous, question before answer
    for i in range(0, 2000, 2):
        c, j, k = texts[i].split(":")
        assert (k, texts[i + 1]) == ("q", f"{c}:{j}:a")
    # per-coroutine order kept
    for c in range(50):
        mine = [int(t.split(":")[1]) for t in texts if t.startswith(f"{c}:") and t.endswith(":q")]
        assert mine == list(range(20))
    # load order == row id order, stable on reload
    order = sorted(returned, key=lambda cj: returned[cj][0])
    assert [f"{c}:{j}:q" for c, j in order] == texts[0::2]
    assert all(ids[1] == ids[0] + 1 for ids in returned.values())
    assert await repos[0].load_context(sid) == ctx


async def test_bad_input_is_refused_clearly(db: Database) -> None:
    repo = ContextRepository(db)
    with pytest.raises(UnknownSessionError, match=r"no agent session 'onebot11:10001:group:9#1': call"):
        await repo.append_messages("onebot11:10001:group:9#1", [UserMessage(content="x")])
    with pytest.raises(SessionKeyError, match="malformed session id"):
        await repo.load_context("not a session")
    with pytest.raises(SessionKeyError, match="malformed session key"):
        await repo.get_or_create_active("onebot11:10001:group")
    with pytest.raises(TypeError, match="append_messages takes agent messages, got str"):
        await repo.append_messages(f"{KEY}#1", ["hello"])  # type: ignore[list-item]
    assert await repo.load_context("onebot11:10001:group:9#1") == Context()
    assert await repo.append_messages(await repo.get_or_create_active(KEY), []) == []


async def test_startup_creates_missing_tables_only(db: Database) -> None:
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY)
    await repo.append_messages(sid, [UserMessage(content="kept", timestamp=5)])
    with db.engine.begin() as conn:
        conn.execute(text("CREATE TABLE chat_messages (id INTEGER PRIMARY KEY, content TEXT)"))
        conn.execute(text("INSERT INTO chat_messages (id, content) VALUES (1, 'legacy')"))
        conn.execute(text("DROP TABLE agent_summaries"))
    again = Database(db.url.render_as_string(hide_password=False))
    try:
        again.create_tables()  # recreates the missing table, touches nothing else
        again.create_tables()
        repo2 = ContextRepository(again)
        assert await repo2.load_context(sid) == Context(messages=[UserMessage(content="kept", timestamp=5)])
        with again.engine.connect() as conn:
            assert conn.execute(text("SELECT content FROM chat_messages")).all() == [("legacy",)]
            assert conn.execute(text("SELECT count(*) FROM agent_summaries")).scalar() == 0
    finally:
        again.dispose()


async def test_concurrent_get_or_create_and_archive_across_processes(db: Database) -> None:
    """Two repositories on two engines (as two processes): concurrent activations agree on one
    epoch; two concurrent archives give two new epochs and leave exactly one active."""
    db2 = Database(db.url.render_as_string(hide_password=False))
    repos = [ContextRepository(db), ContextRepository(db2)]
    try:
        ids = await asyncio.gather(*(repos[i % 2].get_or_create_active(KEY) for i in range(10)))
        assert ids == [f"{KEY}#1"] * 10
        new = await asyncio.gather(repos[0].archive_session(KEY), repos[1].archive_session(KEY))
        assert sorted(new) == [f"{KEY}#2", f"{KEY}#3"]
        sessions = await repos[0].list_sessions(KEY)
        assert [(s.session_id, s.status) for s in sessions] == [
            (f"{KEY}#1", "archived"),
            (f"{KEY}#2", "archived"),
            (f"{KEY}#3", "active"),
        ]
        assert await repos[1].get_or_create_active(KEY) == f"{KEY}#3"
    finally:
        db2.dispose()


async def test_open_active_loads_an_epoch_another_process_created_after_its_read(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race open_active must survive: its read finds no active epoch, another process then
    # creates one and writes to it, and open_active's create finds that epoch — it must load
    # that epoch's messages, not answer an empty context (docs/decisions.md#memory-write-path).
    from runtime.memory import repository

    repo = ContextRepository(db)
    other = await ContextRepository(db).get_or_create_active(KEY)
    stored = [UserMessage(content="written by the other process", timestamp=1)]
    await repo.append_messages(other, stored)  # type: ignore[arg-type]
    real, reads = repository.read_active, []

    def first_read_misses(conn: object, key: str) -> object:
        reads.append(key)
        return None if len(reads) == 1 else real(conn, key)  # type: ignore[arg-type]

    monkeypatch.setattr(repository, "read_active", first_read_misses)
    sid, context = await repo.open_active(KEY)
    assert (sid, context) == (other, Context(messages=stored))  # type: ignore[arg-type]
    assert reads == [KEY]  # the epoch was loaded after the create found it, not read as absent


async def test_open_active_reads_a_stored_epoch_and_creates_a_new_one_empty(db: Database) -> None:
    repo = ContextRepository(db)
    new_key = KEY.replace("123456", "654321")
    sid, context = await repo.open_active(new_key, model="p/m")
    assert (sid, context) == (f"{new_key}#1", Context())
    assert (await repo.get_session(sid)).model == "p/m"  # type: ignore[union-attr]
    msgs = [UserMessage(content="hi", timestamp=1), AssistantMessage(content=[TextContent(text="yo")])]
    await repo.append_messages(sid, msgs)  # type: ignore[arg-type]
    assert await repo.open_active(new_key) == (sid, Context(messages=msgs))  # type: ignore[arg-type]

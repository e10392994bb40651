"""A session's calls are attributed to the turn's owner and narrowed by reason (turn, correction,
compaction, sub-agent, probe, image); quotas refuse a turn before it starts and ``/usage`` shows
what is left — real SessionCore, SQLite/PostgreSQL, faux models (docs/decisions.md#spend-ledger,
docs/decisions.md#spend-quotas)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from providers.faux import faux_assistant_message, faux_text, faux_tool_call, register_faux_provider
from providers.openai_images import ImageGenerationOptions, ImageModel, generate_images
from runtime.config.spend import SpendConfig
from runtime.llm.attribution import attributed
from runtime.llm.types import AssistantMessage, Model, ModelCost, Usage
from runtime.memory import ContextRepository, Database
from runtime.reply.probe import probe_tier
from runtime.session.commands import CommandHandler
from runtime.session.core import SessionCore
from runtime.session.features import AgentFeatures
from runtime.session.turn import SessionSetup, TurnInput
from runtime.session.turn_tools import make_subagent_tool
from runtime.spend.ledger import USAGE_TABLE
from runtime.spend.quotas import Quotas
from tests.providers.replay_server import ReplayServer
from tests.providers.replay_server import Reply as HttpReply
from tests.session.recorder import Recorder

KEY = "onebot11:10001:group:5"
USAGE = Usage(input=100, output=20)


def said(text: str, usage: Usage = USAGE) -> AssistantMessage:
    msg = faux_assistant_message([faux_text(text)])
    msg.usage = usage.model_copy()
    return msg


def reply(text: str) -> AssistantMessage:
    return said(json.dumps({"segments": [{"type": "text", "data": {"text": text}}]}))


def turn(seq: int, text: str, user: str = "42", roles: list[str] | None = None) -> TurnInput:
    return TurnInput(
        seq=seq,
        session_key=KEY,
        platform="onebot11",
        bot_id="10001",
        message_id=f"m{seq}",
        scene_type="group",
        scene_id="5",
        sender={"id": user, "name": "U", "roles": roles or []},
        text=text,
        segments=[{"type": "text", "data": {"text": text}}],
        time_ms=1_700_000_000_000 + seq,
    )


async def ledger(db: Database) -> list[tuple[str, str, str, str, str, int]]:
    def read() -> list[Any]:
        c = USAGE_TABLE.c
        q = select(c.reason, c.user_id, c.session_key, c.session_id, c.turn_id, c.input_tokens).order_by(c.id)
        with db.connection() as conn:
            return [tuple(r) for r in conn.execute(q)]

    return await db.run(read)


async def open_core(db: Database, setup: SessionSetup) -> tuple[SessionCore, Recorder]:
    sent = Recorder()
    core = await SessionCore.open(KEY, ContextRepository(db), setup, sent, max_concurrent_turns=1)
    return core, sent


async def test_turn_correction_and_sub_agent_calls_carry_the_turn_owner(db: Database) -> None:
    main = register_faux_provider(
        [
            reply("first answer"),  # turn 1
            said("this is not the reply JSON"),  # turn 2: off the contract ...
            reply("corrected answer"),  # ... so one correction call
            faux_assistant_message([faux_tool_call("delegate", {"task": "sum 1+1"})]),  # turn 3
            said("2"),  # the sub-agent
            reply("it is 2"),
        ],
        provider="spend-s1",
    )
    main.calls.clear()
    model = main.get_model()
    setup = SessionSetup(model=model, tools=[make_subagent_tool(model, [])])
    core, sent = await open_core(db, setup)
    for i, text in enumerate(["hello", "again", "delegate it"], start=1):
        result = await core.submit(turn(i, text, user=str(40 + i)))
        assert result.outcome == "ok", result
    assert sent.texts() == ["first answer", "corrected answer", "it is 2"]
    sid = core.session_id
    rows = await ledger(db)
    assert [(r[0], r[1], r[4]) for r in rows] == [
        ("turn", "41", "m1"),
        ("turn", "42", "m2"),
        ("correction", "42", "m2"),
        ("turn", "43", "m3"),
        ("sub-agent", "43", "m3"),
        ("turn", "43", "m3"),
    ]
    assert {(r[2], r[3]) for r in rows} == {(KEY, sid)}


async def test_compaction_is_attributed_to_the_turn_that_needed_it(db: Database) -> None:
    def answer(context: Any, options: Any) -> AssistantMessage:
        first = context.messages[0].content
        if isinstance(first, str) and first.startswith("Summarize this conversation"):
            return said("summary of the talk")
        return reply(f"answer {len(context.messages)}")

    fx = register_faux_provider(
        default_response=answer,
        provider="spend-s2",
        models=[Model(id="tiny", api="faux", context_window=400)],
    )
    setup = SessionSetup(model=fx.get_model(), compaction_threshold=0.5)
    core, sent = await open_core(db, setup)
    for i in (1, 2):
        assert (await core.submit(turn(i, f"message {i} " + "x" * 500))).outcome == "ok"
    assert len(sent.jobs) == 2
    assert [(r[0], r[1], r[4]) for r in await ledger(db)] == [
        ("turn", "42", "m1"),
        ("compaction", "42", "m2"),
        ("turn", "42", "m2"),
    ]


async def test_probe_and_image_calls_are_narrowed(db: Database) -> None:
    fx = register_faux_provider([said('{"ok": true}')], provider="spend-s3")
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()
    body = {"data": [{"b64_json": png}], "usage": {"input_tokens": 12, "output_tokens": 272}}
    prices = ModelCost(input=5.0, output=40.0)
    with ReplayServer() as server, attributed(bot_id="10001", session_key=KEY, user_id="7", turn_id="m5"):
        await probe_tier(fx.get_model())
        server.enqueue(HttpReply(body=json.dumps(body).encode(), content_type="application/json"))
        model = ImageModel(id="gpt-image-1", provider="oa", base_url=server.base_url + "/v1", cost=prices)
        result = await generate_images(model, "a fox", ImageGenerationOptions(api_key="sk-img-123456"))
    assert result.error_message is None
    assert result.usage.cost.total == (12 * 5.0 + 272 * 40.0) / 1e6
    assert [(r[0], r[1], r[2], r[4], r[5]) for r in await ledger(db)] == [
        ("probe", "7", KEY, "m5", 100),
        ("image", "7", KEY, "m5", 12),
    ]


def quota_features(**spend: Any) -> AgentFeatures:
    return AgentFeatures(quotas=Quotas(SpendConfig.model_validate(spend)), commands=CommandHandler())


async def test_a_used_up_quota_refuses_the_next_turn_before_the_model(
    db: Database, metric: Callable[..., float]
) -> None:
    fx = register_faux_provider(default_response=reply("sure"), provider="spend-s4")
    features = quota_features(
        exceeded_text="Out of budget ({used} of {limit}) until {reset}.",
        quotas=[{"scope": "user", "window": "day", "tokens": 240}],
    )
    core, sent = await open_core(db, SessionSetup(model=fx.get_model(), features=features))
    outcomes = [(await core.submit(turn(i, "hi"))).outcome for i in (1, 2, 3)]
    assert outcomes == ["ok", "ok", "ok"]
    assert fx.call_count == 2  # 120 + 120 = 240 tokens: the third turn never reached the model
    assert sent.texts()[:2] == ["sure", "sure"]
    assert sent.texts()[2].startswith("Out of budget (240 tokens of 240 tokens) until ")
    assert metric("sessionray_quota_exceeded_total", scope="user") == 1
    # another user and a master still get answers
    assert (await core.submit(turn(4, "hi", user="99"))).outcome == "ok"
    assert (await core.submit(turn(5, "hi", roles=["master"]))).outcome == "ok"
    assert fx.call_count == 4
    assert sent.texts()[3:] == ["sure", "sure"]


async def test_a_silent_refusal_sends_nothing(db: Database) -> None:
    fx = register_faux_provider(default_response=reply("sure"), provider="spend-s5")
    features = quota_features(exceeded_text=None, quotas=[{"scope": "chat", "window": "hour", "tokens": 1}])
    core, sent = await open_core(db, SessionSetup(model=fx.get_model(), features=features))
    assert [(await core.submit(turn(i, "hi", user=str(i)))).outcome for i in (1, 2)] == ["ok", "empty"]
    assert sent.texts() == ["sure"] and fx.call_count == 1


async def test_usage_command_shows_what_is_left(db: Database) -> None:
    fx = register_faux_provider(default_response=reply("sure"), provider="spend-s6")
    features = quota_features(
        timezone="Asia/Shanghai",
        quotas=[
            {"scope": "user", "window": "day", "tokens": 1000},
            {"scope": "bot", "window": "month", "usd": 5},
            {"scope": "global", "window": "month", "tokens": 100_000},
        ],
    )
    core, sent = await open_core(db, SessionSetup(model=fx.get_model(), features=features))
    assert (await core.submit(turn(1, "hi"))).outcome == "ok"
    assert (await core.submit(turn(2, "/usage"))).outcome == "ok"
    assert (await core.submit(turn(3, "/usage", roles=["master"]))).outcome == "ok"
    mine, master = sent.texts()[1:]
    lines = mine.split("\n")
    assert lines[0] == "Usage (windows in Asia/Shanghai time):"
    assert lines[1].startswith("- you, this day: 120 tokens and $0.0000; left 880 tokens (resets ")
    assert len(lines) == 2
    lines = master.split("\n")
    assert lines[1].startswith("- you, this day: 120 tokens and $0.0000; left 880 tokens (resets ")
    assert lines[2:4] == [
        "- this chat, this day: 120 tokens and $0.0000",
        "- this chat, this month: 120 tokens and $0.0000",
    ]
    assert lines[4].startswith("- this bot, this month: 120 tokens and $0.0000; left $5.0000 (resets ")
    assert lines[5].startswith("- everyone, this month: 120 tokens and $0.0000; left 99,880 tokens (resets ")
    assert len(lines) == 6
    assert fx.call_count == 1  # /usage never reaches the model


async def test_usage_shows_no_global_line_without_a_global_quota(db: Database) -> None:
    fx = register_faux_provider(default_response=reply("sure"), provider="spend-s7")
    features = quota_features(quotas=[{"scope": "user", "window": "day", "tokens": 1000}])
    core, sent = await open_core(db, SessionSetup(model=fx.get_model(), features=features))
    assert (await core.submit(turn(1, "/usage", roles=["master"]))).outcome == "ok"
    [text] = sent.texts()
    assert not any(line.startswith("- everyone") for line in text.split("\n"))
    assert text.split("\n")[1].startswith("- you, this day: 0 tokens")


async def test_a_user_quota_spans_chats_and_database_handles(db: Database) -> None:
    """Two sessions of one user in two chats, each on its own Database handle of the same SQL (as
    two session hosts would be): the quota sums both, so the third turn is refused wherever it runs."""
    other = Database(str(db.url.render_as_string(hide_password=False)))
    try:
        fx = register_faux_provider(default_response=reply("sure"), provider="spend-s7")
        quotas = [{"scope": "user", "window": "day", "tokens": 240}]
        cores = []
        for key, handle in (("onebot11:10001:group:1", db), ("onebot11:10001:group:2", other)):
            setup = SessionSetup(model=fx.get_model(), features=quota_features(quotas=quotas))
            sent = Recorder()
            core = await SessionCore.open(key, ContextRepository(handle), setup, sent, max_concurrent_turns=1)
            cores.append((core, sent, key))

        def in_chat(i: int, seq: int) -> TurnInput:
            key = cores[i][2]
            return turn(seq, "hi").model_copy(update={"session_key": key, "scene_id": key.rsplit(":", 1)[1]})

        assert (await cores[0][0].submit(in_chat(0, 1))).outcome == "ok"
        assert (await cores[1][0].submit(in_chat(1, 1))).outcome == "ok"
        assert (await cores[0][0].submit(in_chat(0, 2))).outcome == "ok"
        assert fx.call_count == 2
        assert (
            cores[0][1].texts()[-1].startswith("You have used up the user quota for this day (240 tokens).")
        )
    finally:
        other.dispose()


async def test_a_fallback_counts_each_model_called_once(db: Database) -> None:
    main = register_faux_provider(
        [faux_assistant_message([], "error", error_message="HTTP 503: upstream down")], provider="spend-s8"
    )
    backup = register_faux_provider([reply("from the backup")], provider="spend-s9")
    features = AgentFeatures(fallback_models=[backup.get_model()])
    core, sent = await open_core(db, SessionSetup(model=main.get_model(), features=features))
    assert (await core.submit(turn(1, "hi"))).outcome == "ok"
    assert sent.texts() == ["from the backup"]

    def models() -> list[tuple[str, str, int]]:
        c = USAGE_TABLE.c
        with db.connection() as conn:
            return [tuple(r) for r in conn.execute(select(c.model, c.reason, c.input_tokens).order_by(c.id))]

    assert await db.run(models) == [("spend-s8/faux-model", "turn", 0), ("spend-s9/faux-model", "turn", 100)]

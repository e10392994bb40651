"""The pieces of the ``spend`` benchmark (tests/bench/bench_spend.py): the hot-group runtime, the
stand-in's answer that says which questions a call answered, and the open-loop load.

* :class:`Answers` — the ``answer`` hook of :class:`tests.spend.openai_standin.OpenAIStandin`: a
  call answers the last *n* user messages of its request (*n* from the batch note of a coalesced
  turn, docs/decisions.md#session-hot-chat-coalescing; else 1); the answer names their question
  tags (``#q17``) and carries a filler, so the chat's history grows as a real one does. It
  records each call of the hot group (body bytes, the tags it answered).
* :func:`arrival_server` — the platform-API server stamping each group send
  (``time.perf_counter()``) as it arrives.
* :func:`hot_runtime` — a real local Ray runtime (one session host, the real
  ``ConfigSetupFactory``: context budget, coalescing, usage ledger) whose model is the stand-in,
  with the hot group's history seeded in SQL (more than the budget holds).
* :func:`offer` — the open loop: hot-group mentions at ``rate`` per second, each from its own
  sender, plus background mentions in other groups; every message time-stamped when due.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Answers", "HotCall", "Offered", "arrival_server", "hot_runtime", "offer", "seed_history"]

HOT_GROUP = "5000"
BACKGROUND_GROUPS = tuple(str(5001 + i) for i in range(10))
SEED_MARK = "[chatter]"
"""Marks the seeded history of the hot group (a request holding it, or a ``#q`` tag, is the hot
group's)."""
FILLER = (
    "Sure, here is what I found about that; there are a few points worth keeping in mind and "
    "I will go through them one by one so everybody here can follow along. "
) * 3
"""≈ 480 bytes each answer carries, so the hot group's history grows by every turn."""
_BATCH = re.compile(r"the last (\d+) user messages are one batch")
_TAG = re.compile(r"#q(\d+)\b")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


@dataclass
class HotCall:
    """One LLM call of the hot group: when it arrived (perf_counter s), body bytes, tags answered."""

    at: float
    size: int
    tags: list[int]


@dataclass
class Answers:
    """The stand-in's ``answer`` hook (module docstring); thread-safe."""

    calls: list[HotCall] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any], size: int) -> str:
        messages = body.get("messages") or []
        system = " ".join(
            _text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")
        )
        n = int(m.group(1)) if (m := _BATCH.search(system)) else 1
        users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
        tags = [int(t) for u in users[-n:] for t in _TAG.findall(u)]
        blob = json.dumps(messages, ensure_ascii=False)
        if tags or SEED_MARK in blob or "#q" in blob:
            with self._lock:
                self.calls.append(HotCall(time.perf_counter(), size, tags))
        named = " ".join(f"#q{t}" for t in tags) or "your question"
        return f"Answering {named}. {FILLER}"

    def snapshot(self) -> list[HotCall]:
        with self._lock:
            return list(self.calls)


def _arrival_server_class() -> Any:
    from tests.platform_api_server import PlatformApiServer

    class _Arrivals(PlatformApiServer):
        def __init__(self, fixtures_dir: Path) -> None:
            super().__init__(fixtures_dir)
            self.arrivals: list[tuple[float, str, str]] = []
            """``(perf_counter s, group id, text)`` of each group send."""

        def _answer(self, method: str, path: str, raw_headers: dict[str, str], body: bytes) -> Any:
            t = time.perf_counter()
            out = super()._answer(method, path, raw_headers, body)
            doc = self.requests[-1].json
            if path == "/send_group_msg" and isinstance(doc, dict):
                text = "".join(s["data"].get("text", "") for s in doc.get("message", []))
                self.arrivals.append((t, str(doc.get("group_id")), text))
            return out

    return _Arrivals


def arrival_server(fixtures_dir: Path) -> Any:
    """A :class:`tests.platform_api_server.PlatformApiServer` whose ``arrivals`` list holds
    ``(perf_counter s, group id, text)`` of every group send, stamped as it arrived."""
    return _arrival_server_class()(fixtures_dir)


def seed_history(db_url: str, key: str, model: str, messages: int) -> None:
    """Give the hot group ``key`` an active epoch of ``messages`` messages (user chatter and
    answers in turn, ≈ 300 and 480 bytes) through the real ``ContextRepository``."""
    from runtime.llm.types import AssistantMessage, TextContent, UserMessage
    from runtime.memory.db import Database
    from runtime.memory.repository import ContextRepository

    provider, model_id = model.split("/", 1)
    history = [
        UserMessage(
            content=f"{SEED_MARK} message {i}: " + "words " * 48, sender={"id": str(i), "name": f"p{i}"}
        )
        if i % 2 == 0
        else AssistantMessage(content=[TextContent(text=FILLER)], provider=provider, model=model_id)
        for i in range(messages)
    ]

    async def go() -> None:
        db = Database(db_url, threads=1)
        try:
            await asyncio.to_thread(db.create_tables)
            repo = ContextRepository(db)
            sid = await repo.get_or_create_active(key, model=model)
            await repo.append_messages(sid, history)
        finally:
            db.dispose()

    asyncio.run(go())


@contextlib.contextmanager
def hot_runtime(tmp: Path, api_base: str, ai: dict[str, Any], seed: int) -> Iterator[Any]:
    """A started ``SessionRuntime`` (one session host, one delivery actor) on SQLite in ``tmp``
    with the ``ai`` section and the real setup; the hot group's history seeded first."""
    from actors.placement.hosts.setup import ConfigSetupFactory
    from actors.placement.runtime import SessionRuntime
    from runtime.config import BotConfig, Config, DatabaseConfig, RuntimeConfig
    from tests.actors.edge_support import BOT_ID, delivery_pool

    db_url = f"sqlite:///{tmp / 'spend.db'}"
    seed_history(db_url, f"onebot11:{BOT_ID}:group:{HOT_GROUP}", ai["default_model"], seed)
    config = Config(
        bots=[BotConfig(platform="onebot11", self_id=BOT_ID, api_base=api_base)],
        database=DatabaseConfig(url=db_url),
        runtime=RuntimeConfig(min_hosts=1, router_shards=1, delivery_actors=1, idle_ttl_s=3600.0),
        ai=ai,
    )
    with delivery_pool(db_url, api_base) as delivery:
        rt = SessionRuntime(prefix=f"bench-spend-{uuid.uuid4().hex[:6]}")
        asyncio.run(
            rt.start(config, setup_factory=ConfigSetupFactory(config), delivery=delivery, wait_warm=True)
        )
        try:
            yield rt
        finally:
            asyncio.run(rt.stop())


@dataclass
class Offered:
    """What :func:`offer` sent: each hot mention's due time (perf_counter s) by tag, and the
    ``busy`` answers it retried."""

    due: dict[int, float]
    busy: int


async def offer(rt: Any, *, rate: float, seconds: float, background_rate: float, first_tag: int) -> Offered:
    """Open loop for ``seconds``: hot mentions ``#q<first_tag>…`` at ``rate``/s (message ``i`` due
    at ``i / rate`` s, each from sender ``first_tag + i``) and background mentions at
    ``background_rate``/s, each to a random other group (``random.Random(3)``). A ``busy`` answer
    is retried (:func:`tests.actors.session_support.submit_until_accepted`); the wait counts."""
    from tests.actors.session_support import inbound, submit_until_accepted

    rng = random.Random(3)
    plan: list[tuple[float, str, str, int | None]] = []
    for i in range(int(rate * seconds)):
        tag = first_tag + i
        plan.append(
            (i / rate, HOT_GROUP, f"@bot #q{tag} what do you think about point {i}? " + "so " * 40, tag)
        )
    for i in range(int(background_rate * seconds)):
        plan.append(
            (i / background_rate, rng.choice(BACKGROUND_GROUPS), f"@bot background question {i}", None)
        )
    plan.sort(key=lambda p: p[0])
    due: dict[int, float] = {}
    busy = 0
    tasks = []
    t0 = time.perf_counter()

    async def one(group: str, text: str, user: str) -> None:
        nonlocal busy
        busy += await submit_until_accepted(rt, inbound(user, text, group=group), timeout_s=120.0)

    for at, group, text, tag in plan:
        if (wait := t0 + at - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        user = str(900_000 + (tag if tag is not None else rng.randrange(1000)))
        if tag is not None:
            due[tag] = t0 + at
        tasks.append(asyncio.ensure_future(one(group, text, user)))
    await asyncio.gather(*tasks)
    return Offered(due, busy)

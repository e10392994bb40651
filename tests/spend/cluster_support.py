"""The cluster of the spend acceptance tests (tests/spend/test_cluster_limits.py,
tests/spend/test_cluster_ledger.py): a real local Ray runtime with two session hosts whose model is
the loopback OpenAI-compatible stand-in (tests/spend/openai_standin.py), set up through the real
:class:`actors.placement.hosts.setup.ConfigSetupFactory` — so the provider gate, the usage ledger
and the quota check are the ones a session host installs itself.

Each test uses its own provider alias (:func:`own_alias`), so its limits granter actor is its own;
it is killed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
from sqlalchemy import func, select

from actors.limits import limits_actor_name
from actors.limits.granter_actor import NAMESPACE
from actors.placement.hosts.setup import ConfigSetupFactory
from runtime.config import Config, DatabaseConfig
from runtime.memory import Database
from runtime.spend.ledger import USAGE_TABLE
from tests.actors.session_support import Harness, eventually, inbound, running_runtime, submit_until_accepted

__all__ = [
    "CHATS",
    "Totals",
    "ai_section",
    "burst",
    "cluster",
    "group_key",
    "group_sent",
    "host_count",
    "ledger_totals",
    "own_alias",
]

CHATS = 50
"""Sessions of the default cluster: two hosts of ``CHATS // 2`` each."""

Totals = tuple[int, int, int, int, int]
"""``(rows, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens)``."""


def ai_section(
    alias: str, base_url: str, limits: dict[str, Any] | None, *, coalesce_groups: bool = True
) -> dict[str, Any]:
    """The ``ai`` section: the stand-in as provider ``alias`` (model ``m1``, the default), plain
    text replies, no compaction; ``limits``: its ``ai.providers.<alias>.limits`` (``None``: none)."""
    provider: dict[str, Any] = {"api": "openai-completions", "base_url": base_url, "models": [{"id": "m1"}]}
    if limits is not None:
        provider["limits"] = limits
    agent: dict[str, Any] = {"output_schema": False, "compaction_threshold": None}
    if not coalesce_groups:
        agent["coalesce"] = {"groups": False}
    return {"providers": {alias: provider}, "default_model": f"{alias}/m1", "agent": agent}


@contextlib.contextmanager
def cluster(
    tmp_path: Path,
    fixtures_dir: Path,
    ai: dict[str, Any],
    *,
    spend: dict[str, Any] | None = None,
    sessions_per_host: int = CHATS // 2,
) -> Iterator[Harness]:
    """A runtime with two session hosts of ``sessions_per_host`` sessions each (at most ``CHATS``
    live), the ``ai`` section and the ``spend`` section (quotas; ``None``: none), the real setup."""
    db_url = f"sqlite:///{tmp_path / 'sessionray.db'}"
    config = Config(database=DatabaseConfig(url=db_url), ai=ai, **({"spend": spend} if spend else {}))
    knobs: dict[str, Any] = {"min_hosts": 2, "sessions_per_host": sessions_per_host, "idle_ttl_s": 600}
    knobs |= {"max_live_sessions": CHATS, "activation_wait_s": 60.0}
    setup = ConfigSetupFactory(config)
    with running_runtime(tmp_path, fixtures_dir, ai=ai, setup=setup, **knobs) as h:
        yield h


@contextlib.contextmanager
def own_alias() -> Iterator[str]:
    """A fresh provider alias; its granter actor (if one started) is killed at the end."""
    alias = f"standin{uuid.uuid4().hex[:8]}"
    try:
        yield alias
    finally:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(limits_actor_name(alias), namespace=NAMESPACE), no_restart=True)


def burst(h: Harness, users: list[str], timeout_s: float = 240.0) -> dict[str, list[str]]:
    """Every user sends one private message at once; wait until each chat got a reply; the replies."""

    async def run() -> dict[str, list[str]]:
        await asyncio.gather(*(submit_until_accepted(h.rt, inbound(u, f"question from {u}")) for u in users))
        await eventually(lambda: all(h.sent(u) for u in users), timeout_s, "a reply in every chat")
        return {u: h.sent(u) for u in users}

    return asyncio.run(run())


def host_count(h: Harness, users: list[str]) -> int:
    """How many session hosts the private chats of ``users`` live on."""

    async def pids() -> set[int]:
        return set(await asyncio.gather(*(h.host_pid(u) for u in users)))

    return len(asyncio.run(pids()))


def group_key(group: str) -> str:
    """Session key of group ``group`` with the test bot."""
    from tests.actors.edge_support import BOT_ID

    return f"onebot11:{BOT_ID}:group:{group}"


def group_sent(h: Harness, group: str) -> list[str]:
    """Texts the platform API received for group ``group``, in arrival order."""
    out = []
    for r in list(h.api.requests):
        if r.path == "/send_group_msg" and str(r.json.get("group_id")) == group:
            out.append("".join(seg["data"].get("text", "") for seg in r.json["message"]))
    return out


def ledger_totals(db_url: str, user: str | None = None) -> Totals:
    """Sums of the usage ledger's rows (``user``'s only when given), read from SQL."""
    c = USAGE_TABLE.c
    cols = (c.input_tokens, c.output_tokens, c.cache_read_tokens, c.cache_write_tokens)
    q = select(func.count(), *(func.coalesce(func.sum(col), 0) for col in cols))
    if user is not None:
        q = q.where(c.user_id == user)
    db = Database(db_url)
    try:
        with db.connection() as conn:
            row = conn.execute(q).one()
    finally:
        db.dispose()
    return (int(row[0]), int(row[1]), int(row[2]), int(row[3]), int(row[4]))

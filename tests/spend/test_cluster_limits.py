"""Provider limits shared by the cluster, on real local Ray with two session hosts and the loopback
OpenAI-compatible stand-in (docs/decisions.md#spend-provider-limits):

* a burst from 50 chats with ``limits`` set to the stand-in's own limits: the stand-in refuses
  **0** requests across both hosts, and every chat gets the model's answer;
* the same burst without ``limits``: the stand-in refuses some (each host retries its own 429s),
  and every chat still gets exactly one reply — the answer, or the fixed failure text when a
  call ran out of retries (the counts are asserted to add up);
* with a short ``max_wait_s`` and a slow model, a turn that waited too long gets the polite busy
  reply (``ai.agent.busy_text``), the others the answer, and still nothing is refused.

The config goes through the real :class:`actors.placement.hosts.setup.ConfigSetupFactory`, so the
gate is the one the session host installs itself (``actors.limits.install_provider_gate``). Each
test uses its own provider alias, so its granter actor is its own; it is killed at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from actors.limits import limits_actor_name
from actors.limits.granter_actor import NAMESPACE
from actors.placement.hosts.setup import ConfigSetupFactory
from runtime.config import Config, DatabaseConfig
from runtime.session.turn import BUSY_TEXT
from tests.actors.session_support import Harness, eventually, inbound, running_runtime, submit_until_accepted
from tests.spend.openai_standin import OpenAIStandin

pytestmark = pytest.mark.ray

ANSWER = "Here is my answer."
FAILURE = "Sorry, something went wrong while answering. Please try again."
CHATS = 50
STANDIN_LIMITS: dict[str, Any] = {"concurrency": 4, "rpm": 40, "tpm": 12_000}
"""All three bind in the burst: ≈ 330 prompt tokens per call, 50 calls are 16 500 tokens."""


def ai_section(alias: str, base_url: str, limits: dict[str, Any] | None) -> dict[str, Any]:
    provider: dict[str, Any] = {"api": "openai-completions", "base_url": base_url, "models": [{"id": "m1"}]}
    if limits is not None:
        provider["limits"] = limits
    return {
        "providers": {alias: provider},
        "default_model": f"{alias}/m1",
        "agent": {"output_schema": False, "compaction_threshold": None},
    }


@contextlib.contextmanager
def cluster(tmp_path: Path, fixtures_dir: Path, ai: dict[str, Any]) -> Iterator[Harness]:
    """A runtime with two session hosts of 25 sessions each, the configured model, the real setup."""
    db_url = f"sqlite:///{tmp_path / 'sessionray.db'}"
    setup = ConfigSetupFactory(Config(database=DatabaseConfig(url=db_url), ai=ai))
    knobs = {"min_hosts": 2, "sessions_per_host": CHATS // 2, "max_live_sessions": CHATS, "idle_ttl_s": 600}
    with running_runtime(tmp_path, fixtures_dir, ai=ai, setup=setup, activation_wait_s=60.0, **knobs) as h:
        yield h


@contextlib.contextmanager
def own_alias() -> Iterator[str]:
    alias = f"standin{uuid.uuid4().hex[:8]}"
    try:
        yield alias
    finally:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(limits_actor_name(alias), namespace=NAMESPACE), no_restart=True)


def burst(h: Harness, users: list[str], timeout_s: float = 240.0) -> dict[str, list[str]]:
    """Every user sends one message at once; wait until each chat got a reply; the replies."""

    async def run() -> dict[str, list[str]]:
        await asyncio.gather(*(submit_until_accepted(h.rt, inbound(u, f"question from {u}")) for u in users))
        await eventually(lambda: all(h.sent(u) for u in users), timeout_s, "a reply in every chat")
        return {u: h.sent(u) for u in users}

    return asyncio.run(run())


def host_count(h: Harness, users: list[str]) -> int:
    async def pids() -> set[int]:
        return set(await asyncio.gather(*(h.host_pid(u) for u in users)))

    return len(asyncio.run(pids()))


def test_with_the_standins_limits_a_burst_from_50_chats_is_never_refused(
    ray_session: None, tmp_path: Path, fixtures_dir: Path
) -> None:
    users = [f"61{i:04d}" for i in range(CHATS)]
    with own_alias() as alias, OpenAIStandin(**STANDIN_LIMITS, stream_s=0.3, reply=ANSWER) as standin:
        with cluster(tmp_path, fixtures_dir, ai_section(alias, standin.base_url, STANDIN_LIMITS)) as h:
            replies = burst(h, users)
            hosts = host_count(h, users)
        stats = standin.stats()
    assert hosts == 2
    assert replies == {u: [ANSWER] for u in users}
    assert (stats.refused, stats.served) == (0, CHATS)
    assert stats.most_at_once <= STANDIN_LIMITS["concurrency"]


def test_without_limits_the_same_burst_is_refused_by_the_standin(
    ray_session: None, tmp_path: Path, fixtures_dir: Path
) -> None:
    users = [f"62{i:04d}" for i in range(CHATS)]
    with own_alias() as alias, OpenAIStandin(**STANDIN_LIMITS, stream_s=0.3, reply=ANSWER) as standin:
        with cluster(tmp_path, fixtures_dir, ai_section(alias, standin.base_url, None)) as h:
            replies = burst(h, users)
            hosts = host_count(h, users)
        stats = standin.stats()
    assert hosts == 2
    assert stats.refused > 0
    assert all(len(r) == 1 and r[0] in (ANSWER, FAILURE) for r in replies.values()), replies
    answered = sum(r == [ANSWER] for r in replies.values())
    assert answered == stats.served  # one request per answered turn; the others ran out of retries
    assert stats.requests == stats.served + stats.refused


def test_a_turn_waiting_past_max_wait_gets_the_busy_reply(
    ray_session: None, tmp_path: Path, fixtures_dir: Path
) -> None:
    users = [f"63{i:04d}" for i in range(6)]
    limits = {"concurrency": 1, "max_wait_s": 1.0}
    with own_alias() as alias, OpenAIStandin(concurrency=1, stream_s=3.0, reply=ANSWER) as standin:
        with cluster(tmp_path, fixtures_dir, ai_section(alias, standin.base_url, limits)) as h:
            replies = burst(h, users)
        stats = standin.stats()
    assert all(len(r) == 1 and r[0] in (ANSWER, BUSY_TEXT) for r in replies.values()), replies
    busy = sum(r == [BUSY_TEXT] for r in replies.values())
    assert busy >= 1
    assert len(users) - busy == stats.served >= 1
    assert stats.refused == 0

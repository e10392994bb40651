"""Provider limits shared by the cluster, on real local Ray with two session hosts and the loopback
OpenAI-compatible stand-in (docs/decisions.md#spend-provider-limits):

* a burst from 50 chats with ``limits`` set to the stand-in's own limits: the stand-in refuses
  **0** requests across both hosts, and every chat gets the model's answer;
* the same burst without ``limits``: the stand-in refuses some (each host retries its own 429s),
  and every chat still gets exactly one reply — the answer, or the fixed failure text when a
  call ran out of retries (the counts are asserted to add up);
* with a short ``max_wait_s`` and a slow model, a turn that waited too long gets the polite busy
  reply (``ai.agent.busy_text``), the others the answer, and still nothing is refused.

The cluster (tests/spend/cluster_support.py) is set up through the real
:class:`actors.placement.hosts.setup.ConfigSetupFactory`, so the gate is the one the session host
installs itself (``actors.limits.install_provider_gate``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.session.turn import BUSY_TEXT
from tests.spend.cluster_support import CHATS, ai_section, burst, cluster, host_count, own_alias
from tests.spend.openai_standin import OpenAIStandin, Stats

pytestmark = pytest.mark.ray

ANSWER = "Here is my answer."
FAILURE = "Sorry, something went wrong while answering. Please try again."
STANDIN_LIMITS: dict[str, Any] = {"concurrency": 4, "rpm": 40, "tpm": 12_000}
"""All three bind in the burst: ≈ 330 prompt tokens per call, 50 calls are 16 500 tokens."""


def burst_through_standin(
    tmp_path: Path, fixtures_dir: Path, users: list[str], limits: dict[str, Any] | None
) -> tuple[dict[str, list[str]], int, Stats]:
    """One message from each of ``users`` at once through a two-host cluster whose ``ai`` section
    sets ``limits`` (None: none) in front of a stand-in enforcing :data:`STANDIN_LIMITS`: each
    user's replies, the number of hosts the users' sessions landed on, the stand-in's stats."""
    with own_alias() as alias, OpenAIStandin(**STANDIN_LIMITS, stream_s=0.3, reply=ANSWER) as standin:
        with cluster(tmp_path, fixtures_dir, ai_section(alias, standin.base_url, limits)) as h:
            replies = burst(h, users)
            hosts = host_count(h, users)
        return replies, hosts, standin.stats()


def test_with_the_standins_limits_a_burst_from_50_chats_is_never_refused(
    ray_session: None, tmp_path: Path, fixtures_dir: Path
) -> None:
    users = [f"61{i:04d}" for i in range(CHATS)]
    replies, hosts, stats = burst_through_standin(tmp_path, fixtures_dir, users, STANDIN_LIMITS)
    assert hosts == 2
    assert replies == {u: [ANSWER] for u in users}
    assert (stats.refused, stats.served) == (0, CHATS)
    assert stats.most_at_once <= STANDIN_LIMITS["concurrency"]


def test_without_limits_the_same_burst_is_refused_by_the_standin(
    ray_session: None, tmp_path: Path, fixtures_dir: Path
) -> None:
    users = [f"62{i:04d}" for i in range(CHATS)]
    replies, hosts, stats = burst_through_standin(tmp_path, fixtures_dir, users, None)
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

"""The usage ledger and quotas on a cluster: real local Ray, two session hosts, the loopback
OpenAI-compatible stand-in reporting usage (docs/decisions.md#spend-ledger,
docs/decisions.md#spend-quotas):

* after two bursts from 50 chats spread over both hosts, the ledger's token sums equal the usage
  the stand-in reported, exactly, and it has one row per call the stand-in served;
* one user whose group chats live on both hosts crosses a daily token quota in the middle of a
  burst of several users: from then on every turn of that user, on either host, gets the quota
  reply and sends nothing to the model, while the other users in the same groups are still
  answered; a message of that user after the burst reaches no model either.

The cluster is tests/spend/cluster_support.py (the real ``ConfigSetupFactory``: each session host
installs the ledger and checks the quotas itself).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests.actors.session_support import Harness, eventually, inbound, submit_until_accepted
from tests.spend.cluster_support import (
    CHATS,
    ai_section,
    cluster,
    group_key,
    host_count,
    ledger_totals,
    own_alias,
)
from tests.spend.openai_standin import OpenAIStandin

pytestmark = pytest.mark.ray

ANSWER = "Here is my answer, with a few more words."
QUOTA_TEXT = "Quota used up: {scope} per {window}."
REFUSED = "Quota used up: user per day."
SPENDER = "7001"
OTHERS = ("7002", "7003")
GROUPS = ("81", "82", "83", "84")
ROUNDS = 4
QUOTA_TOKENS = 600
"""The spender's daily quota (the others have none). A call costs ≥ 150 tokens here (the
stand-in counts ⌈body bytes / 4⌉: the system prompt alone is ≈ 60), so the spender's four turns of
the first round reach the quota and no later round of theirs can stay under it."""


def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sessionray.db'}"


def quoted_replies(h: Harness) -> dict[str, str]:
    """Group replies by the message id they quote (the OneBot ``reply`` segment) → their text."""
    out: dict[str, str] = {}
    for r in list(h.api.requests):
        if r.path != "/send_group_msg":
            continue
        segs = r.json["message"]
        quoted = next((str(s["data"]["id"]) for s in segs if s["type"] == "reply"), None)
        if quoted is not None:
            out[quoted] = "".join(s["data"].get("text", "") for s in segs)
    return out


def group_round(h: Harness, senders: list[tuple[str, str]], tag: str) -> dict[tuple[str, str], str]:
    """Each ``(user, group)`` sends one message at once; waits for the reply quoting each; the
    replies by ``(user, group)``."""
    ids = {(u, g): f"{tag}-{u}-{g}-{uuid.uuid4().hex[:6]}" for u, g in senders}

    async def run() -> dict[tuple[str, str], str]:
        await asyncio.gather(
            *(
                submit_until_accepted(h.rt, inbound(u, f"{tag}: from {u} " + "x" * 200, mid, group=g))
                for (u, g), mid in ids.items()
            )
        )
        await eventually(lambda: set(ids.values()) <= quoted_replies(h).keys(), 120.0, f"replies of {tag}")
        got = quoted_replies(h)
        return {who: got[mid] for who, mid in ids.items()}

    return asyncio.run(run())


def group_hosts(h: Harness) -> int:
    async def pids() -> set[int]:
        infos = await asyncio.gather(*(h.rt.session(group_key(g)) for g in GROUPS))
        return {int(i.actor["pid"]) for i in infos if i is not None and i.actor is not None}

    return len(asyncio.run(pids()))


def test_the_ledgers_token_sums_equal_the_standins_reported_usage(
    ray_session: None, tmp_path: Path, fixtures_dir: Path
) -> None:
    users = [f"64{i:04d}" for i in range(CHATS)]

    async def two_bursts(h: Harness) -> None:
        for n in (1, 2):  # the second call of each chat carries its history: larger, varied bodies
            msgs = [inbound(u, f"burst {n} from {u}: " + "y" * (7 * i)) for i, u in enumerate(users)]
            await asyncio.gather(*(submit_until_accepted(h.rt, m) for m in msgs))
            await eventually(lambda n=n: all(len(h.sent(u)) == n for u in users), 240.0, f"burst {n}")

    with own_alias() as alias, OpenAIStandin(stream_s=0.2, reply=ANSWER) as standin:
        with cluster(tmp_path, fixtures_dir, ai_section(alias, standin.base_url, None)) as h:
            asyncio.run(two_bursts(h))
            hosts = host_count(h, users)
            replies = {u: h.sent(u) for u in users}
        stats = standin.stats()
    rows, input_tokens, output_tokens, cache_read, cache_write = ledger_totals(db_url(tmp_path))
    assert hosts == 2
    assert replies == {u: [ANSWER, ANSWER] for u in users}
    assert (stats.refused, stats.served) == (0, 2 * CHATS)
    assert rows == stats.served
    assert (input_tokens, output_tokens) == (stats.prompt_tokens, stats.completion_tokens)
    assert (cache_read, cache_write) == (0, 0)
    assert len(set(stats.request_bytes)) > CHATS  # the sums add many different sizes


def test_a_quota_crossed_mid_burst_stops_that_users_turns_on_every_host(
    ray_session: None, tmp_path: Path, fixtures_dir: Path
) -> None:
    spend = {
        "exceeded_text": QUOTA_TEXT,
        "quotas": [{"scope": "user", "window": "day", "id": SPENDER, "tokens": QUOTA_TOKENS}],
    }
    senders = [(u, g) for g in GROUPS for u in (SPENDER, *OTHERS)]
    with own_alias() as alias, OpenAIStandin(stream_s=0.2, reply=ANSWER) as standin:
        ai = ai_section(alias, standin.base_url, None, coalesce_groups=False)
        with cluster(tmp_path, fixtures_dir, ai, spend=spend, sessions_per_host=2) as h:
            rounds = [group_round(h, senders, f"r{n}") for n in range(ROUNDS)]
            hosts = group_hosts(h)
            before = standin.stats()
            after_burst = group_round(h, [(SPENDER, g) for g in GROUPS], "late")
            late = standin.stats()
    spender = [[r[(SPENDER, g)] for r in rounds] for g in GROUPS]
    rows, spent, *_ = ledger_totals(db_url(tmp_path), SPENDER)
    all_rows, input_tokens, output_tokens, *_ = ledger_totals(db_url(tmp_path))
    assert hosts == 2  # the spender's four groups live on both hosts
    # the others are answered in every round, on both hosts
    assert all(r[(u, g)] == ANSWER for r in rounds for u in OTHERS for g in GROUPS), rounds
    # the spender: answers until the quota is crossed, then the quota reply, in every group
    assert all(set(replies) <= {ANSWER, REFUSED} for replies in spender), spender
    assert [replies[-1] for replies in spender] == [REFUSED] * len(GROUPS)
    for replies in spender:  # spend only grows: once refused, refused in every later round
        first = replies.index(REFUSED)
        assert replies[first:] == [REFUSED] * (ROUNDS - first)
    assert ANSWER in [replies[0] for replies in spender]  # crossed during the burst, not before
    answered = sum(replies.count(ANSWER) for replies in spender)
    assert rows == answered and spent >= QUOTA_TOKENS
    # a refused turn sent nothing to the model: one call per answer, every call in the ledger
    assert before.served == all_rows == answered + ROUNDS * len(OTHERS) * len(GROUPS)
    assert before.requests == before.served and before.refused == 0
    assert (input_tokens, output_tokens) == (before.prompt_tokens, before.completion_tokens)
    # after the burst: the quota reply on both hosts, and no request reached the stand-in
    assert after_burst == {(SPENDER, g): REFUSED for g in GROUPS}
    assert late.requests == before.requests

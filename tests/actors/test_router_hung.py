"""A hung session actor on real local Ray (docs/decisions.md#session-crash-recovery): the process
stays alive but its ``turn`` concurrency group stops answering (here: the process is stopped with
SIGSTOP). The router shard pings the ``turn`` group of an actor whose turn is pending longer than
``runtime.hung_turn_s``; no answer within ``runtime.hung_ping_timeout_s`` → the actor is killed and
the crash path re-binds the session and retries the turn once. A slow but healthy turn answers
the ping and is left alone."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.session.turn import INTERRUPTED_TEXT
from tests.actors.session_support import Harness, eventually, inbound, key_of, running_runtime

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    with running_runtime(
        tmp_path_factory.mktemp("hung"), fixtures_dir, warm_pool=1, hung_turn_s=1.0, hung_ping_timeout_s=2.0
    ) as harness:
        yield harness


async def shard(h: Harness) -> dict[str, int]:
    return dict((await h.rt.status())["shards"][0])


async def test_a_slow_but_healthy_turn_answers_the_ping_and_is_not_killed(h: Harness) -> None:
    user = "62000"
    before = await shard(h)
    assert (await h.rt.submit(inbound(user, "slow 4"))).status == "accepted"
    await eventually(lambda: h.sent(user), 120, "the reply")
    assert h.sent(user) == ["tool: slept 4; then: []"]
    after = await shard(h)
    assert (after["hung"], after["retried"], after["errors"]) == (before["hung"], before["retried"], 0)


async def test_a_hung_session_actor_is_killed_and_the_turn_retried_once(h: Harness) -> None:
    user = "62001"
    key = key_of(user)
    before = await shard(h)
    starts = h.tool_starts()
    assert (await h.rt.submit(inbound(user, "slow 60", message_id="hung-1"))).status == "accepted"
    await eventually(lambda: h.tool_starts() == starts + 1, 120, "the slow tool to start")
    info = await h.rt.session(key)
    assert info is not None and info.actor is not None
    victim = info.actor["pid"]
    os.kill(victim, signal.SIGSTOP)  # alive, but no call of either group answers any more
    try:
        await eventually(lambda: h.sent(user), 180, "the reply after the hung actor was killed")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)

    async def settled() -> bool:
        s = await h.rt.session(key)
        return s is not None and s.pending == 0 and s.actor is not None and s.actor["active_turns"] == 0

    await eventually(settled, 120, "the retried entry to finish")
    assert h.sent(user) == [f"tool: {INTERRUPTED_TEXT}; then: []"]  # exactly one platform call
    assert h.tool_starts() == starts + 1  # the executed tool was not run again
    after = await h.rt.session(key)
    assert after is not None and after.actor is not None and after.actor["pid"] != victim
    now = await shard(h)
    assert (now["hung"] - before["hung"], now["retried"] - before["retried"], now["errors"]) == (1, 1, 0)

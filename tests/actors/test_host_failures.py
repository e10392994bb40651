"""Crash safety of session actors on real local Ray (docs/decisions.md#session-crash-recovery):
SIGKILL of a session actor's process in the middle of a turn → the router re-activates the session
on a fresh actor from SQL and retries the interrupted message once; the tool that was running is not
run again (the retried turn sees an "interrupted" result); exactly one reply reaches the platform
API."""

from __future__ import annotations

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
    with running_runtime(tmp_path_factory.mktemp("crash"), fixtures_dir, warm_pool=1) as harness:
        yield harness


async def test_kill_9_mid_turn_delivers_exactly_one_reply(h: Harness) -> None:
    user = "60001"
    key = key_of(user)
    assert (await h.rt.submit(inbound(user, "slow 30", message_id="crash-1"))).status == "accepted"
    await eventually(lambda: h.tool_starts() == 1, 120, "the slow tool to start")
    info = await h.rt.session(key)
    assert info is not None and info.actor is not None
    victim = info.actor["pid"]
    os.kill(victim, signal.SIGKILL)

    await eventually(lambda: h.sent(user), 180, "the reply after the crash")

    async def settled() -> bool:
        s = await h.rt.session(key)
        return s is not None and s.pending == 0 and s.actor is not None and s.actor["active_turns"] == 0

    await eventually(settled, 120, "the retried entry to finish")
    assert h.sent(user) == [f"tool: {INTERRUPTED_TEXT}; then: []"]  # exactly one platform call
    assert h.tool_starts() == 1  # the executed tool was not run again
    after = await h.rt.session(key)
    assert after is not None and after.actor is not None and after.actor["pid"] != victim
    shard = (await h.rt.status())["shards"][0]
    assert (shard["retried"], shard["errors"]) == (1, 0)
    ctx = await h.rt.context(key)
    kinds = [m.get("custom_type", m["role"]) for m in ctx]
    assert kinds == ["im_inbound", "user", "assistant", "toolResult", "assistant", "im_reply"]


async def test_an_idle_session_whose_actor_died_is_reactivated_by_its_next_message(h: Harness) -> None:
    user = "60002"
    key = key_of(user)
    assert (await h.rt.submit(inbound(user, "hello"))).status == "accepted"
    await eventually(lambda: h.sent(user), 120, "the first reply")

    async def idle_pid() -> int | None:
        s = await h.rt.session(key)
        ok = s is not None and s.pending == 0 and s.actor is not None and s.actor["active_turns"] == 0
        return s.actor["pid"] if ok and s is not None and s.actor is not None else None

    victim = await eventually(idle_pid, 120, "the session to be idle")
    os.kill(victim, signal.SIGKILL)
    assert (await h.rt.submit(inbound(user, "echo after the crash"))).status == "accepted"
    await eventually(lambda: len(h.sent(user)) == 2, 180, "the reply after the crash")
    assert h.sent(user) == ["re: hello", "after the crash"]
    ctx = await h.rt.context(key)
    assert [m["content"] for m in ctx if m["role"] == "user"] == ["hello", "echo after the crash"]

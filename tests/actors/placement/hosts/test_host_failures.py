"""Crash safety of session hosts on real local Ray (docs/decisions.md#session-crash-recovery), in
both host modes (the idle-session and slow-turn cases in packed mode only, to bound the suite's
time):

* SIGKILL of a host's process in the middle of a turn → the ingress's watcher of the turn sees the
  host die, the session is re-activated on another host from SQL and the interrupted message sent
  once more (``attempt=1``); the tool that was running is not run again (the retried turn sees an
  "interrupted" result); exactly one reply reaches the platform API;
* an idle session whose host died is re-activated by its next message;
* a *hung* host (alive, but its sessions' loop stops answering: here the process is stopped with
  SIGSTOP) is killed by the host supervisor, whose probes (``status``, and ``ping_turn`` every
  ``TURN_PROBE_S``) wait at most ``runtime.hung_ping_timeout_s``; then the crash path above runs.
  A slow but healthy turn answers the probes and is left alone."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.session.turn import INTERRUPTED_TEXT
from tests.actors.session_support import MODES, Harness, eventually, inbound, key_of, running_runtime

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", params=list(MODES))
def h(
    request: pytest.FixtureRequest,
    ray_session: None,
    tmp_path_factory: pytest.TempPathFactory,
    fixtures_dir: Path,
) -> Iterator[Harness]:
    with running_runtime(
        tmp_path_factory.mktemp(f"failures-{request.param}"),
        fixtures_dir,
        hung_ping_timeout_s=2.0,
        **MODES[request.param],
    ) as harness:
        yield harness


async def settled(h: Harness, key: str) -> bool:
    s = await h.rt.session(key)
    return s is not None and s.pending == 0 and s.actor is not None and s.actor["active_turns"] == 0


async def killed(h: Harness) -> int:
    """Hosts the supervisor removed so far (found dead or hung)."""
    sup = await h.rt.hosts.status.remote()
    return int(sup["replaced"] + sup["hung"])


async def test_kill_9_mid_turn_delivers_exactly_one_reply(h: Harness) -> None:
    user = "60001"
    key = key_of(user)
    before = dict((await h.rt.status())["submit"])
    starts = h.tool_starts()
    assert (await h.rt.submit(inbound(user, "slow 30", message_id="crash-1"))).status == "accepted"
    await eventually(lambda: h.tool_starts() == starts + 1, 120, "the slow tool to start")
    victim = await h.host_pid(user)
    os.kill(victim, signal.SIGKILL)

    await eventually(lambda: h.sent(user), 180, "the reply after the crash")
    await eventually(lambda: settled(h, key), 120, "the retried message to finish")
    assert h.sent(user) == [f"tool: {INTERRUPTED_TEXT}; then: []"]  # exactly one platform call
    assert h.tool_starts() == starts + 1  # the executed tool was not run again
    assert await h.host_pid(user) != victim
    now = (await h.rt.status())["submit"]
    assert (now["retried"] - before["retried"], now["lost"], now["errors"]) == (1, 0, 0)
    ctx = await h.rt.context(key)
    kinds = [m.get("custom_type", m["role"]) for m in ctx]
    assert kinds == ["im_inbound", "user", "assistant", "toolResult", "assistant", "im_reply"]


@pytest.mark.parametrize("h", ["packed"], indirect=True)
async def test_an_idle_session_whose_host_died_is_reactivated_by_its_next_message(h: Harness) -> None:
    user = "60002"
    key = key_of(user)
    assert (await h.rt.submit(inbound(user, "hello"))).status == "accepted"
    await eventually(lambda: h.sent(user), 120, "the first reply")
    await eventually(lambda: settled(h, key), 120, "the session to be idle")
    victim = await h.host_pid(user)
    os.kill(victim, signal.SIGKILL)
    assert (await h.rt.submit(inbound(user, "echo after the crash"))).status == "accepted"
    await eventually(lambda: len(h.sent(user)) == 2, 180, "the reply after the crash")
    assert h.sent(user) == ["re: hello", "after the crash"]
    ctx = await h.rt.context(key)
    assert [m["content"] for m in ctx if m["role"] == "user"] == ["hello", "echo after the crash"]
    assert await h.host_pid(user) != victim


@pytest.mark.parametrize("h", ["packed"], indirect=True)
async def test_a_slow_but_healthy_turn_answers_the_probes_and_is_not_killed(h: Harness) -> None:
    user = "62000"
    before_killed, before = await killed(h), dict((await h.rt.status())["submit"])
    # longer than the supervisor's turn-group probe period: at least one probe runs meanwhile
    assert (await h.rt.submit(inbound(user, "slow 6"))).status == "accepted"
    await eventually(lambda: h.sent(user), 120, "the reply")
    assert h.sent(user) == ["tool: slept 6; then: []"]
    now = (await h.rt.status())["submit"]
    assert (await killed(h), now["retried"], now["lost"]) == (before_killed, before["retried"], 0)


async def test_a_hung_host_is_killed_and_the_turn_retried_once(h: Harness) -> None:
    user = "62001"
    key = key_of(user)
    before_killed, before = await killed(h), dict((await h.rt.status())["submit"])
    starts = h.tool_starts()
    assert (await h.rt.submit(inbound(user, "slow 60", message_id="hung-1"))).status == "accepted"
    await eventually(lambda: h.tool_starts() == starts + 1, 120, "the slow tool to start")
    victim = await h.host_pid(user)
    os.kill(victim, signal.SIGSTOP)  # alive, but no call of either group answers any more
    try:
        await eventually(lambda: h.sent(user), 180, "the reply after the hung host was killed")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    await eventually(lambda: settled(h, key), 120, "the retried message to finish")
    assert h.sent(user) == [f"tool: {INTERRUPTED_TEXT}; then: []"]  # exactly one platform call
    assert h.tool_starts() == starts + 1  # the executed tool was not run again
    assert await h.host_pid(user) != victim
    now = (await h.rt.status())["submit"]
    assert (await killed(h) - before_killed, now["retried"] - before["retried"], now["lost"]) == (1, 1, 0)

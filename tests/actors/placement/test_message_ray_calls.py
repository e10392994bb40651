"""What one message costs in Ray actor calls, counted on a real local Ray run: the figure
docs/architecture.md quotes (``RAY_CALLS_PER_MESSAGE``; tests/docs checks the quote).

A session is made live and cached by a first message; the second message of the same chat is
counted in this process (the ingress) and in the session host's process
(:mod:`tests.actors.ray_calls`) from its submit until its reply reached the platform stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.placement.submit import RAY_CALLS_PER_MESSAGE
from tests.actors.ray_calls import CountingSetup, count_calls, host_calls
from tests.actors.session_support import Harness, eventually, inbound, running_runtime, submit_until_accepted

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def h(ray_session: None, tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Harness]:
    tmp = tmp_path_factory.mktemp("ray-calls")
    with running_runtime(tmp, fixtures_dir, setup=CountingSetup(str(tmp / "markers"))) as harness:
        yield harness


async def test_a_message_to_a_live_cached_session_costs_the_documented_ray_calls(h: Harness) -> None:
    user = "70001"
    await submit_until_accepted(h.rt, inbound(user, "hello"))  # places the session, caches its host
    await eventually(lambda: h.sent(user) == ["re: hello"], 120, "the first reply")
    await eventually(lambda: "DeliveryActor.notify" in host_calls(h.markers), 60, "the first notify")
    before = len(host_calls(h.markers))

    ingress: list[str] = []
    undo = count_calls(ingress.append)
    try:
        assert (await h.rt.submit(inbound(user, "again"))).status == "accepted"
        await eventually(lambda: h.sent(user) == ["re: hello", "re: again"], 120, "the second reply")
        await eventually(lambda: len(host_calls(h.markers)) > before, 60, "the host's calls")
    finally:
        undo()
    host = host_calls(h.markers)[before:]

    assert ingress == ["SessionHost.submit"]  # cache hit: no router shard call
    assert host == ["DeliveryActor.notify"]  # the hand-over's notice; the turn does not wait for it
    assert len(ingress) + len(host) == RAY_CALLS_PER_MESSAGE

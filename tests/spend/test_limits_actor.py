"""The cluster-wide granter actor and the gate session hosts put in front of it, on real local Ray
(docs/decisions.md#spend-provider-limits):

* two gates (as two hosts) share one actor: while one holds the only slot, the other waits in
  the actor's queue, and gets the slot when it is released;
* a call that gives up (its turn was aborted) leaves the queue;
* when the actor dies, a call does not hang: it is granted by the process's own granter (a
  ``local:`` lease, with a log line), and after the fallback period the actor is resolved by name
  again (a new one is created); an actor that hangs is given up after ``max_wait_s`` + the grace;
* a restarted serve's limits reach an actor left by an earlier one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterator

import pytest
import ray

import actors.limits.cluster_gate as cluster_gate
from actors.limits import ClusterProviderGate, limits_actor_name
from actors.limits.granter_actor import NAMESPACE
from runtime.config import ProviderConfig
from runtime.llm.attribution import CallAttribution
from tests.actors.session_support import eventually

pytestmark = pytest.mark.ray


@pytest.fixture
def alias(ray_session: None) -> Iterator[str]:
    name = f"gate{uuid.uuid4().hex[:8]}"
    yield name
    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(limits_actor_name(name), namespace=NAMESPACE), no_restart=True)


def providers(alias: str, **limits: object) -> dict[str, ProviderConfig]:
    return {alias: ProviderConfig(api="openai-completions", base_url="http://127.0.0.1:9", limits=limits)}


def actor_of(alias: str) -> ray.actor.ActorHandle:
    return ray.get_actor(limits_actor_name(alias), namespace=NAMESPACE)


async def _is_dead(handle: ray.actor.ActorHandle) -> bool:
    try:
        await handle.status.remote()
    except ray.exceptions.RayActorError:
        return True
    return False


async def test_two_gates_share_one_actor_and_its_slots(alias: str) -> None:
    host_a = ClusterProviderGate(providers(alias, concurrency=1))
    host_b = ClusterProviderGate(providers(alias, concurrency=1))
    lease_a = await host_a.acquire(alias, CallAttribution(session_key="chat-a"), 10)
    waiting = asyncio.ensure_future(host_b.acquire(alias, CallAttribution(session_key="chat-b"), 10))

    async def queued() -> bool:
        return (await actor_of(alias).status.remote())["depth"] == 1

    await eventually(queued, 60, "host b's call queued in the actor")
    assert not waiting.done()
    await host_a.release(lease_a, 12, 200, None)
    lease_b = await asyncio.wait_for(waiting, 60)
    assert not lease_b.lease_id.startswith(cluster_gate.LOCAL_PREFIX)
    await host_b.release(lease_b, 12, 200, None)
    assert await actor_of(alias).status.remote() == {"depth": 0, "in_flight": 0, "factor": 1.0}


async def test_a_call_that_gives_up_leaves_the_actors_queue(alias: str) -> None:
    gate = ClusterProviderGate(providers(alias, concurrency=1))
    held = await gate.acquire(alias, None, 1)
    waiting = asyncio.ensure_future(gate.acquire(alias, None, 1))

    async def depth_is(n: int) -> bool:
        return bool((await actor_of(alias).status.remote())["depth"] == n)

    await eventually(lambda: depth_is(1), 60, "the second call queued")
    waiting.cancel()
    await eventually(lambda: depth_is(0), 60, "the abandoned call gone from the queue")
    await gate.release(held, None, 200, None)
    assert (await actor_of(alias).status.remote())["in_flight"] == 0


async def test_a_dead_actor_falls_back_to_the_local_granter_then_is_resolved_again(
    alias: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gate = ClusterProviderGate(providers(alias, concurrency=2, max_wait_s=30))
    first = await gate.acquire(alias, None, 1)
    await gate.release(first, 1, 200, None)
    killed = actor_of(alias)
    ray.kill(killed, no_restart=True)  # asynchronous: wait until the actor no longer answers
    await eventually(lambda: _is_dead(killed), 60, "the killed granter gone")
    with caplog.at_level(logging.WARNING, logger=cluster_gate.__name__):
        fallback = await asyncio.wait_for(gate.acquire(alias, None, 1), 60)
    assert fallback.lease_id.startswith(cluster_gate.LOCAL_PREFIX)
    assert "the granter actor did not answer" in caplog.text
    await gate.release(fallback, 1, 200, None)
    assert (await asyncio.wait_for(gate.acquire(alias, None, 1), 60)).lease_id.startswith("local:")
    monkeypatch.setattr(gate, "_local_until", {})  # the fallback period is over
    again = await asyncio.wait_for(gate.acquire(alias, None, 1), 60)
    assert not again.lease_id.startswith(cluster_gate.LOCAL_PREFIX)  # a new actor, found by name
    await gate.release(again, 1, 200, None)


async def test_a_later_serves_limits_reach_the_running_actor(alias: str) -> None:
    old = ClusterProviderGate(providers(alias, concurrency=1))
    lease = await old.acquire(alias, None, 1)
    await old.release(lease, 1, 200, None)
    new = ClusterProviderGate(providers(alias, concurrency=2))
    a = await new.acquire(alias, None, 1)
    b = await asyncio.wait_for(new.acquire(alias, None, 1), 60)  # two slots now, no wait
    assert (await actor_of(alias).status.remote())["in_flight"] == 2
    await new.release(a, 1, 200, None)
    await new.release(b, 1, 200, None)


@ray.remote(num_cpus=0)
class _HungGranter:
    """Stands in for a granter actor that accepts calls and never answers them."""

    async def configure(self, limits: dict[str, object]) -> None:
        return None

    async def acquire(self, *args: object) -> None:
        await asyncio.Event().wait()

    async def abandon(self, *args: object) -> None:
        return None


async def test_a_hung_actor_times_out_into_the_local_granter(
    alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    hung = _HungGranter.options(name=limits_actor_name(alias), namespace=NAMESPACE).remote()  # type: ignore[attr-defined]
    await hung.configure.remote({})
    monkeypatch.setattr(cluster_gate, "ACTOR_GRACE_S", 0.5)
    gate = ClusterProviderGate(providers(alias, concurrency=1, max_wait_s=0.5))
    lease = await asyncio.wait_for(gate.acquire(alias, None, 1), 60)  # bounded: never hangs
    assert lease.lease_id.startswith(cluster_gate.LOCAL_PREFIX)
    await gate.release(lease, 1, 200, None)

"""kill -9 of the cluster's granter actor while a lease is held, on real local Ray
(docs/decisions.md#spend-limits-actor-dies): the holder's release neither raises nor hangs, and
the slot comes back — the next call is granted (by the process's own granter, or a new actor)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import Iterator

import pytest
import ray

from actors.limits import ClusterProviderGate, limits_actor_name
from actors.limits.granter_actor import NAMESPACE
from runtime.config import ProviderConfig
from runtime.llm.attribution import CallAttribution

pytestmark = pytest.mark.ray


@pytest.fixture
def alias(ray_session: None) -> Iterator[str]:
    name = f"kill{uuid.uuid4().hex[:8]}"
    yield name
    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(limits_actor_name(name), namespace=NAMESPACE), no_restart=True)


async def test_kill_9_of_the_granter_while_a_lease_is_held_gives_the_slot_back(alias: str) -> None:
    gate = ClusterProviderGate(
        {
            alias: ProviderConfig(
                api="openai-completions", base_url="http://127.0.0.1:9", limits={"concurrency": 1}
            )
        }
    )
    held = await gate.acquire(alias, CallAttribution(session_key="chat-a"), 10)
    actor = ray.get_actor(limits_actor_name(alias), namespace=NAMESPACE)
    pid = await actor.__ray_call__.remote(lambda self: os.getpid())
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)  # the actor's worker process, started by this test's Ray
    await asyncio.wait_for(gate.release(held, 12, 200, None), 60)  # never raises, never hangs
    again = await asyncio.wait_for(gate.acquire(alias, CallAttribution(session_key="chat-b"), 10), 90)
    await asyncio.wait_for(gate.release(again, 12, 200, None), 60)

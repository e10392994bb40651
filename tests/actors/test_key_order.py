"""Admission bookkeeping of a router shard (actors/admission.py), driven directly on one event loop:
FIFO grants of live-session slots, no lost wake-up, no queue jumping, a grant that reaches a
waiter who left is passed on, and per-key tickets in arrival order.

The last test drives the router class itself (``RouterActor.__ray_metadata__.modified_class``) on
the test's event loop with its two Ray handles — the warm pool and a session actor — replaced by
scripted objects with the same ``.remote`` methods, so the test decides exactly when a passivation
answers and what. The real actors are exercised in test_router_churn.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from actors.admission import Grant, KeyOrder, SlotQueue, should_recycle
from actors.router import RouterActor
from runtime.config import RuntimeConfig
from runtime.session.turn import TurnInput, TurnResult
from tests.actors.session_support import inbound, key_of


async def spin() -> None:
    """Let every ready callback and task of the loop run (no I/O, no timers involved)."""
    for _ in range(10):
        await asyncio.sleep(0)


class Shard:
    """Stands in for the router's directory: ``held`` slots plus what went back to the pool."""

    def __init__(self, cap: int, held: int) -> None:
        self.held = held
        self.returned: list[object] = []
        self.slots = SlotQueue(cap, lambda: self.held, self.returned.append)

    def bind(self, grant: Grant | None) -> None:
        """What the router does with a grant: a new directory entry, at once."""
        assert grant is not None
        self.held += 1
        self.slots.consume(grant)

    def free_one(self, actor: object = None) -> bool:
        """A session left the directory (passivated); its slot (and blank actor) is offered."""
        self.held -= 1
        return self.slots.offer(actor)


async def test_a_free_slot_is_taken_at_once_and_a_full_shard_queues() -> None:
    shard = Shard(cap=2, held=1)
    grant = shard.slots.try_take()
    assert grant == Grant(actor=None)
    shard.bind(grant)
    assert (shard.slots.try_take(), shard.slots.free(), shard.slots.reserved) == (None, 0, 0)


async def test_waiters_get_freed_slots_oldest_first_and_the_first_gets_the_handed_over_actor() -> None:
    shard = Shard(cap=1, held=1)
    waiters = [asyncio.ensure_future(shard.slots.wait(30.0)) for _ in range(3)]
    await spin()
    assert shard.slots.waiting == 3

    assert shard.free_one(actor="blank-actor-1") is True  # taken with the slot: no pool round trip
    await spin()
    assert [w.done() for w in waiters] == [True, False, False]
    assert waiters[0].result() == Grant(actor="blank-actor-1")
    # the granted slot is reserved: a newcomer cannot take it before the waiter binds
    assert (shard.slots.reserved, shard.slots.try_take()) == (1, None)
    shard.bind(waiters[0].result())

    shard.free_one()
    await spin()
    assert [w.done() for w in waiters] == [True, True, False]
    assert waiters[1].result() == Grant(actor=None)
    shard.bind(waiters[1].result())
    shard.free_one()
    shard.bind(await waiters[2])
    assert (shard.slots.waiting, shard.slots.reserved, shard.held, shard.returned) == (0, 0, 1, [])


async def test_a_newcomer_queues_behind_a_waiter_even_when_it_arrives_first_after_a_free() -> None:
    shard = Shard(cap=1, held=1)
    old = asyncio.ensure_future(shard.slots.wait(30.0))
    await spin()
    shard.held -= 1  # the slot frees, the offer has not run yet
    assert shard.slots.try_take() is None  # FIFO: somebody waits already
    shard.slots.offer()
    assert await old == Grant(actor=None)


async def test_a_slot_freed_while_nobody_waits_is_usable_at_once() -> None:
    shard = Shard(cap=1, held=1)
    assert shard.free_one(actor="blank") is False  # nobody took the actor: the caller returns it
    assert shard.slots.try_take() == Grant(actor=None)


async def test_a_waiter_times_out_with_none_and_leaves_the_queue() -> None:
    shard = Shard(cap=1, held=1)
    assert await shard.slots.wait(0.0) is None
    assert (shard.slots.waiting, shard.slots.reserved) == (0, 0)
    shard.free_one()
    assert shard.slots.try_take() == Grant(actor=None)


async def test_a_grant_reaching_a_cancelled_waiter_goes_to_the_next_one_or_back_to_the_pool() -> None:
    shard = Shard(cap=1, held=1)
    first = asyncio.ensure_future(shard.slots.wait(30.0))
    second = asyncio.ensure_future(shard.slots.wait(30.0))
    await spin()
    shard.free_one(actor="blank-a")  # granted to ``first``, which is cancelled before it runs
    first.cancel()
    assert await second == Grant(actor="blank-a")
    assert (shard.slots.waiting, shard.slots.reserved, shard.returned) == (0, 1, [])
    shard.bind(second.result())

    third = asyncio.ensure_future(shard.slots.wait(30.0))
    await spin()
    shard.free_one(actor="blank-b")
    third.cancel()
    await asyncio.gather(third, return_exceptions=True)
    # nobody else waits: the slot is free again and the blank actor goes back to the pool
    slots = shard.slots
    assert (slots.waiting, slots.reserved, slots.free(), shard.returned) == (0, 0, 1, ["blank-b"])


async def test_tickets_of_one_key_run_in_arrival_order_while_other_keys_pass() -> None:
    order = KeyOrder()
    ran: list[str] = []
    gate = asyncio.Event()

    async def submit(key: str, name: str, hold: bool = False) -> None:
        async with order.turn(key):  # ticket taken at the call, before any await
            if hold:
                await gate.wait()  # the first message of the key waits for a slot
            ran.append(name)

    first = asyncio.ensure_future(submit("a", "a1", hold=True))
    later = [asyncio.ensure_future(submit("a", f"a{i}")) for i in (2, 3)]
    other = asyncio.ensure_future(submit("b", "b1"))
    await other
    assert ran == ["b1"]  # another key is not held up
    gate.set()
    await asyncio.gather(first, *later)
    assert ran == ["b1", "a1", "a2", "a3"]
    assert (order.waiting("a"), order.waiting("b")) == (False, False)


async def test_a_ticket_cancelled_while_waiting_keeps_the_order_of_the_others() -> None:
    order = KeyOrder()
    ran: list[str] = []
    gate = asyncio.Event()

    async def submit(name: str, hold: bool = False) -> None:
        async with order.turn("k"):
            if hold:
                await gate.wait()
            ran.append(name)

    t1 = asyncio.ensure_future(submit("m1", hold=True))
    t2 = asyncio.ensure_future(submit("m2"))
    t3 = asyncio.ensure_future(submit("m3"))
    await spin()
    t2.cancel()
    await spin()
    assert ran == []  # m3 still waits for m1
    gate.set()
    await asyncio.gather(t1, t3)
    assert (ran, t2.cancelled(), order.waiting("k")) == (["m1", "m3"], True, False)


def test_should_recycle_follows_the_pool_rule() -> None:
    assert [
        should_recycle(served, uss, after_sessions=100, memory_mib=512.0)
        for served, uss in ((99, 512.0), (100, 10.0), (5, 512.5))
    ] == [False, True, True]


# --------------------------------------------------------------------------- the router class itself


class Call:
    """One method of a Ray actor handle: ``.remote(*args)`` starts ``fn`` and returns its future."""

    def __init__(self, fn: Callable[..., Awaitable[Any]]) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        return asyncio.ensure_future(self._fn(*args))


class ScriptedSessionActor:
    """A session actor's router-facing methods; ``passivate`` answers come from ``answers`` (a
    future each, resolved by the test), every call is logged."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.answers: list[asyncio.Future[dict[str, Any]]] = []
        self.activate, self.submit = Call(self._activate), Call(self._submit)
        self.passivate = Call(self._passivate)

    async def _activate(self, key: str, next_seq: int) -> dict[str, Any]:
        self.log.append(("activate", key, next_seq))
        return {"session_id": f"{key}#1"}

    async def _submit(self, turn: TurnInput) -> TurnResult:
        self.log.append(("submit", turn.session_key, turn.seq))
        return TurnResult(seq=turn.seq, message_id=turn.message_id, outcome="ok")

    async def _passivate(self, force: bool) -> dict[str, Any]:
        self.log.append(("passivate", force))
        return await self.answers.pop(0)


class OneActorPool:
    """The warm pool with one blank actor (a second ``acquire`` would fail the test)."""

    def __init__(self, actor: ScriptedSessionActor) -> None:
        self.actor: ScriptedSessionActor | None = actor
        self.released: list[tuple[Any, ...]] = []
        self.acquire, self.release = Call(self._acquire), Call(self._release)
        self.report_dead = Call(self._dead)

    async def _acquire(self) -> tuple[ScriptedSessionActor, str]:
        actor, self.actor = self.actor, None
        assert actor is not None, "the router asked the pool for a second actor"
        return actor, "warm"

    async def _release(self, *args: Any) -> None:
        self.released.append(args)

    async def _dead(self, actor: Any) -> None:
        raise AssertionError("no actor died in this test")


async def test_a_refused_admin_passivation_does_not_strand_a_waiting_new_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review S3 #1 (lost wake-up): cap 1, session A idle, an admin passivation of A in flight
    when B arrives (B's victim search skips A: it is passivating), then A's actor refuses once (a
    control turn still ran). B must get A's slot — and A's actor — once A can be passivated,
    not ``busy`` at its deadline."""
    monkeypatch.setattr("actors.ray_metrics.install_ray_metrics", lambda: None)
    monkeypatch.setattr("actors.router.REFUSED_RETRY_S", 0.01)
    config = SimpleNamespace(runtime=RuntimeConfig(max_live_sessions=1, activation_wait_s=5.0))
    router = RouterActor.__ray_metadata__.modified_class(config, 0, 1, "stand-in-pool")  # type: ignore[attr-defined]
    actor = ScriptedSessionActor()
    router._pool = OneActorPool(actor)
    try:
        assert await router.submit(inbound("70000", "hi", "a1")) == {
            "status": "accepted",
            "retry_after_s": None,
            "seq": 1,
        }
        await spin()
        a, b = key_of("70000"), key_of("70001")
        loop = asyncio.get_running_loop()
        refusal, consent = loop.create_future(), loop.create_future()
        actor.answers += [refusal, consent]
        admin = asyncio.ensure_future(router.passivate(a))
        await spin()
        new = asyncio.ensure_future(router.submit(inbound("70001", "hello", "b1")))
        await spin()
        assert (router._slots.waiting, new.done()) == (1, False)  # B queues; A is passivating

        refusal.set_result({"ok": False})  # A's actor refuses once
        assert await admin is False
        consent.set_result({"ok": True, "sessions_served": 1, "uss_mib": 100.0})
        assert await new == {"status": "accepted", "retry_after_s": None, "seq": 1}
        await asyncio.gather(*list(router._tasks))  # B's turn dispatched and finished
        assert actor.log == [
            ("activate", a, 1),
            ("submit", a, 1),
            ("passivate", False),
            ("passivate", False),
            ("activate", b, 1),  # A's blank actor, handed over with the slot
            ("submit", b, 1),
        ]
        assert [s["session_key"] for s in await router.sessions()] == [b]
        counts = router.counts
        assert (counts["passivated_lru"], counts["handoffs"], counts["busy"]) == (1, 1, 0)
        assert router._pool.released == []
    finally:
        await router.shutdown()

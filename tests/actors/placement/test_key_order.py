"""Per-key ordering (actors/placement/admission.py ``KeyOrder``), driven directly on one event loop: tickets
of one key pass in arrival order while other keys pass freely, and a ticket cancelled while it
waits keeps the order of the others (docs/decisions.md#session-ordered-inbox). Each ingress
process's ``SubmitPath`` and each router shard own one; end to end it is checked in
test_session_runtime.py and test_host_lifecycle.py (seqs in arrival order)."""

from __future__ import annotations

import asyncio

from actors.placement.admission import KeyOrder


async def spin() -> None:
    """Let every ready callback and task of the loop run (no I/O, no timers involved)."""
    for _ in range(10):
        await asyncio.sleep(0)


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

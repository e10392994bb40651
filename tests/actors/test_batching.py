"""actors/batching.py: natural batching (no Ray needed: the flush is a local coroutine)."""

from __future__ import annotations

import asyncio

import pytest

from actors.batching import Batcher


class Recorder:
    """A flush that records its batches and answers ``item * 10``; ``gate`` holds it open."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_on: int | None = None

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        await self.gate.wait()
        if self.fail_on is not None and self.fail_on in items:
            raise ConnectionError(f"shard down at {self.fail_on}")
        return [i * 10 for i in items]


async def test_an_item_alone_is_flushed_at_once() -> None:
    rec = Recorder()
    b = Batcher(rec)
    assert await b.submit(1) == 10
    assert await b.submit(2) == 20
    assert rec.batches == [[1], [2]]
    assert b.flushes == 2


async def test_items_arriving_during_a_flush_go_together_in_order() -> None:
    rec = Recorder()
    rec.gate.clear()
    b = Batcher(rec, max_batch=3)
    first = asyncio.create_task(b.submit(0))
    await asyncio.sleep(0)
    assert rec.batches == [[0]]  # in flight, alone
    rest = [asyncio.create_task(b.submit(i)) for i in range(1, 6)]
    await asyncio.sleep(0)
    rec.gate.set()
    assert await first == 0
    assert [await t for t in rest] == [10, 20, 30, 40, 50]
    assert rec.batches == [[0], [1, 2, 3], [4, 5]]


async def test_a_failed_batch_fails_only_its_items() -> None:
    rec = Recorder()
    rec.gate.clear()
    b = Batcher(rec, max_batch=2)
    first = asyncio.create_task(b.submit(0))
    await asyncio.sleep(0)
    rec.fail_on = 1
    queued = [asyncio.create_task(b.submit(i)) for i in (1, 2, 3)]
    await asyncio.sleep(0)
    rec.gate.set()
    assert await first == 0
    for t in queued[:2]:
        with pytest.raises(ConnectionError, match="shard down at 1"):
            await t
    assert await queued[2] == 30
    assert rec.batches == [[0], [1, 2], [3]]
    assert await b.submit(4) == 40  # not stuck busy after a failure


async def test_a_wrong_result_count_is_an_error() -> None:
    async def short(items: list[int]) -> list[int]:
        return []

    with pytest.raises(RuntimeError, match="0 results for 1 items"):
        await Batcher(short).submit(1)


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Batcher(Recorder(), max_batch=0)


def test_a_new_event_loop_gets_a_fresh_queue() -> None:
    rec = Recorder()
    b = Batcher(rec)
    assert asyncio.run(b.submit(1)) == 10
    assert asyncio.run(b.submit(2)) == 20  # another loop: still works
    assert rec.batches == [[1], [2]]

"""The generic event stream both event families use (runtime.llm.event_stream.EventStream): a
terminal event or end() gives the result, fail() is raised after the events before it, send() is
lockstep, and a consumer-owned stream cancels its producer when the iteration stops early."""

from __future__ import annotations

import asyncio

import pytest

from runtime.llm.event_stream import EventStream


def _counted() -> EventStream[int, str]:
    """Events are ints; a negative one is terminal and its result is its text."""
    return EventStream(lambda n: n < 0, lambda n: f"ended at {n}")


async def test_a_terminal_event_ends_the_stream_and_later_pushes_are_ignored() -> None:
    stream = _counted()
    for n in (1, 2, -3, 4):
        stream.push(n)
    assert stream.ended
    assert [n async for n in stream] == [1, 2, -3]
    assert await stream.result() == "ended at -3"


async def test_end_gives_the_result_of_a_stream_without_terminal_events() -> None:
    stream: EventStream[str, list[str]] = EventStream()
    stream.push("a")
    assert not stream.ended
    stream.end(["a", "done"])
    stream.push("ignored")
    assert [e async for e in stream] == ["a"]
    assert await stream.result() == ["a", "done"]


async def test_fail_is_raised_after_the_events_before_it_and_by_result() -> None:
    stream: EventStream[str, str] = EventStream()
    stream.push("a")
    stream.fail(KeyError("hook"))
    seen: list[str] = []
    with pytest.raises(KeyError, match="hook"):
        async for e in stream:
            seen.append(e)
    assert seen == ["a"]
    with pytest.raises(KeyError, match="hook"):
        await stream.result()


async def test_send_returns_only_when_the_consumer_asks_for_the_next_event() -> None:
    stream: EventStream[int, None] = EventStream()
    progress: list[str] = []

    async def produce() -> None:
        for n in (1, 2):
            await stream.send(n)
            progress.append(f"sent {n}")
        stream.end(None)

    stream.attach(asyncio.get_running_loop().create_task(produce()))
    events = aiter(stream)
    assert await anext(events) == 1
    for _ in range(5):  # the producer gets every chance to run on
        await asyncio.sleep(0)
    assert progress == []  # it waits while the consumer holds event 1
    assert await anext(events) == 2
    assert progress == ["sent 1"]
    with pytest.raises(StopAsyncIteration):
        await anext(events)
    assert progress == ["sent 1", "sent 2"]
    assert await stream.result() is None


async def test_a_consumer_owned_stream_cancels_its_producer_when_closed_early() -> None:
    stream: EventStream[int, None] = EventStream(cancel_on_close=True)
    cancelled = asyncio.Event()

    async def produce() -> None:
        try:
            n = 0
            while True:
                n += 1
                await stream.send(n)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    task = asyncio.get_running_loop().create_task(produce())
    stream.attach(task)
    async for n in stream:
        if n == 2:
            break
    await stream.aclose()
    assert cancelled.is_set() and task.cancelled()

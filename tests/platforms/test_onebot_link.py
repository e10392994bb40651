"""The ``OneBotLink`` actor on a real local Ray: what a delivery actor's call becomes when no socket
takes it (``not_sent``: retried like a connect error), when a socket wrote it and never answered
or closed (``no_answer``: not retried, at most once), when it is answered; the lease rules of
reverse (take over) and forward (free or expired only) holders; and the mapping to
``SendResult`` that the delivery ledger retries on."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from actors.delivery.onebot_link import LinkSender, get_link
from runtime.platforms.base import ApiCall
from runtime.platforms.onebot11 import OneBot11Codec

pytestmark = pytest.mark.ray

FRAME = {"action": "send_private_msg", "params": {"user_id": 1, "message": []}}


@pytest.fixture
def link(ray_session: None) -> Iterator[tuple[str, Any]]:
    prefix = f"test-link-{uuid.uuid4().hex[:8]}"
    handle = get_link("1000000201", prefix)
    yield prefix, handle
    ray.kill(handle, no_restart=True)


async def test_a_call_no_socket_takes_is_not_sent(link: tuple[str, Any]) -> None:
    _, handle = link
    answer = await handle.call.remote(FRAME, 0.3)
    assert answer["state"] == "not_sent"
    assert (await handle.state.remote())["queued"] == 0


async def test_a_written_call_is_answered_by_echo(link: tuple[str, Any]) -> None:
    _, handle = link
    assert await handle.acquire.remote("h1", 15.0, False)
    pending = handle.call.remote(FRAME, 30.0)
    (frame,) = await handle.next_calls.remote("h1", 10.0, 15.0)
    assert {k: frame[k] for k in FRAME} == FRAME and isinstance(frame["echo"], str)
    response = {"status": "ok", "retcode": 0, "data": {"message_id": 42}, "echo": frame["echo"]}
    assert await handle.resolve.remote(frame["echo"], response)
    assert await pending == {"state": "answered", "response": response, "error": None}
    assert not await handle.resolve.remote(frame["echo"], response)  # nobody waits any more


async def test_written_and_unanswered_is_no_answer_on_timeout_and_on_close(link: tuple[str, Any]) -> None:
    _, handle = link
    assert await handle.acquire.remote("h1", 15.0, False)
    timed_out = handle.call.remote(FRAME, 0.5)
    assert len(await handle.next_calls.remote("h1", 10.0, 15.0)) == 1
    assert (await timed_out)["state"] == "no_answer"
    closed = handle.call.remote(FRAME, 30.0)
    assert len(await handle.next_calls.remote("h1", 10.0, 15.0)) == 1
    await handle.release.remote("h1")
    answer = await closed
    assert answer["state"] == "no_answer" and "closed" in answer["error"]


async def test_requeued_calls_go_to_the_next_holder_in_order(link: tuple[str, Any]) -> None:
    _, handle = link
    assert await handle.acquire.remote("h1", 15.0, False)
    # one call at a time: Ray does not run two calls to an async actor in submission order
    first = handle.call.remote({**FRAME, "action": "a"}, 30.0)
    taken: list[dict[str, Any]] = []
    while len(taken) < 1:
        taken += await handle.next_calls.remote("h1", 10.0, 15.0)
    second = handle.call.remote({**FRAME, "action": "b"}, 30.0)
    while len(taken) < 2:
        taken += await handle.next_calls.remote("h1", 10.0, 15.0)
    assert [f["action"] for f in taken] == ["a", "b"]
    await handle.requeue.remote([f["echo"] for f in taken])  # h1's socket closed before writing
    await handle.release.remote("h1")
    assert await handle.acquire.remote("h2", 15.0, False)
    again = await handle.next_calls.remote("h2", 10.0, 15.0)
    assert [f["action"] for f in again] == ["a", "b"]
    for f in again:
        await handle.resolve.remote(
            f["echo"], {"status": "ok", "retcode": 0, "data": None, "echo": f["echo"]}
        )
    assert [(await first)["state"], (await second)["state"]] == ["answered", "answered"]


async def test_lease_forward_waits_reverse_takes_over(link: tuple[str, Any]) -> None:
    _, handle = link
    assert await handle.acquire.remote("dialer-a", 15.0, False)
    assert not await handle.acquire.remote("dialer-b", 15.0, False)  # one dialer per bot
    assert await handle.acquire.remote("socket-c", 15.0, True)  # a newer reverse socket wins
    assert await handle.next_calls.remote("dialer-a", 0.1, 15.0) is None  # the old one stops
    assert (await handle.state.remote())["holder"] == "socket-c"
    await handle.release.remote("socket-c")
    assert await handle.acquire.remote("dialer-b", 0.0, False)  # a lease that lapses at once
    assert await handle.acquire.remote("dialer-a", 15.0, False)  # expired: taken without take-over


async def test_link_sender_maps_fates_to_send_results(link: tuple[str, Any], fixtures_dir: Path) -> None:
    prefix, handle = link
    sender = LinkSender(prefix)
    codec = OneBot11Codec(self_id="1000000201")
    call = ApiCall(
        base_url="http://unused", path="/send_private_msg", json_body={"user_id": 1, "message": []}
    )
    not_sent = await sender(codec, "1000000201", call, 0.3)
    assert (not_sent.ok, not_sent.retryable) == (False, True) and not_sent.error.startswith("connect:")
    assert await handle.acquire.remote("h1", 15.0, False)

    async def answer_with(name: str) -> None:
        (frame,) = await handle.next_calls.remote("h1", 10.0, 15.0)
        assert frame["action"] == "send_private_msg" and frame["params"] == {"user_id": 1, "message": []}
        body = json.loads((fixtures_dir / "onebot11" / name).read_bytes())
        body["echo"] = frame["echo"]
        await handle.resolve.remote(frame["echo"], body)

    results = await asyncio.gather(
        sender(codec, "1000000201", call, 30.0), answer_with("api_response_ok_napcat.json")
    )
    assert (results[0].ok, results[0].message_id) == (True, "1936658337")
    results = await asyncio.gather(
        sender(codec, "1000000201", call, 30.0), answer_with("api_response_failed_1404.json")
    )
    assert (results[0].ok, results[0].retryable) == (False, False) and results[0].error.startswith(
        "retcode 1404"
    )

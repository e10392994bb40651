"""Attacks on the provider-lease policy with usage a provider reports wrongly: one absurd number
must not lock an alias for hours nor make every later request look huge
(docs/decisions.md#spend-provider-limits). Injected clock, no sleeps."""

from __future__ import annotations

import httpx
import pytest

from providers.failures import MAX_RETRY_DELAY_S, retry_delay_s
from runtime.config import ProviderLimits
from runtime.spend.limits import LeaseBook


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def book(**limits: object) -> tuple[LeaseBook, Clock]:
    clock = Clock()
    return LeaseBook(ProviderLimits.model_validate(limits), clock), clock


@pytest.mark.parametrize("reported", [10**15, 10**9])
def test_an_absurd_reported_usage_blocks_the_alias_for_at_most_two_bucket_refills(reported: int) -> None:
    b, clock = book(tpm=6000, max_wait_s=10**6)  # 100 tokens/s; bucket 5900
    b.enqueue("a", False, 100)
    (g,) = b.grant_ready()
    assert b.release(g.lease_id, reported, 200, None)
    b.enqueue("b", False, 100)
    wait = b.next_wake_s()
    assert wait is not None and wait <= 2 * 5900 / 100  # two refills of the bucket, never centuries
    clock.now += wait
    assert len(b.grant_ready()) == 1
    # the running average of extra tokens is bounded too: later requests do not each need a full bucket
    assert b.extra_tokens <= 5900


def test_a_negative_reported_usage_never_overfills_the_bucket() -> None:
    b, _ = book(tpm=6000, concurrency=100)
    for i in range(3):
        b.enqueue(f"c{i}", False, 2000)
    grants = b.grant_ready()
    assert len(grants) == 2  # 5900 holds two requests of 2000, not three
    assert b.release(grants[0].lease_id, -(10**9), 200, None)
    assert b.extra_tokens >= 0
    # the reservation of the released lease comes back, no more: the third fits, a fourth does not
    b.enqueue("c3", False, 2000)
    assert len(b.grant_ready()) == 1
    assert b.grant_ready() == []


@pytest.mark.parametrize(
    ("header", "low", "high"),
    [
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0, 0.0),  # an HTTP-date in the past: go now
        ("99999999", MAX_RETRY_DELAY_S, MAX_RETRY_DELAY_S),  # huge: capped
        ("inf", MAX_RETRY_DELAY_S, MAX_RETRY_DELAY_S),
        ("-5", 0.0, 0.0),
        ("nan", 0.0, 0.5 * 1.25),  # unreadable: the first backoff
        ("soon", 0.0, 0.5 * 1.25),
    ],
)
def test_retry_after_in_the_past_huge_or_garbage_holds_the_alias_a_bounded_time(
    header: str, low: float, high: float
) -> None:
    wait = retry_delay_s(0, httpx.Headers({"retry-after": header}))
    assert low <= wait <= high
    b, clock = book(concurrency=4)
    b.enqueue("a", False, 1)
    (g,) = b.grant_ready()
    b.release(g.lease_id, None, 429, wait)
    b.enqueue("b", False, 1)
    clock.now += wait
    assert len(b.grant_ready()) == 1  # held back exactly until the wait passed, never longer


def test_a_storm_of_master_requests_refuses_a_waiting_non_master_at_max_wait_never_later() -> None:
    """Masters go first (the documented rule), so under a master storm a non-master is not served;
    it is refused at ``max_wait_s`` (the busy reply), never left waiting."""
    b, clock = book(concurrency=1, max_wait_s=30)
    b.enqueue("master-chat", True, 1)
    user = b.enqueue("user-chat", False, 1)
    (lease,) = b.grant_ready()
    for _ in range(29):
        clock.now += 1.0
        b.enqueue("master-chat", True, 1)
        b.release(lease.lease_id, 1, 200, None)
        (lease,) = b.grant_ready()
        assert lease.ticket != user
    clock.now += 1.0
    assert b.expire() == [user]
    assert (b.depth(), b.in_flight()) == (0, 1)  # the user is gone, a master holds the slot

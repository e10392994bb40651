"""Attacks on the provider-lease policy with usage a provider reports wrongly: one absurd number
must not lock an alias for hours nor make every later request look huge
(docs/decisions.md#spend-provider-limits). Injected clock, no sleeps."""

from __future__ import annotations

import pytest

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

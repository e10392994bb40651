"""The provider-lease policy on an injected clock, no sleeps (docs/decisions.md#spend-provider-limits):
concurrency slots, requests and tokens per minute as token buckets with headroom, fairness between
chats, masters first, a 429 slowing everyone and its Retry-After holding every grant, max_wait_s
refusals, token estimates corrected by reported usage, and reclaimed leases."""

from __future__ import annotations

import pytest

from runtime.config import ProviderLimits
from runtime.spend.limits import HEADROOM_S, LEASE_TTL_S, MIN_FACTOR, RECOVERY_S, LeaseBook


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def book(**limits: object) -> tuple[LeaseBook, Clock]:
    clock = Clock()
    return LeaseBook(ProviderLimits.model_validate(limits), clock), clock


def keys(grants: list, tickets: dict[int, str]) -> list[str]:
    return [tickets[g.ticket] for g in grants]


def test_concurrency_slots_are_given_back_by_release() -> None:
    b, _ = book(concurrency=2)
    tickets = [b.enqueue(f"chat{i}", False, 10) for i in range(3)]
    first = b.grant_ready()
    assert [g.ticket for g in first] == tickets[:2]
    assert (b.grant_ready(), b.depth(), b.in_flight()) == ([], 1, 2)
    assert b.next_wake_s() is not None  # only the max_wait deadline: a release is what helps
    assert b.release(first[0].lease_id, 12, 200, None) is True
    assert [g.ticket for g in b.grant_ready()] == [tickets[2]]
    assert b.release(first[0].lease_id, 12, 200, None) is False  # released once only


def test_rpm_is_a_bucket_of_the_limit_minus_headroom_refilled_per_second() -> None:
    b, clock = book(rpm=60)  # 1 request per second; bucket 60 - 1 s of refill = 59
    for i in range(70):
        b.enqueue(f"chat{i}", False, 1)
    assert len(b.grant_ready()) == 59
    assert b.next_wake_s() == pytest.approx(1.0)
    clock.now += 0.5
    assert b.grant_ready() == []
    clock.now += 0.5
    assert len(b.grant_ready()) == 1
    clock.now += 3.0
    assert len(b.grant_ready()) == 3
    assert HEADROOM_S == 1.0


def test_tpm_counts_the_estimate_and_is_corrected_by_reported_usage() -> None:
    b, clock = book(tpm=6000)  # 100 tokens/s; bucket 5900
    t1 = b.enqueue("a", False, 3000)
    t2 = b.enqueue("b", False, 2000)
    t3 = b.enqueue("c", False, 2000)
    granted = b.grant_ready()
    assert [g.ticket for g in granted] == [t1, t2]  # 5000 of 5900 taken; 2000 more do not fit
    assert [g.tokens for g in granted] == [3000, 2000]
    assert b.next_wake_s() == pytest.approx(11.0)  # 1100 tokens missing at 100/s
    # the first call really used 1000 tokens, not 3000: the bucket gets 2000 back at once
    b.release(granted[0].lease_id, 1000, 200, None)
    assert [g.ticket for g in b.grant_ready()] == [t3]
    # reported more than estimated: later requests reserve the average extra as well
    b.release(granted[1].lease_id, 2600, 200, None)
    assert b.extra_tokens == pytest.approx(0.3 * 600)
    clock.now += 100
    b.enqueue("d", False, 100)
    assert [g.tokens for g in b.grant_ready()] == [100 + 180]


def test_a_request_larger_than_the_bucket_goes_when_the_bucket_is_full() -> None:
    b, clock = book(tpm=600)  # 10 tokens/s, bucket 590
    small = b.enqueue("a", False, 100)
    assert [g.ticket for g in b.grant_ready()] == [small]
    big = b.enqueue("b", False, 5000)
    assert b.grant_ready() == []
    assert b.next_wake_s() == pytest.approx(10.0)
    clock.now += 10
    assert [g.ticket for g in b.grant_ready()] == [big]


def test_chats_take_turns_so_one_busy_chat_cannot_take_every_slot() -> None:
    b, _ = book(concurrency=1)
    tickets = {b.enqueue("busy", False, 1): "busy" for _ in range(5)}
    tickets[b.enqueue("quiet1", False, 1)] = "quiet1"
    tickets[b.enqueue("quiet2", False, 1)] = "quiet2"
    order: list[str] = []
    for _ in range(7):
        (grant,) = b.grant_ready()
        order.append(tickets[grant.ticket])
        b.release(grant.lease_id, 1, 200, None)
    assert order == ["busy", "quiet1", "quiet2", "busy", "busy", "busy", "busy"]


def test_masters_go_first() -> None:
    b, _ = book(concurrency=1)
    tickets = {b.enqueue(f"chat{i}", False, 1): f"chat{i}" for i in range(3)}
    (first,) = b.grant_ready()
    tickets[b.enqueue("master-chat", True, 1)] = "master-chat"
    b.release(first.lease_id, 1, 200, None)
    (second,) = b.grant_ready()
    assert (tickets[first.ticket], tickets[second.ticket]) == ("chat0", "master-chat")


def test_the_head_is_not_passed_by_smaller_requests() -> None:
    b, clock = book(tpm=600)  # bucket 590
    b.enqueue("a", False, 500)
    b.grant_ready()
    big = b.enqueue("b", False, 300)
    b.enqueue("c", False, 10)  # would fit, but waits behind b
    assert b.grant_ready() == []
    clock.now += 21
    assert next(g.ticket for g in b.grant_ready()) == big


def test_a_429_halves_the_rates_honours_retry_after_and_recovers_gradually() -> None:
    b, clock = book(rpm=120)  # 2/s, bucket 118
    for i in range(10):
        b.enqueue(f"c{i}", False, 1)
    grants = b.grant_ready()
    lease = grants[0].lease_id
    slowed_at = clock.now
    b.release(lease, None, 429, 5.0)
    assert b.factor(clock.now) == 0.5
    for i in range(3):
        b.enqueue(f"d{i}", False, 1)
    assert b.grant_ready() == []  # the bucket is emptied and Retry-After holds everyone
    assert b.next_wake_s() == pytest.approx(5.0)
    clock.now += 4.9
    assert b.grant_ready() == []
    clock.now += 0.1
    # 5 s at half rate (1/s) refilled 5 requests; the three waiters go
    assert len(b.grant_ready()) == 3
    clock.now = slowed_at + RECOVERY_S / 2
    assert b.factor(clock.now) == pytest.approx(0.75)
    clock.now = slowed_at + RECOVERY_S
    assert b.factor(clock.now) == 1.0


def test_repeated_429s_bottom_out_and_lower_concurrency_when_no_rate_is_set() -> None:
    b, clock = book(concurrency=8)
    for _ in range(10):
        b.slow_down(clock.now, None)
    assert b.factor(clock.now) == MIN_FACTOR
    assert b.concurrency(clock.now) == 1
    clock.now += RECOVERY_S
    assert b.concurrency(clock.now) == 8


def test_waiting_past_max_wait_is_refused() -> None:
    b, clock = book(concurrency=1, max_wait_s=30)
    b.enqueue("a", False, 1)
    (held,) = b.grant_ready()
    late = b.enqueue("b", False, 1)
    clock.now += 10
    later = b.enqueue("c", False, 1)
    assert b.next_wake_s() == pytest.approx(20.0)
    clock.now += 20
    assert b.expire() == [late]
    clock.now += 10
    assert b.expire() == [later]
    assert b.depth() == 0
    assert held.lease_id


def test_a_cancelled_waiter_leaves_the_queue() -> None:
    b, _ = book(concurrency=1)
    b.enqueue("a", False, 1)
    b.grant_ready()
    t = b.enqueue("b", False, 1)
    assert (b.cancel(t), b.cancel(t), b.depth()) == (True, False, 0)


def test_a_lease_never_released_is_reclaimed() -> None:
    b, clock = book(concurrency=1, max_wait_s=LEASE_TTL_S * 2)
    b.enqueue("a", False, 1)
    b.grant_ready()
    waiting = b.enqueue("b", False, 1)
    assert b.next_wake_s() == pytest.approx(LEASE_TTL_S)
    clock.now += LEASE_TTL_S
    assert [g.ticket for g in b.grant_ready()] == [waiting]

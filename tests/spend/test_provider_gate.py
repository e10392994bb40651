"""The provider gate in one process: the real OpenAI-compatible provider and transport against the
loopback stand-in (tests/spend/openai_standin.py), with and without a
:class:`~runtime.spend.granter.LocalProviderGate` (docs/decisions.md#spend-provider-limits):

* without a gate, a burst over the stand-in's concurrency is refused (429) some of the time;
  with the stand-in's limits as the gate's limits, never, and every call is answered (each wait
  observed, the queue empty after);
* the tokens the gate reserved are corrected by the usage the stand-in reported;
* with wrong (too generous) limits, a 429 reaches the gate: it slows the alias down, and the
  transport's retry waits in the gate instead of sleeping on its own;
* a call waiting longer than ``max_wait_s`` ends as ``provider busy: …`` (errors reason ``busy``,
  a refusal counted);
* an ungated alias is called without a lease;
* a caller that gives up leaves the queue, or gives back the lease it was granted meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import providers.transport as transport
from providers.openai_completions import stream_openai_completions
from runtime import metrics
from runtime.config import ProviderConfig, ProviderLimits
from runtime.llm.attribution import attributed
from runtime.llm.limits import is_busy_error, provider_gate, set_provider_gate
from runtime.llm.types import AssistantMessage, Context, Model, UserMessage
from runtime.spend.granter import AsyncGranter, LocalProviderGate
from tests.spend.openai_standin import OpenAIStandin

ALIAS = "standin"


@pytest.fixture(autouse=True)
def no_gate_after() -> Iterator[None]:
    yield
    set_provider_gate(None)


def configs(standin: OpenAIStandin, limits: dict[str, Any] | None) -> dict[str, ProviderConfig]:
    return {
        ALIAS: ProviderConfig(
            api="openai-completions",
            base_url=standin.base_url,
            limits=limits,
            models=[{"id": "m1"}],
        )
    }


async def burst(standin: OpenAIStandin, cfg: dict[str, ProviderConfig], n: int) -> list[AssistantMessage]:
    model = Model(id="m1", provider=ALIAS, api="openai-completions", base_url=standin.base_url)

    async def one(i: int) -> AssistantMessage:
        ctx = Context(system_prompt="be brief", messages=[UserMessage(content=f"question {i:03d}")])
        with attributed(session_key=f"onebot11:1:private:{i}"):
            return await stream_openai_completions(model, ctx, provider_configs=cfg).result()

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def sample(name: str, **labels: str) -> float:
    value = metrics.get_backend().registry.get_sample_value(name, labels)  # type: ignore[attr-defined]
    return float(value or 0.0)


def counter(metric: Any, **labels: str) -> float:
    return sample(metric.name, **labels)


async def test_without_a_gate_a_burst_is_refused_with_the_standins_limits_as_gate_never() -> None:
    with OpenAIStandin(concurrency=2, stream_s=0.2, reply="hello there") as standin:
        cfg = configs(standin, None)
        await burst(standin, cfg, 8)
        assert standin.stats().refused > 0
    with OpenAIStandin(concurrency=2, rpm=30, stream_s=0.05, reply="hello there") as standin:
        cfg = configs(standin, {"concurrency": 2, "rpm": 30})
        set_provider_gate(LocalProviderGate(cfg))
        waits_before = sample("sessionray_provider_lease_wait_seconds_count", alias=ALIAS)
        answers = await burst(standin, cfg, 30)
        stats = standin.stats()
    assert sample("sessionray_provider_lease_wait_seconds_count", alias=ALIAS) - waits_before == 30
    assert sample("sessionray_provider_queue_depth", alias=ALIAS) == 0
    assert [a.stop_reason for a in answers] == ["stop"] * 30
    assert [a.text() for a in answers] == ["hello there"] * 30
    assert (stats.requests, stats.refused, stats.served) == (30, 0, 30)
    assert stats.most_at_once == 2
    assert (
        sum(a.usage.input + a.usage.output for a in answers) == stats.prompt_tokens + stats.completion_tokens
    )


async def test_reported_usage_corrects_the_reserved_tokens() -> None:
    with OpenAIStandin(reply="a longer answer than the estimate knows about") as standin:
        cfg = configs(standin, {"tpm": 100_000})
        gate = LocalProviderGate(cfg)
        set_provider_gate(gate)
        (answer,) = await burst(standin, cfg, 1)
        book = gate._granters[ALIAS].book
        stats = standin.stats()
    assert answer.usage.total_tokens == stats.prompt_tokens + stats.completion_tokens
    # the estimate was the body's ⌈bytes / 4⌉ = the stand-in's prompt count; the reply is the extra
    assert book.extra_tokens == pytest.approx(0.3 * stats.completion_tokens)
    assert book.in_flight() == 0


async def test_a_429_reaches_the_gate_and_the_retry_waits_there(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def no_sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(transport, "_sleep", no_sleep)
    before = counter(metrics.PROVIDER_429S, alias=ALIAS)
    with OpenAIStandin(concurrency=1, stream_s=0.2, reply="hi") as standin:
        cfg = configs(standin, {"concurrency": 4})  # more than the stand-in takes
        gate = LocalProviderGate(cfg)
        set_provider_gate(gate)
        answers = await burst(standin, cfg, 4)
        stats = standin.stats()
    assert stats.refused > 0
    assert counter(metrics.PROVIDER_429S, alias=ALIAS) - before == stats.refused
    assert slept == []  # every retry of a 429 waited in the gate (Retry-After), never in the transport
    book = gate._granters[ALIAS].book
    assert book.factor(book.clock()) < 1.0
    assert book.blocked_until > 0
    assert {a.stop_reason for a in answers} <= {"stop", "error"}


async def test_waiting_longer_than_max_wait_gives_provider_busy() -> None:
    before = counter(metrics.PROVIDER_REFUSALS, alias=ALIAS)
    with OpenAIStandin(stream_s=2.0, reply="slow") as standin:
        cfg = configs(standin, {"concurrency": 1, "max_wait_s": 0.1})
        set_provider_gate(LocalProviderGate(cfg))
        answers = await burst(standin, cfg, 2)
        stats = standin.stats()
    assert sorted(a.stop_reason for a in answers) == ["error", "stop"]
    (busy,) = [a for a in answers if a.stop_reason == "error"]
    assert is_busy_error(busy.error_message)
    assert busy.error_message.startswith(
        "provider busy: no lease for provider 'standin' within max_wait_s=0.1 s"
    )
    assert transport.error_reason(busy.error_message, "error") == "busy"
    assert counter(metrics.PROVIDER_REFUSALS, alias=ALIAS) - before == 1
    assert stats.requests == 1  # the refused call never reached the provider


async def test_an_alias_without_limits_is_not_gated() -> None:
    with OpenAIStandin() as standin:
        cfg = configs(standin, None)
        set_provider_gate(LocalProviderGate(cfg))
        assert provider_gate(ALIAS) is None
        (answer,) = await burst(standin, cfg, 1)
    assert answer.stop_reason == "stop"


async def test_a_cancelled_wait_leaves_the_queue_and_a_grant_it_missed_is_given_back() -> None:
    granter = AsyncGranter(ALIAS, ProviderLimits(concurrency=1))
    first = await granter.acquire("a", False, 1)
    waiting = asyncio.ensure_future(granter.acquire("b", False, 1))
    await asyncio.sleep(0)  # let it queue
    assert granter.book.depth() == 1
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    assert granter.book.depth() == 0
    late = asyncio.ensure_future(granter.acquire("c", False, 1))
    await asyncio.sleep(0)
    granter.release(first.lease_id, 1, 200, None)  # grants "c" ...
    late.cancel()  # ... whose caller gives up before it resumed
    with contextlib.suppress(asyncio.CancelledError):
        await late
    assert (granter.book.depth(), granter.book.in_flight()) == (0, 0)

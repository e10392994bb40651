"""Smoke run of the ``cost`` benchmark section (``SESSIONRAY_BENCH_QUICK=1``) on a real local Ray,
SQLite and PostgreSQL: every figure is reported, consistent with the raw loads it comes from, and
the load generator's CPU is left out of the runtime's — whatever the speed of the machine (no
timing is asserted)."""

from __future__ import annotations

import pytest

from tests.bench import bench_cost

pytestmark = pytest.mark.ray


def test_quick_cost_bench_reports_every_figure_on_both_databases(
    ray_session: None, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SESSIONRAY_BENCH_QUICK", "1")
    q = bench_cost.QUICK
    out = bench_cost.run()

    assert out["quick"] is True and out["chain_p50_ms"] > 0 and out["shape_p50_ms"] > 0
    assert out["shape_vs_chain"] == round(out["shape_p50_ms"] / out["chain_p50_ms"], 2)
    assert out["deliver_in_host"] is True and out["postgres"]["deliver_in_host"] is False  # the profile's
    for fig, raw in ((out, out["detail"]["sqlite"]), (out["postgres"], out["detail"]["postgres"])):
        assert set(bench_cost.KEYS) <= set(fig)
        assert raw["one_chat"]["messages"] == q["one_chat"] and raw["one_chat"]["lost"] == 0
        assert raw["many"]["messages"] == q["chats"] * q["per_chat"] and raw["many"]["lost"] == 0
        assert raw["chatter"]["messages"] == q["chatter"]
        by_kind = fig["cpu_by_kind"]
        assert "load + platform API" not in by_kind  # the load generator is not the runtime
        assert by_kind["hosts"] > 0 and by_kind["ingress (driver)"] > 0
        assert fig["cpu_ms_per_message"] == by_kind["total"]
        pool = fig["cpu_by_kind_pool"]  # every reply through the delivery actor: its CPU is its own
        assert pool["delivery"] > 0 and fig["delivery_cpu_ms_per_reply"] == pool["delivery"]
        assert fig["cpu_ms_per_message_pool"] == pool["total"]
        assert fig["chatter_cpu_ms_per_message"] == fig["chatter_cpu_by_kind"]["total"]
        assert fig["p50_vs_chain"] == round(raw["one_chat"]["p50_ms"] / raw["chain_p50_ms"], 2)
        assert raw["chain_p50_ms"] > 0 and fig["p50_vs_chain_pool"] > 0 and fig["p50_vs_chain_in_host"] > 0
        assert raw["chatter"] is not None
        assert fig["work_ms"] == round(raw["one_chat"]["p50_ms"] - out["shape_p50_ms"], 2)
    # chatter gets no turn: the hosts and delivery actors do (almost) nothing for it
    chatter = out["detail"]["sqlite"]["chatter"]
    assert chatter["cpu_ms_per_msg"]["ingress (driver)"] > 0

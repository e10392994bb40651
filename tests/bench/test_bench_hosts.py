"""Smoke run of the ``hosts`` benchmark section (``SESSIONRAY_BENCH_QUICK=1``): every phase runs
against the real topology and its figures are consistent — every message answered, every
session of the scale phase live, activation starts no process, strict mode runs a process per
session — whatever the speed of the machine (no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench import bench_hosts

pytestmark = pytest.mark.ray


def test_quick_hosts_bench_answers_every_message_and_reports_every_figure(
    ray_session: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SESSIONRAY_BENCH_QUICK", "1")
    monkeypatch.setattr(bench_hosts, "PNG", tmp_path / "hosts_latency.png")
    q = bench_hosts.QUICK
    out = bench_hosts.run()

    assert out["quick"] is True
    assert out["floor"]["chain_p50_ms"] > 0 and out["floor"]["ceiling_msg_s"] > 0
    scale = out["scale"]
    assert scale["live_sessions_max"] == scale["directory_live"] == scale["sessions"] == q["scale"]
    assert scale["memory_live"]["hosts"]["processes"] >= scale["hosts"] >= 1  # + other tests' actors
    assert scale["memory_live"]["total"]["uss_mib"] > scale["memory_empty"]["total"]["uss_mib"]
    act = out["activation"]
    assert act["activations"] == q["activations"] and act["no_process_created"] is True
    churn = out["churn"]
    assert (churn["messages"], churn["lost"]) == (q["churn_msgs"], 0)
    assert churn["activated"] > churn["max_live_sessions"] == q["churn_live"]  # the cap forced churn
    assert churn["passivated"] > 0
    for mode in ("packed", "strict"):
        rows = out[mode]["by_load"]
        assert [r["sessions"] for r in rows] == list(q["loads"])
        for r in rows:
            assert (r["messages"], r["lost"]) == (r["sessions"] * q["per_session"][r["sessions"]], 0)
            cpu = r["cpu_ms_per_msg"]
            assert cpu["hosts"] > 0 and cpu["ingress (driver)"] > 0 and cpu["delivery"] > 0
        opened = out[mode]["open"]
        assert opened["lost"] == 0 and opened["messages"] > 0 and opened["chats"] == max(q["loads"])
    assert out["strict"]["by_load"][-1]["hosts"] >= max(q["loads"])  # one process per live session
    f = out["figures"]
    assert f["p50_vs_floor"] == round(f["p50_ms"] / out["floor"]["chain_p50_ms"], 2)
    assert len(out["targets"]) == 8 and all(t["met"] in (True, False, None) for t in out["targets"])
    assert (tmp_path / "hosts_latency.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

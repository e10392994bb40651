"""deploy/prometheus and deploy/grafana checked with Debian's promtool (installed by `make test`) and
against the metric catalogue in runtime/metrics.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.promql import (
    ALERTS_TEST_YML,
    ALERTS_YML,
    PROMETHEUS_YML,
    alert_rules,
    catalogue_series_names,
    dashboard,
    dashboard_exprs,
    metric_names_in,
)

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run promtool; fail the test with its output when it exits non-zero."""
    assert Path(PROMTOOL).exists(), "promtool not found: `apt-get install prometheus` (or run `make test`)"
    proc = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=cwd)
    assert proc.returncode == 0, f"promtool {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_promtool_check_config_accepts_the_scrape_config() -> None:
    out = promtool("check", "config", str(PROMETHEUS_YML))
    text = out.stdout + out.stderr
    assert f"SUCCESS: {PROMETHEUS_YML} is valid prometheus config file syntax" in text
    assert "SUCCESS: 8 rules found" in text  # the rule file referenced by the config was checked too


def test_scrape_config_has_the_ray_and_sessionray_jobs() -> None:
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    jobs = {job["job_name"]: job for job in cfg["scrape_configs"]}
    assert sorted(jobs) == ["ray", "sessionray"]
    assert jobs["ray"]["file_sd_configs"] == [
        {"files": ["/tmp/ray/prom_metrics_service_discovery.json"], "refresh_interval": "30s"}
    ]
    assert jobs["sessionray"]["metrics_path"] == "/metrics"
    assert jobs["sessionray"]["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
    assert cfg["rule_files"] == ["alerts.yml"]


def test_promtool_check_rules_accepts_the_alerts() -> None:
    out = promtool("check", "rules", str(ALERTS_YML))
    assert "SUCCESS: 8 rules found" in out.stdout


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    """alerts_test.yml feeds synthetic series (both spellings) and asserts which alerts fire."""
    out = promtool("test", "rules", ALERTS_TEST_YML.name, cwd=ALERTS_TEST_YML.parent)
    assert "SUCCESS" in out.stdout


def test_alerts_cover_the_issue_list() -> None:
    rules = alert_rules()
    assert [r["alert"] for r in rules] == [
        "SessionrayStructuredReplyFailureRate",
        "SessionrayStructuredFallbackRate",
        "SessionrayDeliveryFailureRate",
        "SessionrayTurnLatencyP99High",
        "SessionrayHostsStartedOnDemand",
        "SessionrayPassivatedUnderMemoryPressure",
        "SessionrayProviderErrorRate",
        "SessionrayIngressDown",
    ]
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]


def test_every_metric_in_alerts_and_dashboard_is_in_the_catalogue() -> None:
    known = catalogue_series_names()
    exprs = [r["expr"] for r in alert_rules()] + dashboard_exprs()
    used = set().union(*(metric_names_in(e) for e in exprs))
    unknown = sorted(used - set(known))
    assert unknown == [], f"metric names not declared in runtime/metrics.py: {unknown}"
    # Every sessionray metric is matched in both spellings (ray_ prefix from actors, none from ingress).
    for expr in exprs:
        if "sessionray_" in expr:
            assert '__name__=~"(ray_)?sessionray_' in expr, expr
            assert "ray_sessionray_" not in expr.replace("(ray_)?", ""), expr


def test_dashboard_covers_the_issue_areas() -> None:
    """traffic, latency, structured-reply tiers, deliveries, live sessions and hosts, provider tokens
    and errors, spend (USD and tokens by model, quota refusals) and the provider limits by alias."""
    used = {catalogue_series_names()[n] for e in dashboard_exprs() for n in metric_names_in(e)}
    required = {
        "sessionray_inbound_messages_total", "sessionray_http_requests_total", "sessionray_turns_total",
        "sessionray_turn_latency_seconds", "sessionray_delivery_latency_seconds",
        "sessionray_structured_replies_total", "sessionray_deliveries_total",
        "sessionray_live_sessions", "sessionray_hosts", "sessionray_host_live_sessions",
        "sessionray_host_memory_bytes", "sessionray_hosts_cold_total", "sessionray_activations_total",
        "sessionray_passivations_total", "sessionray_llm_tokens_total", "sessionray_llm_errors_total",
        "sessionray_llm_requests_total", "sessionray_llm_cost_usd_total", "sessionray_quota_exceeded_total",
        "sessionray_usage_ledger_failures_total", "sessionray_provider_lease_wait_seconds",
        "sessionray_provider_queue_depth", "sessionray_provider_429_total",
        "sessionray_provider_refusals_total",
    }
    assert required - used == set()


def test_dashboard_is_a_grafana_dashboard() -> None:
    dash = dashboard()
    assert (dash["uid"], dash["title"], dash["schemaVersion"]) == ("sessionray", "sessionray", 39)
    assert dash["templating"]["list"][0] | {"current": {}} == {
        "name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
        "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": [],
        "includeAll": False, "multi": False,
    }
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        assert panel["type"] in {"row", "timeseries", "stat"}, panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        xs, ys = range(pos["x"], pos["x"] + pos["w"]), range(pos["y"], pos["y"] + pos["h"])
        mine = {(x, y) for x in xs for y in ys}
        assert not mine & cells, f"panel {panel['title']!r} overlaps another"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize("source", ["alerts", "dashboard"])
def test_every_expression_is_valid_promql(tmp_path: Path, source: str) -> None:
    """promtool parses each expression as a recording rule (Grafana variables substituted)."""
    exprs = [r["expr"] for r in alert_rules()] if source == "alerts" else dashboard_exprs()
    rules = {"groups": [{"name": "parse", "rules": [
        {"record": f"sessionray:check:{i}", "expr": e} for i, e in enumerate(exprs)
    ]}]}
    path = tmp_path / "parse.yml"
    path.write_text(yaml.safe_dump(rules))
    out = promtool("check", "rules", str(path))
    assert f"SUCCESS: {len(exprs)} rules found" in out.stdout

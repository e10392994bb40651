"""A real Prometheus scraping a real sessionray (docs/decisions.md#ops-metrics-catalogue).

Stack (all real processes, torn down even on failure):

* a one-node Ray cluster: `ray start --head --block` with the dashboard (it writes Prometheus's
  service-discovery file) in a short temp dir, token auth, 1 s metrics report interval;
* `sessionray serve --config <tmp>/sessionray.yaml --address auto` (RAY_ADDRESS → that head;
  SQLite in tmp; a free port; the built-in model; a OneBot v11 bot whose API is the test
  platform-API server from tests/platform_api_server.py);
* Debian's `prometheus` with the config derived from deploy/prometheus/prometheus.yml
  (tests/deploy/prometheus_run.py says exactly what is substituted), scraping every second.

Traffic: three private messages, one redelivery of the last (duplicate) and a heartbeat (ignored),
POSTed to the webhook. The test then asks Prometheus's HTTP query API for the sessionray series,
from both jobs: `sessionray_*` from the ingress (job "sessionray") and `ray_sessionray_*` from the
actors via Ray's metrics agent (job "ray").
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.deploy.harness import SESSIONRAY, Proc, RayCluster, free_port, wait_for
from tests.deploy.prometheus_run import PrometheusServer, derive_config
from tests.deploy.promql import PROMETHEUS_YML, alert_rules, dashboard, dashboard_exprs
from tests.platform_api_server import PlatformApiServer

BOT = "1000000001"  # self_id of the recorded OneBot v11 events
USER = "200000002"  # the sender of event_private_message_array.json
TEXTS = ["hello 1", "hello 2", "hello 3"]


@dataclass
class Stack:
    cluster: RayCluster
    serve: Proc
    base_url: str
    api: PlatformApiServer
    prometheus: PrometheusServer
    answers: list[tuple[int, Any]]

    def diagnostics(self) -> str:
        return "\n".join([self.cluster.logs(), self.serve.output(), self.prometheus.proc.output()])


def sessionray_config(root: Path, api_base: str, port: int) -> dict[str, Any]:
    """The sessionray.yaml of the test (built-in model: no `ai` section)."""
    return {
        "bots": [{"platform": "onebot11", "self_id": BOT, "api_base": api_base, "masters": [USER]}],
        "database": {"url": f"sqlite:///{root}/sessionray.db"},
        "server": {"host": "127.0.0.1", "port": port},
        "runtime": {"router_shards": 1, "delivery_actors": 1, "min_hosts": 1},
    }


def text_segment(text: str) -> dict[str, Any]:
    """A canonical text segment as OneBot v11 sends it."""
    return {"type": "text", "data": {"text": text}}


def webhook_traffic(base_url: str, fixtures_dir: Path) -> list[tuple[int, Any]]:
    """POST 3 messages, a redelivery of the third, and a heartbeat; returns (status, json) each."""
    event = json.loads((fixtures_dir / "onebot11" / "event_private_message_array.json").read_text())
    heartbeat = json.loads((fixtures_dir / "onebot11" / "event_meta_heartbeat.json").read_text())
    bodies = []
    for i, text in enumerate(TEXTS):
        bodies.append(event | {"message_id": 5000 + i, "raw_message": text,
                               "message": [text_segment(text)]})
    bodies += [bodies[-1], heartbeat]
    url = f"{base_url}/webhooks/onebot11/{BOT}"
    answers = []
    for body in bodies:
        r = httpx.post(url, json=body, timeout=120)
        answers.append((r.status_code, r.json()))
    return answers


@pytest.fixture(scope="module")
def stack(fixtures_dir: Path) -> Iterator[Stack]:
    root = Path(tempfile.mkdtemp(prefix="srd-prom-", dir="/tmp"))  # short: Ray socket paths
    cluster = RayCluster(root)
    api = PlatformApiServer(fixtures_dir).start()
    serve: Proc | None = None
    prometheus: PrometheusServer | None = None
    try:
        cluster.start_head({"sessionray_test_head": 1})
        port = free_port()
        config_file = root / "sessionray.yaml"
        config_file.write_text(yaml.safe_dump(sessionray_config(root, api.base_url, port)))
        serve = Proc("serve", [SESSIONRAY, "serve", "--config", str(config_file), "--address", "auto"],
                     cluster.client_env(), root / "serve.log", cwd=root)
        base_url = f"http://127.0.0.1:{port}"
        diag = lambda: cluster.logs() + "\n" + serve.output()  # noqa: E731
        wait_for("sessionray serve /healthz",
                 lambda: httpx.get(base_url + "/healthz", timeout=2).status_code == 200
                 or (not serve.alive() and pytest.fail(f"sessionray serve exited\n{diag()}")),
                 timeout_s=300, diagnostics=diag)
        wait_for("Ray's service-discovery file", cluster.service_discovery_file.exists, timeout_s=180,
                 diagnostics=diag)
        prom_config = derive_config(cluster.service_discovery_file, f"127.0.0.1:{port}")
        prometheus = PrometheusServer(root, prom_config)
        answers = webhook_traffic(base_url, fixtures_dir)
        api.wait_for_requests(len(TEXTS), timeout_s=240)
        yield Stack(cluster, serve, base_url, api, prometheus, answers)
    finally:
        if prometheus is not None:
            prometheus.stop()
        if serve is not None:
            serve.stop(grace_s=20)  # SIGTERM: serve stops the runtime, then Ray
        cluster.stop()
        api.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_derived_config_only_substitutes_targets_paths_and_intervals(tmp_path: Path) -> None:
    repo = yaml.safe_load(PROMETHEUS_YML.read_text())
    derived = derive_config(tmp_path / "sd.json", "127.0.0.1:1234")

    def flat(node: Any, path: str = "") -> dict[str, Any]:
        if isinstance(node, dict):
            return {k: v for key, val in node.items() for k, v in flat(val, f"{path}.{key}").items()}
        if isinstance(node, list):
            return {k: v for i, val in enumerate(node) for k, v in flat(val, f"{path}[{i}]").items()}
        return {path: node}

    a, b = flat(repo), flat(derived)
    assert sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k)) == [
        ".global.evaluation_interval",
        ".global.scrape_interval",
        ".rule_files[0]",
        ".scrape_configs[0].file_sd_configs[0].files[0]",
        ".scrape_configs[0].file_sd_configs[0].refresh_interval",
        ".scrape_configs[1].static_configs[0].targets[0]",
    ]


@pytest.mark.ray
def test_webhooks_were_answered_and_replies_delivered(stack: Stack) -> None:
    assert stack.answers == [
        (200, {"status": "accepted"}), (200, {"status": "accepted"}), (200, {"status": "accepted"}),
        (200, {"status": "duplicate"}), (200, {"status": "ignored"}),
    ]
    sent = sorted(((r.path, r.json) for r in stack.api.requests), key=json.dumps)
    assert sent == [
        ("/send_private_msg", {"user_id": int(USER), "message": [text_segment(f"You said: {t}")]})
        for t in TEXTS
    ]


def wait_for_query(stack: Stack, expr: str, expected: dict[tuple[tuple[str, str], ...], float]) -> None:
    """Poll Prometheus until ``expr`` returns exactly ``expected`` (series arrive within a few
    scrape and report intervals); fail with the last answer after 90 s."""
    last: list[Any] = []

    def check() -> bool:
        last[:] = [stack.prometheus.query(expr)]
        return last[0] == expected

    wait_for(f"{expr} == {expected}", check, timeout_s=90, interval_s=1.0,
             diagnostics=lambda: f"last answer: {last}\n{stack.prometheus.proc.output()}")


@pytest.mark.ray
def test_both_scrape_jobs_are_up(stack: Stack) -> None:
    wait_for_query(stack, 'max by (job) (up{job=~"ray|sessionray"})', {
        (("job", "ray"),): 1.0, (("job", "sessionray"),): 1.0,
    })


@pytest.mark.ray
def test_ingress_series_arrive_with_expected_values(stack: Stack) -> None:
    """prometheus-client series of the ingress process (job sessionray, no ray_ prefix)."""
    webhook = 'route="/webhooks/{platform}/{bot_id}"'
    wait_for_query(stack, 'sum by (outcome) (sessionray_inbound_messages_total{platform="onebot11"})', {
        (("outcome", "accepted"),): 3.0, (("outcome", "duplicate"),): 1.0, (("outcome", "ignored"),): 1.0,
    })
    wait_for_query(stack, f"sum by (job, status) (sessionray_http_requests_total{{{webhook}}})", {
        (("job", "sessionray"), ("status", "200")): 5.0,
    })
    wait_for_query(stack, f"sum(sessionray_http_request_duration_seconds_count{{{webhook}}})", {(): 5.0})


@pytest.mark.ray
def test_actor_series_arrive_through_rays_metrics_agent(stack: Stack) -> None:
    """ray.util.metrics series recorded inside actors (job ray, ray_ prefix, one series per WorkerId)."""
    wait_for_query(stack, 'sum by (job, platform, outcome) (ray_sessionray_turns_total)', {
        (("job", "ray"), ("outcome", "ok"), ("platform", "onebot11")): 3.0,
    })
    wait_for_query(stack, "sum by (platform, outcome) (ray_sessionray_deliveries_total)", {
        (("outcome", "ok"), ("platform", "onebot11")): 3.0,
    })
    wait_for_query(stack, "sum by (platform) (ray_sessionray_delivery_latency_seconds_count)", {
        (("platform", "onebot11"),): 3.0,
    })
    wait_for_query(stack, "sum by (platform) (ray_sessionray_turn_latency_seconds_count)", {
        (("platform", "onebot11"),): 3.0,
    })
    # The built-in model answers through native structured output, valid at the first try.
    wait_for_query(stack, "sum by (mode, outcome) (ray_sessionray_structured_replies_total)", {
        (("mode", "native"), ("outcome", "first_try")): 3.0,
    })
    wait_for_query(stack, "sum(ray_sessionray_activations_total)", {(): 1.0})  # one chat = one session
    # Every actor-side series carries Ray's WorkerId label (what the dashboards sum away).
    series = stack.prometheus.api("series", **{"match[]": "ray_sessionray_turns_total"})
    assert series and all(s.get("WorkerId") for s in series)


@pytest.mark.ray
def test_queries_in_the_dashboard_form_match_both_spellings(stack: Stack) -> None:
    """The `{__name__=~"(ray_)?..."}` form used by alerts.yml and the dashboard sees both jobs."""
    wait_for_query(stack, 'sum by (job) ({__name__=~"(ray_)?sessionray_turns_total"})', {
        (("job", "ray"),): 3.0,
    })
    inbound = '{__name__=~"(ray_)?sessionray_inbound_messages_total", outcome="accepted"}'
    wait_for_query(stack, f"sum by (job) ({inbound})", {
        (("job", "sessionray"),): 3.0,
    })
    # The ingress refreshes the router-level gauges from runtime.status() at each scrape.
    wait_for_query(stack, 'sum by (job) ({__name__=~"(ray_)?sessionray_live_sessions", job="sessionray"})', {
        (("job", "sessionray"),): 1.0,
    })


@pytest.mark.ray
def test_dashboard_gauge_panels_show_the_live_values(stack: Stack) -> None:
    """The "Live sessions" and "Session hosts" stat panels, evaluated as Grafana would: one chat is
    live, on the one session host the supervisor keeps (runtime.min_hosts: 1; 2000 slots free, so
    no second host is started)."""
    panels = {p["title"]: p for p in dashboard()["panels"]}
    wait_for_query(stack, panels["Live sessions"]["targets"][0]["expr"], {(): 1.0})
    wait_for_query(stack, panels["Session hosts"]["targets"][0]["expr"], {(): 1.0})


@pytest.mark.ray
def test_every_dashboard_and_alert_expression_evaluates(stack: Stack) -> None:
    for expr in dashboard_exprs() + [r["expr"] for r in alert_rules()]:
        stack.prometheus.api("query", query=expr)  # raises on a PromQL or evaluation error

    def rules_evaluated() -> list[tuple[str, str]] | None:
        groups = stack.prometheus.api("rules")["groups"]
        rules = [(r["name"], r["health"]) for g in groups for r in g["rules"]]
        return rules if all(h == "ok" for _, h in rules) else None

    rules = wait_for("every alert rule evaluated", rules_evaluated, timeout_s=30)
    assert sorted(rules) == sorted((r["alert"], "ok") for r in alert_rules())
    # With healthy traffic no alert fires (the ingress is up, nothing failed).
    assert stack.prometheus.api("alerts")["alerts"] == []

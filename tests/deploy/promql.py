"""Helpers shared by the deploy tests: where the deploy files are, the PromQL they contain, and the
metric names those expressions use, resolved against the catalogue in runtime/metrics.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from runtime import metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS_YML = DEPLOY / "prometheus" / "alerts.yml"
ALERTS_TEST_YML = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD_JSON = DEPLOY / "grafana" / "sessionray.json"

GRAFANA_RANGE_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
"""Grafana's built-in range variables and the value substituted to evaluate an expression."""

_NAME = re.compile(r"(?:ray_)?(sessionray_[a-z0-9_]+)|\(ray_\)\?(sessionray_[a-z0-9_]+)")
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def alert_rules() -> list[dict[str, Any]]:
    """Every rule of deploy/prometheus/alerts.yml, in file order."""
    doc = yaml.safe_load(ALERTS_YML.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    """deploy/grafana/sessionray.json, parsed."""
    return json.loads(DASHBOARD_JSON.read_text())


def dashboard_exprs(dash: dict[str, Any] | None = None) -> list[str]:
    """The PromQL of every target of every panel, with Grafana's range variables substituted."""
    out = []
    for panel in (dash or dashboard())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_RANGE_VARS.items():
                expr = expr.replace(var, value)
            out.append(expr)
    return out


def metric_names_in(expr: str) -> set[str]:
    """``sessionray_*`` names an expression selects (``ray_`` prefix and ``(ray_)?`` removed)."""
    return {a or b for a, b in _NAME.findall(expr)}


def catalogue_series_names() -> dict[str, str]:
    """Every series name the catalogue can produce → the declared metric it belongs to.

    Counters are declared with their ``_total`` name; histograms add ``_bucket``/``_count``/``_sum``.
    """
    names: dict[str, str] = {}
    for m in metrics.ALL_METRICS:
        names[m.name] = m.name
        if m.kind == "histogram":
            for suffix in _HISTOGRAM_SUFFIXES:
                names[m.name + suffix] = m.name
    return names

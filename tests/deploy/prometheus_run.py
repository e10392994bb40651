"""Run Debian's ``prometheus`` binary for a test, with a config DERIVED from the repository's
deploy/prometheus/prometheus.yml.

:func:`derive_config` changes exactly these keys and nothing else (the test asserts it):

* ``global.scrape_interval`` / ``global.evaluation_interval`` → ``1s`` (a test cannot wait 15 s);
* ``rule_files`` → the absolute path of deploy/prometheus/alerts.yml (the config is written to a
  temp directory, so the relative ``alerts.yml`` would not resolve);
* job ``ray``: ``file_sd_configs[0].files`` → the test cluster's service-discovery file
  (``<temp dir>/prom_metrics_service_discovery.json`` instead of ``/tmp/ray/...``) and its
  ``refresh_interval`` → ``1s``;
* job ``sessionray``: ``static_configs[0].targets`` → the ``sessionray serve`` under test.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.deploy.harness import Proc, free_port, wait_for
from tests.deploy.promql import ALERTS_YML, PROMETHEUS_YML

PROMETHEUS = "/usr/bin/prometheus"


def derive_config(sd_file: Path, sessionray_target: str) -> dict[str, Any]:
    """The repository's prometheus.yml with only the substitutions in the module docstring."""
    cfg: dict[str, Any] = copy.deepcopy(yaml.safe_load(PROMETHEUS_YML.read_text()))
    cfg["global"]["scrape_interval"] = "1s"
    cfg["global"]["evaluation_interval"] = "1s"
    cfg["rule_files"] = [str(ALERTS_YML)]
    jobs = {job["job_name"]: job for job in cfg["scrape_configs"]}
    jobs["ray"]["file_sd_configs"][0]["files"] = [str(sd_file)]
    jobs["ray"]["file_sd_configs"][0]["refresh_interval"] = "1s"
    jobs["sessionray"]["static_configs"][0]["targets"] = [sessionray_target]
    return cfg


class PrometheusServer:
    """``prometheus`` on a free loopback port with temp storage; :meth:`query` uses its HTTP API."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config_path = workdir / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.proc = Proc("prometheus", [
            PROMETHEUS, f"--config.file={config_path}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
        ], env={"PATH": "/usr/bin:/bin"}, log=workdir / "prometheus.log")
        wait_for("prometheus to be ready",
                 lambda: httpx.get(self.url + "/-/ready", timeout=2).status_code == 200,
                 timeout_s=60, diagnostics=self.proc.output)

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>``; returns ``data``; raises AssertionError on an API error."""
        body = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Instant query → ``{sorted label pairs: value}``."""
        data = self.api("query", query=expr)
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in data["result"]}

    def stop(self) -> None:
        """Stop the server (only its own process session)."""
        self.proc.stop()

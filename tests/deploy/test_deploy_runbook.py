"""deploy/README.md (the runbook) agrees with the files and with what the other deploy tests run:
its promtool commands are executed as written, its Secret keys are the manifests' keys, and its
serve / steer / ray start commands have the shape the live tests use."""

from __future__ import annotations

import re
import shlex
import subprocess

import yaml

from tests.deploy.promql import DEPLOY, ROOT

RUNBOOK = DEPLOY / "README.md"


def shell_lines() -> list[str]:
    """Every command line of the runbook's ```sh blocks (continuations joined)."""
    blocks = re.findall(r"```sh\n(.*?)```", RUNBOOK.read_text(), flags=re.S)
    lines = (line.strip() for block in blocks for line in block.replace("\\\n", " ").splitlines())
    return [line for line in lines if line]


def test_listed_files_exist() -> None:
    table = RUNBOOK.read_text().split("## 1.", 1)[0]  # the "What is here" table
    cells = re.findall(r"^\| (`[^|]+`) \|", table, flags=re.M)
    paths = [p for cell in cells for p in re.findall(r"`([^`]+)`", cell)]
    assert "prometheus/alerts_test.yml" in paths
    missing = [p for p in paths if not (DEPLOY / p).is_file()]
    assert paths and not missing, missing


def test_promtool_commands_run_as_written() -> None:
    commands = [line for line in shell_lines() if line.startswith("promtool ")]
    assert commands == [
        "promtool check config deploy/prometheus/prometheus.yml",
        "promtool check rules deploy/prometheus/alerts.yml",
        "promtool test rules deploy/prometheus/alerts_test.yml",
    ]
    for command in commands:
        proc = subprocess.run(shlex.split(command), cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"


def test_secret_keys_match_the_manifests() -> None:
    prefix = "kubectl create secret generic sessionray-secrets"
    create = next(line for line in shell_lines() if line.startswith(prefix))
    documented = sorted(re.findall(r"--from-literal=([a-z-]+)=", create))
    used: set[str] = set()
    for name in ("rayservice.yaml", "raycluster.yaml"):
        used |= set(re.findall(r"secretKeyRef: \{name: sessionray-secrets, key: ([a-z-]+)\}",
                               (DEPLOY / "kuberay" / name).read_text()))
    assert documented == sorted(used)


def test_commands_have_the_shape_the_live_tests_run() -> None:
    lines = shell_lines()
    # test_deploy_two_node.py, test_deploy_prometheus_live.py: `sessionray serve --config F --address auto`
    assert "RAY_ADDRESS=<head ip>:6379 sessionray serve --config sessionray.yaml --address auto" in lines
    # test_deploy_two_node.py: `sessionray steer KEY TEXT --as MASTER --url BASE` and the HTTP steer.
    assert ('sessionray steer onebot11:1000000001:private:200000002 "stop and summarize" '
            "--as 200000002 --url http://127.0.0.1:8000") in lines
    http_steer = next(line for line in lines if line.startswith("curl -s -X POST") and "/steer" in line)
    assert "'{\"text\": \"stop and summarize\", \"sender_id\": \"200000002\"}'" in http_steer
    assert http_steer.endswith("/admin/sessions/onebot11:1000000001:private:200000002/steer")
    # Nodes: the metrics port is the one the manifests use (outside Ray's worker ports).
    port = yaml.safe_load((DEPLOY / "kuberay" / "raycluster.yaml").read_text())["spec"]["headGroupSpec"][
        "rayStartParams"]["metrics-export-port"]
    assert f"ray start --head --port=6379 --metrics-export-port={port}        # head" in lines
    assert f"ray start --address=<head ip>:6379 --metrics-export-port={port}  # each worker" in lines
    assert "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=<the shared token>" in lines


def test_operations_page_points_to_the_runbook() -> None:
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page.split("## Deploy and observe", 1)[1].split("\n## ", 1)[0]
    assert "deploy/README.md" in section


def test_tree_paths_in_runbook_are_real() -> None:
    pattern = r"`((?:deploy|tests/deploy|actors)/[\w./-]+\.(?:py|yaml|yml|json))`"
    paths = re.findall(pattern, RUNBOOK.read_text())
    assert "actors/raylife/cluster.py" in paths
    assert [p for p in paths if not (ROOT / p).is_file()] == []

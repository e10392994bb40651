"""The KubeRay manifests, the `ray up` cluster YAML and the Dockerfile, checked against what Ray
itself validates (Serve's deploy schema, the autoscaler's cluster schema) and against the project
(the Ray pin, the configuration contract in runtime/config/settings.py, the ports Ray reserves)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import ray
import yaml
from ray.serve.schema import ServeDeploySchema

from runtime.config import parse_config
from tests.deploy.promql import DEPLOY, ROOT

KUBERAY = DEPLOY / "kuberay"
WORKER_PORT_RANGE = range(10002, 20000)  # Ray's default worker ports: a metrics port must lie outside


def load(path: Path) -> dict[str, Any]:
    docs = list(yaml.safe_load_all(path.read_text()))
    assert len(docs) == 1, path
    doc: dict[str, Any] = docs[0]
    return doc


def cluster_specs() -> dict[str, dict[str, Any]]:
    """The RayCluster spec of raycluster.yaml and the one embedded in rayservice.yaml."""
    return {
        "raycluster": load(KUBERAY / "raycluster.yaml")["spec"],
        "rayservice": load(KUBERAY / "rayservice.yaml")["spec"]["rayClusterConfig"],
    }


def test_rayservice_serve_config_is_valid_for_ray_serve() -> None:
    svc = load(KUBERAY / "rayservice.yaml")
    head = (svc["apiVersion"], svc["kind"], svc["metadata"]["name"])
    assert head == ("ray.io/v1", "RayService", "sessionray")
    serve = ServeDeploySchema.model_validate(yaml.safe_load(svc["spec"]["serveConfigV2"]))
    [app] = serve.applications
    assert (app.name, app.route_prefix, app.import_path) == ("sessionray", "/", "actors.serve.app:app")
    assert app.runtime_env == {"env_vars": {"SESSIONRAY_CONFIG": "/etc/sessionray/sessionray.yaml"}}
    assert serve.http_options.port == 8000
    # The deployment override names the deployment that actors/serve/app.py declares.
    from actors.serve.app import app as bound_app

    assert [d.name for d in app.deployments] == [bound_app._bound_deployment.name] == ["sessionray-ingress"]


def test_cluster_specs_match_the_ray_pin_and_expose_metrics() -> None:
    for name, spec in cluster_specs().items():
        assert spec["rayVersion"] == ray.__version__, name
        groups = [("head", spec["headGroupSpec"])] + [(g["groupName"], g) for g in spec["workerGroupSpecs"]]
        for group_name, group in groups:
            port = int(group["rayStartParams"]["metrics-export-port"])
            assert port == 8080 and port not in WORKER_PORT_RANGE, (name, group_name)
            [container] = group["template"]["spec"]["containers"]
            assert {"containerPort": 8080, "name": "metrics"} in container["ports"], (name, group_name)
            assert container["image"] == "sessionray:0.1.0", (name, group_name)
            env = {e["name"]: e for e in container["env"]}
            assert env["SESSIONRAY_CONFIG"]["value"] == "/etc/sessionray/sessionray.yaml"
            assert env["RAY_AUTH_MODE"]["value"] == "token"
            secrets = {
                n: e["valueFrom"]["secretKeyRef"] for n, e in env.items() if "valueFrom" in e
            }
            assert {n: s["name"] for n, s in secrets.items()} == dict.fromkeys(
                ["RAY_AUTH_TOKEN", "SESSIONRAY_ADMIN_TOKEN", "PGPASSWORD", "LOCAL_LLM_KEY",
                 "ONEBOT_ACCESS_TOKEN", "ONEBOT_SECRET"], "sessionray-secrets"
            ), (name, group_name)
            assert container["volumeMounts"] == [
                {"name": "sessionray-config", "mountPath": "/etc/sessionray", "readOnly": True}
            ]
        [workers] = spec["workerGroupSpecs"]
        assert workers["minReplicas"] <= workers["replicas"] <= workers["maxReplicas"], name


def test_shipped_sessionray_yaml_is_a_valid_config_on_postgresql() -> None:
    cm = load(KUBERAY / "sessionray-config.yaml")
    assert (cm["kind"], cm["metadata"]["name"]) == ("ConfigMap", "sessionray-config")
    cfg = parse_config(yaml.safe_load(cm["data"]["sessionray.yaml"]), "sessionray-config.yaml")
    assert cfg.database.url.startswith("postgresql+psycopg://")  # multi-node: never SQLite
    assert (cfg.server.host, cfg.server.port) == ("0.0.0.0", 8000)
    # Secrets are variable *names*; the manifests fill those variables from the Secret.
    env_names = {e["name"] for e in cluster_specs()["rayservice"]["headGroupSpec"]["template"]["spec"][
        "containers"][0]["env"]}
    wanted = {cfg.server.admin_token_env, cfg.bots[0].access_token_env, cfg.bots[0].secret_env}
    wanted |= {p.api_key_env for p in cfg.ai.providers.values()}
    assert wanted <= env_names


def test_ray_up_cluster_yaml_passes_the_autoscaler_schema() -> None:
    schema_path = Path(ray.__file__).parent / "autoscaler" / "ray-schema.json"
    cfg = yaml.safe_load((DEPLOY / "ray" / "cluster.yaml").read_text())
    jsonschema.validate(cfg, json.loads(schema_path.read_text()))
    assert cfg["head_node_type"] in cfg["available_node_types"]
    starts = " ".join(cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"])
    ports = [int(p) for p in re.findall(r"--metrics-export-port=(\d+)", starts)]
    assert ports == [8080, 8080]
    assert "RAY_AUTH_MODE=token" in " ".join(cfg["docker"]["run_options"])
    assert cfg["file_mounts"]["/etc/sessionray/sessionray.yaml"] == "./sessionray.yaml"


def test_dockerfile_uses_the_official_ray_image_at_the_pinned_version() -> None:
    lines = [line for line in (DEPLOY / "Dockerfile").read_text().splitlines() if line and line[0] != "#"]
    assert lines[0] == f"FROM rayproject/ray:{ray.__version__}-py311"
    copied = [line.split()[1:-1] for line in lines if line.startswith("COPY")]
    assert copied == [["pyproject.toml", "README.md"], ["runtime"], ["providers"], ["actors"]]
    for package in ("runtime", "providers", "actors"):
        assert (ROOT / package / "__init__.py").is_file(), package
    # Every package setuptools installs (pyproject.toml: packages.find.include) is copied.
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert include["include"] == ["runtime*", "actors*", "providers*"]
    assert "RUN pip install --no-cache-dir /opt/sessionray \\" in lines
    assert lines[-2:] == ["ENV SESSIONRAY_CONFIG=/etc/sessionray/sessionray.yaml", "WORKDIR /home/ray"]


def test_podmonitor_selects_the_sessionray_pods_and_ports() -> None:
    monitor = load(KUBERAY / "podmonitor.yaml")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    endpoints = {e["port"]: e for e in monitor["spec"]["podMetricsEndpoints"]}
    assert {p: e["relabelings"] for p, e in endpoints.items()} == {
        "metrics": [{"targetLabel": "job", "replacement": "ray"}],
        "serve": [{"targetLabel": "job", "replacement": "sessionray"}],
    }
    spec = cluster_specs()["rayservice"]
    head = spec["headGroupSpec"]["template"]
    assert selector.items() <= head["metadata"]["labels"].items()
    assert {"metrics", "serve"} <= {p["name"] for p in head["spec"]["containers"][0]["ports"]}
    for group in spec["workerGroupSpecs"]:
        assert selector.items() <= group["template"]["metadata"]["labels"].items()

"""actors/serve/app.py: the import paths a KubeRay RayService names (``actors.serve.app:app`` and the
builder ``actors.serve.app:build``) resolve to Ray Serve applications of the ingress deployment,
and the replica class reads the configuration file it is given. (Starting Serve itself costs
≈ 240 MiB and is exercised by the deploy tests on a cluster.)"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from ray.serve import Application

from runtime.config import ConfigError


def test_import_paths_are_serve_applications(tmp_path: Path) -> None:
    module = importlib.import_module("actors.serve.app")
    assert isinstance(module.app, Application)
    assert module.SessionrayIngress.name == "sessionray-ingress"
    built = module.build({"config": str(tmp_path / "sessionray.yaml")})
    assert isinstance(built, Application)


def test_replica_reads_its_config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module("actors.serve.app")
    cfg = tmp_path / "sessionray.yaml"
    cfg.write_text("server: {port: 8123}\nruntime: {delivery_actors: 3}\n")
    monkeypatch.setenv(module.CONFIG_ENV, str(cfg))
    config = module.replica_config()
    assert (config.server.port, config.runtime.delivery_actors) == (8123, 3)
    with pytest.raises(ConfigError, match="configuration file not found"):
        module.replica_config(str(tmp_path / "missing.yaml"))

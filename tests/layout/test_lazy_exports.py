"""Lazy package exports (docs/decisions.md#ops-lazy-exports): every package ``__init__`` that uses
:func:`runtime.lazy.lazy_exports` exports exactly its ``__all__``, each name resolves to the object
its module defines, no name is shadowed by a submodule of the same name, and the light actor
processes (router shard, host supervisor) import neither SQL nor the agent loop."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.lazy import lazy_exports, read_exports

ROOT = Path(__file__).resolve().parents[2]
LAZY = ("runtime", "runtime.agent", "runtime.reply", "runtime.memory", "runtime.session", "runtime.delivery")


def _init(package: str) -> Path:
    return ROOT / package.replace(".", "/") / "__init__.py"


def test_the_lazy_packages_are_the_ones_that_use_it() -> None:
    users = sorted(
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "runtime").rglob("__init__.py")
        if "lazy_exports(__name__, __file__)" in p.read_text(encoding="utf-8")
    )
    assert users == sorted(LAZY)


@pytest.mark.parametrize("package", LAZY)
def test_every_export_resolves_to_its_modules_object_and_no_submodule_shadows_it(package: str) -> None:
    table = read_exports(_init(package))
    module = importlib.import_module(package)
    assert sorted(table) == sorted(module.__all__)
    submodules = {p.stem for p in _init(package).parent.iterdir() if p.suffix == ".py" or p.is_dir()}
    assert sorted(set(table) & submodules) == []
    for name, target in table.items():
        source, _, attr = target.partition(":")
        assert getattr(module, name) is getattr(importlib.import_module(source), attr), name
    assert set(table) <= set(dir(module))


def test_an_unknown_name_is_an_import_error_as_before() -> None:
    with pytest.raises(ImportError, match="Nonexistent"):
        exec("from runtime.session import Nonexistent", {})


def test_a_relative_or_star_import_in_the_block_is_refused(tmp_path: Path) -> None:
    for line in ("from .core import SessionCore", "from runtime.session.core import *"):
        init = tmp_path / "__init__.py"
        init.write_text(f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    {line}\n")
        with pytest.raises(ValueError, match="absolute module"):
            lazy_exports("pkg", str(init))


def _imported_by(modules: list[str]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


@pytest.mark.parametrize(
    "modules",
    [
        ["actors.placement.router"],  # its inbox recovery imports SQL when it starts, not on import
        # the supervisor unpickles its config, setup factory and delivery pool handles
        [
            "actors.placement.hosts.supervisor",
            "actors.placement.hosts.setup",
            "runtime.config",
            "actors.delivery.handles",
            "runtime.delivery.owners",  # at its start: the host owner ids whose replies it hands on
        ],
    ],
    ids=["router", "supervisor"],
)
def test_a_light_actor_process_imports_no_sql_and_no_agent(modules: list[str]) -> None:
    loaded = set(_imported_by(modules))
    heavy = {"sqlalchemy", "sqlmodel", "runtime.agent.agent", "runtime.memory.db", "runtime.session.core"}
    assert sorted(heavy & loaded) == []
    assert "runtime.session.control" in loaded  # the control types it does use, imported as before


@pytest.mark.parametrize(
    "actor",
    [
        "actors.delivery.pool:DeliveryActor",
        "actors.placement.hosts.host:SessionHost",
        "actors.placement.hosts.supervisor:HostSupervisor",
        "actors.placement.router:RouterActor",
    ],
)
def test_a_handle_on_an_actor_does_not_load_what_the_actor_runs(actor: str, tmp_path: Path) -> None:
    """Ray ships an actor class pickled (by value when Ray's wrapper class is not importable by
    name), and every process that gets a handle on the actor loads it with the globals its methods
    name: the supervisor holds the delivery actors' and the hosts' handles, the router the hosts'.
    Loading the class must not import the HTTP client, SQL or the agent loop."""
    module, _, name = actor.partition(":")
    pickled = tmp_path / "class.pkl"
    dump = (
        "import importlib, sys, ray.cloudpickle as cp\n"
        f"cls = getattr(importlib.import_module({module!r}), {name!r}).__ray_metadata__.modified_class\n"
        f"open({str(pickled)!r}, 'wb').write(cp.dumps(cls))\n"
    )
    subprocess.run([sys.executable, "-c", dump], cwd=ROOT, check=True)
    load = (
        "import json, pickle, sys\n"
        f"pickle.loads(open({str(pickled)!r}, 'rb').read())\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", load], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    heavy = {"sqlalchemy", "httpx", "runtime.delivery.core", "runtime.agent.agent", "runtime.session.core"}
    assert sorted(heavy & loaded) == []

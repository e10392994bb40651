"""Warm activation (docs/decisions.md#session-lifecycle): a new session host does the
session-independent work of an activation in its warm-up — imports, the setup factory's
``prepare``, the SQL reads of an activation — so activating sessions on it (the first one
included, and one after a passivation) imports and builds nothing; and the host's modules stay
free of the imports a host never needs (smaller USS per host process)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.placement.hosts.host import SessionHost
from actors.placement.hosts.setup import ConfigSetupFactory
from actors.placement.hosts.support import WARM_UP_SESSION_KEY
from runtime.config import Config, DatabaseConfig
from runtime.llm.types import AssistantMessage, TextContent, UserMessage
from runtime.memory.db import Database
from runtime.memory.repository import ContextRepository
from tests.actors.session_scripts import ScriptedSetup

ROOT = Path(__file__).resolve().parents[4]
KEY_A = "onebot11:10001:private:42"
KEY_B = "onebot11:10001:group:777"


class _NoDelivery:
    def pick(self, session_key: str) -> Any:  # pragma: no cover - no turn runs here
        raise AssertionError("no delivery expected")


async def _seed(url: str) -> str:
    """One stored exchange for ``KEY_A``; returns its session id."""
    db = Database(url)
    db.create_tables()
    repo = ContextRepository(db)
    sid = await repo.get_or_create_active(KEY_A, model="script/script-model")
    await repo.append_messages(
        sid, [UserMessage(content="hi"), AssistantMessage(content=[TextContent(text="re: hi")])]
    )
    db.dispose()
    return sid


def _modules(host_self: Any) -> list[str]:
    """The module names imported in the host's process (run there by ``__ray_call__``)."""
    return sorted(sys.modules)


@pytest.mark.usefixtures("ray_session")
async def test_a_warmed_host_activates_sessions_without_importing_or_rebuilding(tmp_path: Path) -> None:
    import ray

    url = f"sqlite:///{tmp_path / 'warm.db'}"
    sid_a = await _seed(url)
    markers = tmp_path / "markers"
    config = Config(database=DatabaseConfig(url=url))
    host = SessionHost.remote(config, ScriptedSetup(str(markers)), _NoDelivery(), 2)  # type: ignore[attr-defined]
    try:
        pid = await host.ping.remote()  # answers once the warm-up ended
        await host.__ray_call__.remote(_modules)  # the probe's own first-call imports
        blank = await host.__ray_call__.remote(_modules)
        status = await host.status.remote()
        assert (status["pid"], status["live"], status["cap"], status["activated"]) == (pid, 0, 2, 0)
        assert sorted(p.name for p in markers.glob("prepare-*")) == [f"prepare-{pid}-1"]

        a = await host.activate.remote(KEY_A, 1, "no-router")
        assert {k: a[k] for k in ("session_id", "messages", "pid", "live")} == {
            "session_id": sid_a,
            "messages": 2,
            "pid": pid,
            "live": 1,
        }
        assert await host.__ray_call__.remote(_modules) == blank  # the first activation imported nothing

        b = await host.activate.remote(KEY_B, 2, "no-router")  # a second session beside it
        assert {k: b[k] for k in ("session_id", "messages", "live")} == {
            "session_id": f"{KEY_B}#1",
            "messages": 0,
            "live": 2,
        }
        assert await host.passivate.remote(KEY_A) is True
        again = await host.activate.remote(KEY_A, 3, "no-router")  # re-activated from SQL
        assert {k: again[k] for k in ("session_id", "messages", "live")} == {
            "session_id": sid_a,
            "messages": 2,
            "live": 2,
        }
        assert await host.__ray_call__.remote(_modules) == blank
        # one build of the factory's session-independent part per process, however many sessions
        assert sorted(p.name for p in markers.glob("prepare-*")) == [f"prepare-{pid}-1"]
    finally:
        ray.kill(host, no_restart=True)
    # the warm-up only read: no row for its placeholder key
    db = Database(url)
    assert await ContextRepository(db).list_sessions(WARM_UP_SESSION_KEY) == []
    db.dispose()


def test_config_setup_factory_builds_the_session_independent_part_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'f.db'}"
    Database(url).create_tables()
    factory = ConfigSetupFactory(Config(database=DatabaseConfig(url=url)))
    factory.prepare()
    shared = factory._shared
    a, b = factory(KEY_A), factory(KEY_B)
    assert factory._shared is shared and a.model is b.model
    assert (
        [t.name for t in a.tools]
        == [t.name for t in b.tools]
        == ["chat_history", "clock", "echo", "count_slowly"]
    )
    assert a.tools[1] is b.tools[1] and a.tools[0] is not b.tools[0]  # chat_history is bound per scene
    assert a.model.ref() == "builtin/sessionray-builtin"
    clone = pickle.loads(pickle.dumps(factory))  # travels without its process-local parts
    assert (clone._shared, clone._db) == (None, None)
    assert [t.name for t in clone(KEY_A).tools] == ["chat_history", "clock", "echo", "count_slowly"]
    actor_db = Database(url)  # the session host shares its database with the chat_history tool
    sharing = ConfigSetupFactory(Config(database=DatabaseConfig(url=url)))
    sharing.prepare(database=actor_db)
    assert sharing._db is actor_db and factory._db is not actor_db
    actor_db.dispose()


def test_host_modules_do_not_import_what_a_host_never_needs() -> None:
    code = (
        "import sys, actors.placement.hosts.host, runtime.session.core, actors.raylife.metrics,"
        " runtime.metrics\n"
        "heavy = ['prometheus_client', 'starlette', 'uvicorn', 'mcp', 'httpx',\n"
        "         'actors.inbound.ingress', 'actors.placement.router',\n"
        "         'actors.placement.hosts.supervisor', 'actors.placement.runtime']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "from runtime.metrics import PrometheusBackend\n"
        "import prometheus_client\n"
        "print(PrometheusBackend().registry is prometheus_client.REGISTRY)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["[]", "True"]


def test_a_host_process_imports_httpx_without_its_cli() -> None:
    code = (
        "import sys\n"
        "from actors.placement.hosts.support import skip_httpx_cli\n"
        "skip_httpx_cli()\n"
        "import httpx, providers.transport\n"
        "print(sorted(m for m in ('click', 'pygments', 'rich') if m in sys.modules))\n"
        "print(httpx.Client(timeout=1.0).timeout == httpx.Timeout(1.0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["[]", "True"]

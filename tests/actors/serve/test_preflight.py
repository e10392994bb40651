"""The start-up pre-flight's parts (issue 19, items 2-3): which variables and directories a
configuration needs, the database and port checks, the report and its exit code, the ingress
server announcing "ready" only once it listens, and the operator notes of the banner."""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from actors.serve.banner import admin_token_for_run, banner, quiet_ray_auth
from actors.serve.main import IngressServer
from actors.serve.preflight import (
    EXIT_CONFIG,
    EXIT_DATABASE,
    EXIT_ENVIRONMENT,
    EXIT_PORT,
    PortInUseError,
    PreflightFailed,
    Problem,
    database_problems,
    environment_problems,
    open_listeners,
    port_problem,
    run_checks,
)
from runtime.config import parse_config
from runtime.config.requirements import EnvRef, directory_problems, env_references, missing_env

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def listening() -> Iterator[int]:
    """A port some other program listens on (127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def two_bots_two_providers(tmp_path: Path):  # type: ignore[no-untyped-def]
    return parse_config(
        {
            "bots": [
                {
                    "platform": "onebot11",
                    "self_id": "1",
                    "access_token_env": "PF_OB_TOKEN",
                    "secret_env": "PF_OB_SECRET",
                    "media_dir": str(tmp_path / "missing"),
                },
                {"platform": "telegram", "self_id": "2", "token_env": "PF_TG", "secret_env": "PF_OB_SECRET"},
            ],
            "ai": {
                "providers": {
                    "a": {"api": "openai-completions", "api_key_env": "PF_KEY_A"},
                    "b": {"api": "anthropic-messages"},
                }
            },
        }
    )


# --------------------------------------------------------------------------- config requirements


def test_env_references_name_every_key_in_config_order(tmp_path: Path) -> None:
    assert env_references(two_bots_two_providers(tmp_path)) == [
        EnvRef("bots[0].access_token_env", "PF_OB_TOKEN"),
        EnvRef("bots[0].secret_env", "PF_OB_SECRET"),
        EnvRef("bots[1].secret_env", "PF_OB_SECRET"),
        EnvRef("bots[1].token_env", "PF_TG"),
        EnvRef("ai.providers.a.api_key_env", "PF_KEY_A"),
    ]


def test_missing_env_lists_all_unset_and_blank_ones_at_once(tmp_path: Path) -> None:
    config = two_bots_two_providers(tmp_path)
    env = {"PF_OB_TOKEN": "t", "PF_TG": "  \n", "PF_KEY_A": "k"}
    assert [(r.key, r.var) for r in missing_env(config, env)] == [
        ("bots[0].secret_env", "PF_OB_SECRET"),
        ("bots[1].secret_env", "PF_OB_SECRET"),
        ("bots[1].token_env", "PF_TG"),
    ]
    assert missing_env(config, {"PF_OB_TOKEN": "t", "PF_OB_SECRET": "s", "PF_TG": "x", "PF_KEY_A": "k"}) == []


def test_directory_problems_name_the_key_and_the_cause(tmp_path: Path) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    tools = tmp_path / "tools"
    tools.mkdir()
    config = parse_config(
        {
            "bots": [
                {"platform": "console", "media_dir": str(tmp_path / "nope")},
                {"platform": "onebot11", "self_id": "1", "media_dir": str(a_file)},
                {"platform": "onebot11", "self_id": "2", "media_dir": str(tmp_path)},
            ],
            "ai": {"tools_dir": str(tools)},
        }
    )
    assert directory_problems(config) == [
        f"bots[0].media_dir: {tmp_path / 'nope'} does not exist",
        f"bots[1].media_dir: {a_file} is not a directory",
    ]


def test_environment_problems_group_one_variable_named_twice(tmp_path: Path) -> None:
    problems = environment_problems(two_bots_two_providers(tmp_path), {"PF_OB_TOKEN": "t", "PF_KEY_A": "k"})
    assert problems == [
        Problem(
            EXIT_ENVIRONMENT,
            "environment variable PF_OB_SECRET is not set (needed by bots[0].secret_env, bots[1].secret_env)",
        ),
        Problem(EXIT_ENVIRONMENT, "environment variable PF_TG is not set (needed by bots[1].token_env)"),
        Problem(EXIT_ENVIRONMENT, f"bots[0].media_dir: {tmp_path / 'missing'} does not exist"),
    ]


def test_a_bad_tool_md_is_a_configuration_problem(tmp_path: Path) -> None:
    (tmp_path / "broken.tool.md").write_text("no frontmatter here\n")
    problems = environment_problems(parse_config({"ai": {"tools_dir": str(tmp_path)}}), {})
    assert len(problems) == 1 and problems[0].code == EXIT_CONFIG
    assert problems[0].text.startswith(f"ai.tools_dir: {tmp_path / 'broken.tool.md'}")


def test_a_python_tool_that_does_not_import_is_a_configuration_problem() -> None:
    problems = environment_problems(parse_config({"ai": {"python_tools": ["pf_no_such_module:tool"]}}), {})
    assert [p.code for p in problems] == [EXIT_CONFIG]
    assert problems[0].text.startswith("ai.python_tools: pf_no_such_module:tool")


def test_a_faux_script_that_does_not_import_is_a_configuration_problem() -> None:
    provider = {"api": "faux", "script": "pf_no_such_module:answer", "models": [{"id": "m"}]}
    problems = environment_problems(parse_config({"ai": {"providers": {"s": provider}}}), {})
    assert [p.code for p in problems] == [EXIT_CONFIG]
    assert problems[0].text.startswith("ai.providers.*.script: pf_no_such_module:answer: cannot be imported")


# --------------------------------------------------------------------------- database


def test_sqlite_in_a_directory_still_to_create_is_fine_and_nothing_is_created(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/a/b/s.db"
    assert database_problems(url) == []
    assert list(tmp_path.iterdir()) == []


def test_sqlite_existing_database_is_fine(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.close()
    assert database_problems(f"sqlite:///{db}") == []


def test_sqlite_problems_name_database_url(tmp_path: Path) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("a file where the directory should be")
    assert database_problems(f"sqlite:///{blocker}/s.db") == [
        Problem(
            EXIT_DATABASE,
            f"database.url sqlite:///{blocker}/s.db: {blocker} is not a directory "
            f"(the database file would be {blocker}/s.db)",
        )
    ]
    not_db = tmp_path / "notes.db"
    not_db.write_text("these are my notes, not a database")
    assert database_problems(f"sqlite:///{not_db}") == [
        Problem(EXIT_DATABASE, f"database.url sqlite:///{not_db}: {not_db} is not a SQLite database")
    ]
    assert database_problems(f"sqlite:///{tmp_path}") == [
        Problem(
            EXIT_DATABASE,
            f"database.url sqlite:///{tmp_path}: {tmp_path} is a directory, not a database file",
        )
    ]


def test_unsupported_or_unparsable_url() -> None:
    [problem] = database_problems("mysql://u:secret@h/db")
    assert problem.code == EXIT_DATABASE
    assert problem.text.startswith("database.url: unsupported database backend 'mysql'")
    assert "secret" not in problem.text


def test_postgres_reachable(pg_url: str) -> None:
    assert database_problems(pg_url) == []


def test_postgres_unreachable_names_the_url_without_password() -> None:
    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        [problem] = database_problems(f"postgresql://sr:hunter2@127.0.0.1:{port}/sr")
    assert problem.code == EXIT_DATABASE
    assert problem.text.startswith(
        f"database.url postgresql+psycopg://sr:***@127.0.0.1:{port}/sr: cannot connect: "
    )
    assert "refused" in problem.text.lower() and "hunter2" not in problem.text


# --------------------------------------------------------------------------- ports


def this_process() -> str:
    """How a port holder is named: this test process's pid and command line (≤ 120 characters)."""
    cmd = " ".join(" ".join(psutil.Process().cmdline()).split())
    return f"pid {os.getpid()}: {cmd if len(cmd) <= 120 else cmd[:119] + '…'}"


def test_port_in_use_names_address_purpose_holder_and_fix(listening: int) -> None:
    assert port_problem("127.0.0.1", listening, "the HTTP ingress; server.port or --port") == Problem(
        EXIT_PORT,
        f"port {listening} on 127.0.0.1 (the HTTP ingress; server.port or --port): Address already in use"
        f" — stop what listens there ({this_process()}) or choose another port",
    )
    # Ray's metrics agent binds every interface: a loopback listener blocks it too
    problem = port_problem("", listening, "metrics")
    assert problem is not None and problem.text.startswith(f"port {listening} on 0.0.0.0 (metrics)")


def test_free_port_and_port_zero_are_fine() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert port_problem("127.0.0.1", free, "x") is None
    assert port_problem("127.0.0.1", 0, "x") is None


def test_open_listeners_binds_once_and_refuses_a_second_bind() -> None:
    socks = open_listeners("127.0.0.1", 0)
    try:
        port = socks[0].getsockname()[1]
        assert port > 0 and len(socks) == 1
        socks[0].listen()
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1"):
            open_listeners("127.0.0.1", port)
    finally:
        for s in socks:
            s.close()


def test_run_checks_collects_every_class_and_the_most_basic_sets_the_exit_code(
    tmp_path: Path, listening: int
) -> None:
    config = parse_config(
        {
            "bots": [{"platform": "onebot11", "self_id": "1", "secret_env": "PF_UNSET_SECRET"}],
            "database": {"url": f"sqlite:///{tmp_path}/ok.db"},
        }
    )
    problems = run_checks(config, host="127.0.0.1", port=listening, metrics_port=listening, environ={})
    assert [p.code for p in problems] == [EXIT_ENVIRONMENT, EXIT_PORT, EXIT_PORT]
    failed = PreflightFailed(problems)
    assert failed.exit_code == EXIT_ENVIRONMENT
    report = failed.report("sessionray serve")
    assert (
        report.splitlines()[0]
        == "sessionray serve: 3 problems found before starting Ray (Ray was not started):"
    )
    assert (
        "  environment:\n    - environment variable PF_UNSET_SECRET is not set (needed by bots[0].secret_env)"
        in report
    )
    assert report.splitlines()[-1] == "sessionray serve: exit code 3 (environment)"
    # joining a cluster (metrics_port None) and a caller that binds HTTP itself: no port checks
    assert (
        run_checks(
            config,
            host="127.0.0.1",
            port=listening,
            metrics_port=None,
            environ={"PF_UNSET_SECRET": "s"},
            check_http_port=False,
        )
        == []
    )


# --------------------------------------------------------------------------- ready after bind


async def test_ingress_server_announces_ready_only_once_it_accepts_connections() -> None:
    app = Starlette(routes=[Route("/healthz", lambda request: PlainTextResponse("ok"))])
    socks = open_listeners("127.0.0.1", 0)
    port = socks[0].getsockname()[1]
    accepted: list[bool] = []

    def ready() -> None:
        # run synchronously where "ready" is printed: the kernel must already accept the connection
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            accepted.append(True)
        server.should_exit = True

    server = IngressServer(
        uvicorn.Config(app, loop="none", lifespan="off", log_level="warning"), on_ready=ready
    )
    await asyncio.wait_for(server.serve(sockets=socks), timeout=60)
    assert accepted == [True]


async def test_ingress_server_turns_a_listen_failure_into_port_in_use() -> None:
    """The port is taken between binding (before Ray starts) and listening (after): another
    SO_REUSEADDR socket bound to it and listened first, so our listen() fails."""
    app = Starlette()
    stolen = socket.socket()
    stolen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    stolen.bind(("127.0.0.1", 0))
    port = stolen.getsockname()[1]
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind(("127.0.0.1", port))
    other.listen()
    announced: list[str] = []
    server = IngressServer(
        uvicorn.Config(app, loop="none", lifespan="off", log_level="warning"),
        on_ready=lambda: announced.append("ready"),
    )
    try:
        with pytest.raises(PortInUseError, match=r"the HTTP ingress; server\.port or --port"):
            await asyncio.wait_for(server.serve(sockets=[stolen]), timeout=60)
    finally:
        stolen.close()
        other.close()
    assert announced == []


# --------------------------------------------------------------------------- banner notes


def test_admin_token_for_run_generates_only_when_unset() -> None:
    config = parse_config({})
    env: dict[str, str] = {}
    token = admin_token_for_run(config, env)
    assert token and env == {"SESSIONRAY_ADMIN_TOKEN": token} and len(token) >= 32
    assert admin_token_for_run(config, env) is None and env["SESSIONRAY_ADMIN_TOKEN"] == token
    assert admin_token_for_run(parse_config({"server": {"admin_token_env": None}}), {}) is None


def test_banner_tells_how_to_use_the_admin_cli() -> None:
    on_path = str(Path(sys.executable).parent)  # the venv's bin on PATH: the bare name runs it
    config = parse_config({"server": {"admin_token_env": "MY_ADMIN"}})
    env = {"MY_ADMIN": "tok", "PATH": on_path}
    lines = banner(config, "sessionray.yaml", "127.0.0.1", 8123, 8090, generated_token="tok", environ=env)
    assert (
        "sessionray: admin token    generated for this instance (kept across a planned restart); "
        "admin CLI in another shell: export MY_ADMIN=tok; "
        "sessionray status --url http://127.0.0.1:8123 --token-env MY_ADMIN"
    ) in lines
    env = {"SESSIONRAY_ADMIN_TOKEN": "x", "PATH": on_path}
    default = banner(parse_config({}), "<defaults>", "0.0.0.0", 8000, None, environ=env)
    assert (
        "sessionray: admin CLI      sessionray status  (with $SESSIONRAY_ADMIN_TOKEN set to the same value "
        "in that shell)"
    ) in default
    off = banner(parse_config({}), "<defaults>", "127.0.0.1", 8000, None, environ={"PATH": on_path})
    assert (
        "sessionray: admin API      disabled (set SESSIONRAY_ADMIN_TOKEN before starting, or start with "
        "--dev-admin-token as `make run` does)"
    ) in off
    assert any("`sessionray init` writes a commented one" in line for line in off)


def test_banner_spells_the_cli_as_a_shell_without_the_venv_on_path_runs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    script = Path(sys.executable).parent / "sessionray"
    monkeypatch.chdir(ROOT)
    env = {"SESSIONRAY_ADMIN_TOKEN": "x", "PATH": "/usr/bin:/bin"}
    lines = banner(parse_config({}), "<defaults>", "127.0.0.1", 8000, None, environ=env)
    shown = str(script.relative_to(ROOT)) if script.is_relative_to(ROOT) else str(script)
    assert (
        f"sessionray: admin CLI      {shown} status  (with $SESSIONRAY_ADMIN_TOKEN set to the same value "
        "in that shell)"
    ) in lines
    assert any(f"`{shown} init` writes a commented one" in line for line in lines)
    assert shown != "sessionray" and Path(ROOT, shown).is_file()  # a command that runs


def test_quiet_ray_auth_asks_for_token_mode_and_respects_the_operator(tmp_path: Path) -> None:
    env: dict[str, str] = {"HOME": str(tmp_path)}
    assert "token authentication on" in quiet_ray_auth(env)
    assert env == {"HOME": str(tmp_path), "RAY_AUTH_MODE": "token"}
    env = {"HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    assert quiet_ray_auth(env).endswith("token authentication disabled (RAY_AUTH_MODE=disabled)")
    assert env == {"HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled"}


def test_banner_names_the_console_master_token() -> None:
    """docs/decisions.md#security-console-master-proof: ``make run``'s banner says the console
    master logs in with the admin token (and gives the URL that fills it in); without a token set
    it says no one can act as master, since a name alone grants nothing."""
    made = banner(parse_config({}), "<defaults>", "127.0.0.1", 8000, None, generated_token="tok",
                  environ={"SESSIONRAY_ADMIN_TOKEN": "tok"})  # fmt: skip
    assert made[-1] == (
        "sessionray: console master admin with the admin token as master token, e.g. open "
        "http://127.0.0.1:8000/console#master=tok"
    )
    own = parse_config(
        {"bots": [{"platform": "console", "masters": ["ann", "bo"], "master_token_env": "PW"}]}
    )
    assert banner(own, "x", "127.0.0.1", 8000, None, environ={"PW": "p"})[-1] == (
        "sessionray: console master ann, bo with the master token ($PW)"
    )
    assert banner(parse_config({}), "<defaults>", "127.0.0.1", 8000, None, environ={})[-1] == (
        "sessionray: console master admin: no master token is set, so none can act as master; set "
        "SESSIONRAY_ADMIN_TOKEN (a name alone grants nothing)"
    )


def test_serve_replica_names_every_missing_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The Ray Serve replica (``actors/serve/app.py``) runs the environment checks before it starts."""
    from actors.serve.app import SessionrayIngress

    replica_class = SessionrayIngress.func_or_class.__bases__[0]  # ours, under Serve's ASGI wrapper
    config_file = tmp_path / "sessionray.yaml"
    config_file.write_text(
        "bots: [{platform: onebot11, self_id: '1', access_token_env: PF_R_TOKEN, secret_env: PF_R_SECRET}]\n"
    )
    monkeypatch.delenv("PF_R_TOKEN", raising=False)
    monkeypatch.delenv("PF_R_SECRET", raising=False)
    with pytest.raises(ValueError) as err:
        replica_class(str(config_file))
    assert str(err.value) == (
        "sessionray ingress replica: 2 problems found:\n"
        "  environment:\n"
        "    - environment variable PF_R_TOKEN is not set (needed by bots[0].access_token_env)\n"
        "    - environment variable PF_R_SECRET is not set (needed by bots[0].secret_env)"
    )
    monkeypatch.setenv("PF_R_TOKEN", "t")
    monkeypatch.setenv("PF_R_SECRET", "s")
    assert replica_class(str(config_file)).runtime is None


def test_every_env_key_of_the_config_model_is_checked_or_deliberately_optional() -> None:
    """A new ``*_env`` key must be added to :mod:`runtime.config.requirements` (or declared optional
    here, like ``server.admin_token_env``: unset means the admin API is off; and a console bot's
    ``master_token_env``: unset means the console has no master, which the banner says)."""
    from pydantic import BaseModel

    from runtime.config import Config
    from runtime.config.requirements import BOT_SECRET_KEYS

    def env_keys(model: type[BaseModel], prefix: str, seen: set[type]) -> set[str]:
        out: set[str] = set()
        seen.add(model)
        for name, field in model.model_fields.items():
            if name.endswith("_env"):
                out.add(prefix + name)
            for sub in _models_in(field.annotation):
                if sub not in seen:
                    out |= env_keys(sub, f"{prefix}{name}.", seen)
        return out

    checked = {f"bots.{k}" for k in BOT_SECRET_KEYS} | {"ai.providers.api_key_env"}
    assert env_keys(Config, "", set()) == checked | {"server.admin_token_env", "bots.master_token_env"}


def _models_in(annotation: object) -> list[type]:
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]

"""The start-up pre-flight: everything ``sessionray serve`` can check before it starts Ray
(`docs/decisions.md#ops-preflight-before-ray`), and the ``sessionray check`` command that runs it alone.

Checks, each reported with the config key or option that asks for it:

* **environment** — every variable the configuration names (``bots[].access_token_env`` /
  ``secret_env`` / ``token_env``, ``ai.providers.<alias>.api_key_env``) is set; every
  ``bots[].media_dir`` and ``ai.tools_dir`` is a readable directory
  (:mod:`runtime.config.requirements`); the business tools (``ai.python_tools``, the
  ``*.tool.md`` of ``ai.tools_dir``) and every faux ``ai.providers.<alias>.script`` load — a bad
  one is a configuration problem;
* **database** — ``database.url`` parses; PostgreSQL answers ``SELECT 1`` (5 s connect timeout);
  SQLite: the file's directory exists or can be created and is writable, and an existing file is
  a SQLite database. Nothing is created or written;
* **ports** — the HTTP port (``server.port`` / ``--port`` on ``server.host`` / ``--host``) and,
  when sessionray starts a local Ray, Ray's metrics export port (``--metrics-export-port``,
  bound by Ray's metrics agent on every interface) can be bound. The local Ray is started
  without its dashboard (``include_dashboard=False``), so no dashboard port is needed. A port in
  use is reported with the process that listens there (pid and command line). ``sessionray
  serve`` first stops what a crashed ``sessionray serve`` of this user left of its local Ray
  (:mod:`actors.raylife.stale`, docs/decisions.md#ops-stale-ray), so such leftovers never block it.

All problems are found in one pass and printed as one message; the exit code names the class of
the most basic one (:data:`EXIT_CODES`). Nothing here imports Ray.

Exit codes of ``sessionray serve`` and ``sessionray check``:

====  ==========================================================================
0     fine (``serve``: stopped normally)
2     configuration or usage: invalid ``sessionray.yaml`` or option, a bad ``*.tool.md``, a
      configuration the Ray cluster cannot run (SQLite on several nodes)
3     environment: a variable the configuration names is unset; a directory is missing/unreadable;
      (``serve``) Ray's token file cannot be created or ``RAY_AUTH_TOKEN_PATH`` names no token
4     database: ``database.url`` unparsable, unreachable, or its SQLite directory not writable
5     port in use (or not bindable): the HTTP port or Ray's metrics export port
6     (``serve``) Ray did not start: ``ray start --head`` failed, or ``--address`` could not be joined
====  ==========================================================================
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from actors.raylife.port_holders import port_holders_text
from actors.raylife.repo_root import ensure_repo_root_on_path
from runtime.config import Config, ConfigError, load_config
from runtime.config.requirements import directory_problems, env_references, missing_env
from runtime.memory.db import DatabaseUrlError, normalize_url

__all__ = [
    "DEFAULT_METRICS_EXPORT_PORT",
    "EPILOG",
    "EXIT_CODES",
    "EXIT_CONFIG",
    "EXIT_DATABASE",
    "EXIT_ENVIRONMENT",
    "EXIT_PORT",
    "EXIT_RAY",
    "PortInUseError",
    "PreflightFailed",
    "Problem",
    "StartArgs",
    "add_start_options",
    "check_main",
    "config_source",
    "database_problems",
    "environment_problems",
    "load_start",
    "open_listeners",
    "port_problem",
    "run_checks",
]

EXIT_CONFIG = 2
EXIT_ENVIRONMENT = 3
EXIT_DATABASE = 4
EXIT_PORT = 5
EXIT_RAY = 6
EXIT_CODES: dict[int, str] = {
    EXIT_CONFIG: "configuration",
    EXIT_ENVIRONMENT: "environment",
    EXIT_DATABASE: "database",
    EXIT_PORT: "port in use",
    EXIT_RAY: "Ray did not start",
}
"""Exit code → the class of problem it reports (the module docstring has the table)."""

DEFAULT_METRICS_EXPORT_PORT = 8090
"""Ray's metrics agent port for a local Ray (outside 10002–19999: docs/decisions.md#ops-ray-pitfalls)."""

DB_CONNECT_TIMEOUT_S = 5
"""How long the PostgreSQL check waits for a connection (seconds)."""

_SQLITE_MAGIC = b"SQLite format 3\x00"

HTTP_PORT = "the HTTP ingress; server.port or --port"
METRICS_PORT = "Ray's metrics agent, on every interface; --metrics-export-port"
"""What each checked port is for, and the setting that changes it (shown in problems)."""


@dataclass(frozen=True)
class Problem:
    """One pre-flight finding: ``code`` is its class (:data:`EXIT_CODES`), ``text`` one line that
    names the config key or option involved."""

    code: int
    text: str


@dataclass(frozen=True)
class PreflightFailed:
    """The problems one pre-flight found (at least one): :meth:`report` is the operator's
    message, :attr:`exit_code` the process exit code."""

    problems: list[Problem]

    @property
    def exit_code(self) -> int:
        """The most basic class among the problems (configuration < environment < database < port)."""
        return min(p.code for p in self.problems)

    def report(
        self, prog: str, when: str = " before starting Ray (Ray was not started)", exit_line: bool = True
    ) -> str:
        """The operator's message: ``<prog>: N problems found<when>:``, the problems grouped by
        class, then (``exit_line``) the exit code and its meaning."""
        n = len(self.problems)
        lines = [f"{prog}: {n} problem{'s' * (n != 1)} found{when}:"]
        for code, title in EXIT_CODES.items():
            texts = [p.text for p in self.problems if p.code == code]
            if texts:
                lines.append(f"  {title}:")
                lines += [f"    - {t}" for t in texts]
        if exit_line:
            lines.append(f"{prog}: exit code {self.exit_code} ({EXIT_CODES[self.exit_code]})")
        return "\n".join(lines)


class PortInUseError(OSError):
    """A listening port cannot be bound; the message names the address, what it is for and the
    option to change it."""


# --------------------------------------------------------------------------- ports


def open_listeners(host: str, port: int, what: str = HTTP_PORT) -> list[socket.socket]:
    """Bind (not yet listen) TCP sockets for ``host``:``port`` the way asyncio's ``create_server``
    does (``SO_REUSEADDR``; IPv6 sockets ``IPV6_V6ONLY``; one socket per address ``host``
    resolves to, ``""`` = every interface). Port 0: a free port, the same for every address
    (read it with ``socks[0].getsockname()[1]``). The caller owns (and closes) the sockets.

    Raises:
        PortInUseError: an address cannot be bound (in use, not on this machine, privileged);
            the message names ``host:port``, ``what`` and, for a port in use, the process that
            listens there (pid and command line: :mod:`actors.raylife.port_holders`).
    """
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        cause = f"cannot resolve {host!r}: {exc.strerror}"
        raise PortInUseError(f"port {port} on {host} ({what}): {cause}") from None
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _name, addr in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((addr[0], port, *addr[2:]))
                port = port or sock.getsockname()[1]  # port 0: every address on the port the first got
            except OSError as exc:
                fix = ""
                if exc.errno == errno.EADDRINUSE:  # name the holder (docs/decisions.md#ops-stale-ray)
                    held = port_holders_text(port)
                    fix = f" — stop what listens there{f' ({held})' if held else ''} or choose another port"
                cause = exc.strerror or str(exc)
                raise PortInUseError(f"port {port} on {addr[0]} ({what}): {cause}{fix}") from None
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def port_problem(host: str, port: int, what: str) -> Problem | None:
    """Bind ``host``:``port`` and release it at once; a :class:`Problem` (class 5) if it fails.
    Port 0 (any free port) is always fine."""
    if port == 0:
        return None
    try:
        socks = open_listeners(host, port, what)
    except PortInUseError as exc:
        return Problem(EXIT_PORT, str(exc))
    for sock in socks:
        sock.close()
    return None


# --------------------------------------------------------------------------- database


def _sqlite_problem(database: str) -> str | None:
    path = Path(database)
    existing = path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory (the database file would be {path})"
    if not os.access(existing, os.W_OK | os.X_OK):
        return (
            f"directory {existing} is not writable (SQLite writes {path.name}, its -wal/-shm files "
            "and a writer lock there)"
        )
    if path.is_dir():
        return f"{path} is a directory, not a database file"
    if path.exists():
        if not os.access(path, os.R_OK | os.W_OK):
            return f"{path} is not readable and writable by this user"
        with path.open("rb") as f:
            head = f.read(len(_SQLITE_MAGIC))
        if head and head != _SQLITE_MAGIC:
            return f"{path} is not a SQLite database"
    return None


def database_problems(url: str | None) -> list[Problem]:
    """Check ``database.url`` without creating or writing anything (see the module docstring).

    Returns:
        At most one :class:`Problem` (class 4) whose text names ``database.url`` (password shown
        as ``***``) and the cause.
    """
    try:
        parsed = normalize_url(url)
    except DatabaseUrlError as exc:
        return [Problem(EXIT_DATABASE, f"database.url: {exc}")]
    shown = parsed.render_as_string(hide_password=True)
    if parsed.get_backend_name() == "sqlite":
        problem = _sqlite_problem(str(parsed.database))
        return [Problem(EXIT_DATABASE, f"database.url {shown}: {problem}")] if problem else []
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    engine = create_engine(parsed, poolclass=NullPool, connect_args={"connect_timeout": DB_CONNECT_TIMEOUT_S})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error: show its first line (psycopg never echoes the password)
        cause = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [repr(exc)])[0]
        return [Problem(EXIT_DATABASE, f"database.url {shown}: cannot connect: {cause}")]
    finally:
        engine.dispose()
    return []


# --------------------------------------------------------------------------- all checks


def environment_problems(config: Config, environ: Mapping[str, str] | None = None) -> list[Problem]:
    """Unset variables (class 3, all of them, grouped by variable), unreadable directories (class 3),
    ``*.tool.md`` files that do not load, a faux ``script`` that cannot be imported and a custom
    output schema that cannot be used (class 2)."""
    by_var: dict[str, list[str]] = {}
    for ref in missing_env(config, environ):
        by_var.setdefault(ref.var, []).append(ref.key)
    problems = [
        Problem(EXIT_ENVIRONMENT, f"environment variable {var} is not set (needed by {', '.join(keys)})")
        for var, keys in by_var.items()
    ]
    dirs = directory_problems(config)
    problems += [Problem(EXIT_ENVIRONMENT, d) for d in dirs]
    if not any(d.startswith("ai.tools_dir:") for d in dirs):
        from actors.placement.hosts.setup import business_tools
        from runtime.config.entry_points import PythonToolError
        from runtime.session.tool_md import ToolMdError

        ensure_repo_root_on_path()
        try:
            business_tools(config)
        except ToolMdError as exc:
            problems.append(Problem(EXIT_CONFIG, f"ai.tools_dir: {exc}"))
        except PythonToolError as exc:
            problems.append(Problem(EXIT_CONFIG, f"ai.python_tools: {exc}"))
    if any(p.script for p in config.ai.providers.values()):
        from actors.models.faux_script import faux_scripts
        from runtime.config.entry_points import PythonToolError

        ensure_repo_root_on_path()
        try:
            faux_scripts(config.ai.providers)
        except PythonToolError as exc:
            problems.append(Problem(EXIT_CONFIG, f"ai.providers.*.script: {exc}"))
    if config.ai.agent.output_schema not in ("segments", False):
        from actors.placement.hosts.setup import output_schema
        from runtime.reply.custom_output import OutputSchemaError

        ensure_repo_root_on_path()
        try:
            output_schema(config)
        except OutputSchemaError as exc:
            problems.append(Problem(EXIT_CONFIG, f"ai.agent.output_schema: {exc}"))
    return problems


def run_checks(
    config: Config,
    *,
    host: str,
    port: int,
    metrics_port: int | None,
    environ: Mapping[str, str] | None = None,
    check_http_port: bool = True,
) -> list[Problem]:
    """Every pre-flight check; an empty list means ready to start.

    Args:
        config: The loaded configuration.
        host, port: The HTTP address that will be served (options already applied).
        metrics_port: Ray's metrics export port when a local Ray will be started; ``None`` when
            joining a cluster (``--address``: the cluster's nodes own their ports).
        environ: Where variables are looked up (default ``os.environ``).
        check_http_port: False when the caller binds the HTTP port itself right after.
    """
    problems = environment_problems(config, environ)
    problems += database_problems(config.database.url)
    if check_http_port and (p := port_problem(host, port, HTTP_PORT)):
        problems.append(p)
    if metrics_port and (p := port_problem("", metrics_port, METRICS_PORT)):
        problems.append(p)
    return problems


def add_start_options(p: argparse.ArgumentParser) -> None:
    """The options ``serve`` and ``check`` share: ``--config``, ``--address``, ``--host``,
    ``--port``, ``--metrics-export-port``."""
    p.add_argument(
        "--config", metavar="FILE", help="YAML configuration (default: ./sessionray.yaml, else defaults)"
    )
    p.add_argument(
        "--address",
        metavar="RAY_ADDRESS",
        help="join a running Ray cluster (e.g. auto or 10.0.0.5:6379); default: start a local Ray",
    )
    p.add_argument("--host", help="override server.host")
    p.add_argument("--port", type=int, help="override server.port")
    p.add_argument(
        "--metrics-export-port",
        type=int,
        default=DEFAULT_METRICS_EXPORT_PORT,
        help=f"Ray metrics agent port for a local Ray (default {DEFAULT_METRICS_EXPORT_PORT})",
    )


EPILOG = (
    "exit codes: 0 fine; 2 configuration or usage; 3 environment (unset variable, missing "
    "directory, Ray's token); 4 database; 5 port in use; 6 Ray did not start (serve)"
)


def config_source(path: str | None) -> str:
    """Where :func:`runtime.config.load_config` reads from: ``path``, ``sessionray.yaml`` in the
    working directory when it exists, else ``<defaults>``."""
    from runtime.config import DEFAULT_CONFIG_FILE

    return path or (DEFAULT_CONFIG_FILE if Path(DEFAULT_CONFIG_FILE).exists() else "<defaults>")


@dataclass(frozen=True)
class StartArgs:
    """What ``serve`` and ``check`` start from: the loaded configuration, the HTTP ``host`` and
    ``port`` after ``--host``/``--port``, and the Ray metrics agent port to check
    (``metrics_port``, None when ``--address`` joins a cluster)."""

    config: Config
    host: str
    port: int
    metrics_port: int | None


def load_start(args: argparse.Namespace, prog: str) -> StartArgs | None:
    """Load ``args.config`` and apply the options of :func:`add_start_options`; without
    ``--address`` (a local Ray: one machine) the ``runtime`` section takes the single-machine
    profile for the keys it leaves unset (docs/decisions.md#ops-single-machine-profile). None when
    the configuration is invalid: its problems were printed as one ``{prog}: ...`` report on
    stderr (the command exits :data:`EXIT_CONFIG`)."""
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    if not args.address:
        runtime = config.runtime.single_machine(config.database.url)
        config = config.model_copy(update={"runtime": runtime})
    return StartArgs(
        config=config,
        host=args.host or config.server.host,
        port=config.server.port if args.port is None else args.port,
        metrics_port=None if args.address else args.metrics_export_port,
    )


def check_main(argv: list[str]) -> int:
    """``sessionray check [--config FILE] [--host H] [--port P] [--address A]``: run the pre-flight
    only; print one summary (OK) or the problems; return the exit code (module docstring)."""
    p = argparse.ArgumentParser(
        prog="sessionray check",
        description="Check a configuration and this machine (variables, directories, database, ports) "
        "without starting anything.",
        epilog=EPILOG,
    )
    add_start_options(p)
    args = p.parse_args(argv)
    if (start := load_start(args, "sessionray check")) is None:
        return EXIT_CONFIG
    config, host, port, metrics = start.config, start.host, start.port, start.metrics_port
    problems = run_checks(config, host=host, port=port, metrics_port=metrics)
    if problems:
        failed = PreflightFailed(problems)
        print(failed.report("sessionray check", when=""), file=sys.stderr)
        return failed.exit_code
    ports = f"{host}:{port}" + (f" and Ray metrics :{metrics}" if metrics else "")
    shown = normalize_url(config.database.url).render_as_string(hide_password=True)
    variables = len({ref.var for ref in env_references(config)})
    print(
        f"sessionray check: OK — configuration {config_source(args.config)}; "
        f"{variables} environment variable(s) set; database {shown} usable; {ports} free"
    )
    return 0

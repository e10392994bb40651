"""Control commands of the ``sessionray`` CLI: clients of the admin API.

They talk HTTP to a running ingress (``--url``, default ``$SESSIONRAY_URL`` or
``http://127.0.0.1:8000``) with the bearer token read from the environment variable
``--token-env`` (default ``SESSIONRAY_ADMIN_TOKEN``), so they work the same against a local
``sessionray serve`` and a remote cluster::

    sessionray sessions
    sessionray status
    sessionray models
    sessionray steer onebot11:10001:group:123 "stop and summarize" --as 20002
    sessionray follow-up onebot11:10001:group:123 "then list sources" --as 20002
    sessionray abort onebot11:10001:group:123
    sessionray archive onebot11:10001:group:123
    sessionray deliveries --state failed
    sessionray deliveries --retry 'onebot11:10001:private:20002#1/m42'

Output: ``sessions`` and ``status`` print fixed-width tables, the other commands one sentence;
``--json`` prints the server's JSON answer as is. Exit codes (:data:`EXIT_CODES`): 0 success; 1 the
admin API refused or failed (its error is printed: 400 malformed key, 401 token, 403 not a master,
404 unknown session, 500 ...); 2 usage error (bad arguments, token variable unset) or the server
could not be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Container
from typing import Any
from urllib.parse import quote

import httpx

__all__ = [
    "EXIT_CODES",
    "abort_main",
    "archive_main",
    "deliveries_main",
    "follow_up_main",
    "models_main",
    "sessions_main",
    "status_main",
    "steer_main",
    "table",
]

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TOKEN_ENV = "SESSIONRAY_ADMIN_TOKEN"

EXIT_CODES = (
    "exit codes: 0 ok; 1 the admin API refused or failed (400 malformed key, 401 token, "
    "403 not a master, 404 unknown session, 500); 2 usage error, token variable unset or "
    "server unreachable"
)
"""The exit-code rule, printed at the end of every control command's ``--help`` (and the
top-level help)."""


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"sessionray {command}", description=description, epilog=EXIT_CODES)
    p.add_argument(
        "--url",
        default=os.environ.get("SESSIONRAY_URL", DEFAULT_URL),
        help=f"base URL of the ingress (default: $SESSIONRAY_URL or {DEFAULT_URL})",
    )
    p.add_argument(
        "--token-env",
        default=DEFAULT_TOKEN_ENV,
        metavar="VAR",
        help=f"environment variable holding the admin bearer token (default {DEFAULT_TOKEN_ENV})",
    )
    p.add_argument("--json", action="store_true", help="print the server's JSON answer as is")
    p.add_argument("--timeout", type=float, default=30.0, help="HTTP timeout in seconds (default 30)")
    return p


def _request(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """Call the admin API; print the error and raise SystemExit(1|2) on failure."""
    token = os.environ.get(args.token_env, "")
    if not token:
        print(
            f"sessionray: ${args.token_env} is not set (the admin API needs its bearer token)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    url = args.url.rstrip("/") + path
    try:
        resp = httpx.request(
            method, url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=args.timeout
        )
    except httpx.HTTPError as exc:
        print(f"sessionray: cannot reach {url}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        data = resp.json()
    except ValueError:
        data = {"error": resp.text}
    if resp.status_code >= 400:
        message = data.get("error") if isinstance(data, dict) else data
        print(f"sessionray: {method} {path}: HTTP {resp.status_code}: {message}", file=sys.stderr)
        raise SystemExit(1)
    return data


def _key_path(key: str) -> str:
    return "/admin/sessions/" + quote(key, safe=":@")


def _print(args: argparse.Namespace, data: Any, human: str) -> int:
    print(json.dumps(data, indent=2, ensure_ascii=False) if args.json else human)
    return 0


def _message(command: str, kind: str, description: str, argv: list[str]) -> int:
    p = _parser(command, description)
    p.add_argument("session_key", metavar="SESSION_KEY", help="platform:bot_id:scope:scene_id")
    p.add_argument("text", metavar="TEXT", help="the message")
    p.add_argument(
        "--as",
        dest="sender_id",
        required=True,
        metavar="USER_ID",
        help="your platform user id (must be one of the bot's masters)",
    )
    args = p.parse_args(argv)
    data = _request(
        args,
        "POST",
        f"{_key_path(args.session_key)}/{kind}",
        {"text": args.text, "sender_id": args.sender_id},
    )
    return _print(args, data, f"{kind}: {data.get('result')}")


def steer_main(argv: list[str]) -> int:
    """``sessionray steer SESSION_KEY TEXT --as USER_ID``: steer the session's running turn."""
    return _message("steer", "steer", "Steer a live session's current turn (masters only).", argv)


def follow_up_main(argv: list[str]) -> int:
    """``sessionray follow-up SESSION_KEY TEXT --as USER_ID``: queue a follow-up message."""
    return _message(
        "follow-up", "follow_up", "Queue a follow-up for after the session's turn (masters only).", argv
    )


def abort_main(argv: list[str]) -> int:
    """``sessionray abort SESSION_KEY``: abort the session's running turn(s)."""
    p = _parser("abort", "Abort a live session's running turn(s).")
    p.add_argument("session_key", metavar="SESSION_KEY", help="platform:bot_id:scope:scene_id")
    args = p.parse_args(argv)
    data = _request(args, "POST", f"{_key_path(args.session_key)}/abort")
    count = data.get("result")
    human = f"aborted {count} running turn{'' if count == 1 else 's'}"
    return _print(args, data, human + (" (none was running)" if count == 0 else ""))


def archive_main(argv: list[str]) -> int:
    """``sessionray archive SESSION_KEY``: archive the session's active epoch (``/new``)."""
    p = _parser(
        "archive",
        "Archive a session's active epoch and continue it in a fresh, empty one (as /new); "
        "works for live and passivated sessions.",
    )
    p.add_argument("session_key", metavar="SESSION_KEY", help="platform:bot_id:scope:scene_id")
    args = p.parse_args(argv)
    data = _request(args, "POST", f"{_key_path(args.session_key)}/archive")
    return _print(args, data, f"archived {args.session_key}: now on {data.get('result')}")


def _cell(value: Any) -> str:
    """One table cell: scalars as text, None as ``-``, nested data as compact JSON."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return str(value)


def table(headers: list[str], rows: list[list[Any]], right: Container[int] = ()) -> str:
    """Fixed-width text table: each column as wide as its widest cell, two spaces between columns,
    a header line; cells by :func:`_cell`, left-aligned except the columns whose index is in
    ``right`` (numbers). Returns the lines joined by ``\n`` (no trailing one)."""
    cells = [headers, *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        pairs = enumerate(zip(r, widths, strict=True))
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in pairs).rstrip()

    return "\n".join(line(r) for r in cells)


SESSION_COLUMNS = (
    ("SESSION KEY", "session_key"),
    ("SESSION ID", "session_id"),
    ("SHARD", "shard"),
    ("HOST", "host"),
    ("TURNS", "turns"),
    ("PENDING", "pending"),
    ("IDLE S", "idle_s"),
)
"""The columns of ``sessionray sessions``: header and ``SessionInfo`` field."""


def sessions_main(argv: list[str]) -> int:
    """``sessionray sessions``: the live sessions as a table (:data:`SESSION_COLUMNS`)."""
    args = _parser("sessions", "List the live sessions.").parse_args(argv)
    data = _request(args, "GET", "/admin/sessions")
    rows = [r for r in (data.get("sessions", []) if isinstance(data, dict) else []) if isinstance(r, dict)]
    lines = [f"{len(rows)} live session{'' if len(rows) == 1 else 's'}"]
    if rows:
        lines.append(
            table([h for h, _ in SESSION_COLUMNS], [[r.get(f) for _, f in SESSION_COLUMNS] for r in rows])
        )
    return _print(args, data, "\n".join(lines))


def _status_text(data: dict[str, Any]) -> str:
    """``/admin/status`` as text: its scalars as a two-column table, each nested object (``supervisor``)
    as one more, each list of objects (``shards``) as a table with one row per item."""
    scalars = [[k, v] for k, v in data.items() if not isinstance(v, dict | list)]
    parts = [table(["RUNTIME", "VALUE"], scalars)]
    for name, value in data.items():
        if isinstance(value, dict):
            parts.append(table([name.upper(), "VALUE"], [[k, v] for k, v in value.items()]))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            columns = list(dict.fromkeys(k for item in value for k in item))
            parts.append(
                table([c.upper() for c in columns], [[item.get(c) for c in columns] for item in value])
            )
        elif isinstance(value, list):
            parts.append(table([name.upper()], [[v] for v in value]))
    return "\n\n".join(parts)


def status_main(argv: list[str]) -> int:
    """``sessionray status``: hosts, live sessions, turns running, recent throughput (tables)."""
    args = _parser(
        "status", "Show the runtime's status (hosts, live sessions, turns, throughput)."
    ).parse_args(argv)
    data = _request(args, "GET", "/admin/status")
    return _print(args, data, _status_text(data) if isinstance(data, dict) else _cell(data))


def models_main(argv: list[str]) -> int:
    """``sessionray models``: each configured model's structured-output tier, source, age and note
    (``default``, ``probed at first use``; on the embedded defaults the built-in offline model)."""
    from runtime.reply.capability import age_text

    args = _parser("models", "List the configured models with their structured-output tier.").parse_args(argv)
    data = _request(args, "GET", "/admin/models")
    rows = data.get("models", []) if isinstance(data, dict) else []
    lines = [f"{'MODEL':<32} {'TIER':<8} {'SOURCE':<10} {'AGE':<8} NOTE"]
    for row in rows:
        age = row.get("age_s")
        shown_age = age_text(age) if age is not None else "-"
        line = (
            f"{row.get('model', '?'):<32} {row.get('tier') or 'unknown':<8} "
            f"{row.get('source') or '-':<10} {shown_age:<8} {row.get('note') or ''}"
        )
        lines.append(line.rstrip())
    if not rows:
        lines.append("(no models)")
    return _print(args, data, "\n".join(lines))


DELIVERY_COLUMNS = (
    ("REPLY ID", "reply_id"),
    ("STATE", "state"),
    ("PLATFORM", "platform"),
    ("BOT", "bot_id"),
    ("SESSION KEY", "session_key"),
    ("AGE S", "age_s"),
    ("STEPS", "steps"),
    ("ERROR", "error"),
)
"""The columns of ``sessionray deliveries``: header and field of ``GET /admin/deliveries``."""


def _steps_text(steps: dict[str, Any]) -> str:
    """``done/total``, then the uncertain steps not resent yet: ``"2/2 uncertain [0]"``."""
    unsure = f" uncertain {steps['uncertain']}" if steps.get("uncertain") else ""
    return f"{steps.get('done')}/{steps.get('total')}{unsure}"


def deliveries_main(argv: list[str]) -> int:
    """``sessionray deliveries [--state failed|uncertain|…] [--retry REPLY_ID]``: list the replies
    that did not go out cleanly (newest first), or queue one again (docs/decisions.md#delivery-uncertain)."""
    p = _parser(
        "deliveries",
        "List failed and uncertain replies (newest first), or retry one: a failed reply is queued "
        "again with a fresh age; an uncertain one sends only its uncertain step(s) again.",
    )
    p.add_argument(
        "--state",
        choices=("failed", "uncertain", "queued", "pending", "sent"),
        help="only replies in this state (default: failed and uncertain)",
    )
    p.add_argument("--limit", type=int, default=50, help="replies per page (default 50, at most 500)")
    p.add_argument("--offset", type=int, default=0, help="skip this many (the answer's next_offset)")
    p.add_argument("--retry", metavar="REPLY_ID", help="queue this failed or uncertain reply again")
    args = p.parse_args(argv)
    if args.retry:
        data = _request(args, "POST", f"/admin/deliveries/{quote(args.retry, safe='')}/retry")
        return _print(args, data, f"queued {args.retry} again (was {data.get('was')})")
    query = f"?limit={args.limit}&offset={args.offset}" + (f"&state={args.state}" if args.state else "")
    data = _request(args, "GET", "/admin/deliveries" + query)
    rows = [r for r in (data.get("deliveries", []) if isinstance(data, dict) else []) if isinstance(r, dict)]
    shown = [{**r, "steps": _steps_text(r.get("steps") or {})} for r in rows]
    counts = data.get("counts", {}) if isinstance(data, dict) else {}
    lines = [", ".join(f"{n} {state}" for state, n in counts.items()) or "no counts"]
    if rows:
        lines.append(
            table([h for h, _ in DELIVERY_COLUMNS], [[r.get(f) for _, f in DELIVERY_COLUMNS] for r in shown])
        )
    if isinstance(data, dict) and data.get("next_offset") is not None:
        lines.append(f"more: --offset {data['next_offset']}")
    return _print(args, data, "\n".join(lines))

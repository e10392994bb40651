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

Exit codes: 0 success; 1 the server refused or failed (its error is printed: 401 token,
403 not a master, 404 unknown session, ...); 2 usage error or server unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any
from urllib.parse import quote

import httpx

__all__ = ["abort_main", "follow_up_main", "models_main", "sessions_main", "status_main", "steer_main"]

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_TOKEN_ENV = "SESSIONRAY_ADMIN_TOKEN"


def _parser(command: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"sessionray {command}", description=description)
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
    return _print(args, data, f"abort: {data.get('result')}")


def sessions_main(argv: list[str]) -> int:
    """``sessionray sessions``: list live sessions."""
    args = _parser("sessions", "List the live sessions.").parse_args(argv)
    data = _request(args, "GET", "/admin/sessions")
    rows = data.get("sessions", []) if isinstance(data, dict) else []
    lines = [f"{len(rows)} live session(s)"]
    for row in rows:
        if isinstance(row, dict):
            key = row.get("session_key", "?")
            rest = " ".join(
                f"{k}={v}" for k, v in row.items() if k != "session_key" and not isinstance(v, dict | list)
            )
            lines.append(f"  {key}  {rest}".rstrip())
        else:
            lines.append(f"  {row}")
    return _print(args, data, "\n".join(lines))


def status_main(argv: list[str]) -> int:
    """``sessionray status``: pool, live sessions, turns running, recent throughput."""
    args = _parser(
        "status", "Show the runtime's status (pool, live sessions, turns, throughput)."
    ).parse_args(argv)
    data = _request(args, "GET", "/admin/status")

    def flat(prefix: str, value: Any, out: list[str]) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                flat(f"{prefix}.{k}" if prefix else str(k), v, out)
        else:
            out.append(f"{prefix}: {value}")

    lines: list[str] = []
    flat("", data, lines)
    return _print(args, data, "\n".join(lines))


def models_main(argv: list[str]) -> int:
    """``sessionray models``: each configured model's structured-output tier, source and age."""
    from runtime.reply.capability import age_text

    args = _parser("models", "List the configured models with their structured-output tier.").parse_args(argv)
    data = _request(args, "GET", "/admin/models")
    rows = data.get("models", []) if isinstance(data, dict) else []
    lines = [f"{'MODEL':<32} {'TIER':<8} {'SOURCE':<10} AGE"]
    for row in rows:
        age = row.get("age_s")
        lines.append(
            f"{row.get('model', '?'):<32} {row.get('tier') or 'unknown':<8} "
            f"{row.get('source') or '-':<10} {age_text(age) if age is not None else '-'}"
        )
    return _print(args, data, "\n".join(lines))

"""``sessionray usage``: who spent what, from the usage ledger through ``GET /admin/usage``
(docs/decisions.md#spend-reports). A client of the admin API like the control commands
(:mod:`actors.cli.control`: ``--url``, ``--token-env``, ``--json``, the same exit codes)::

    sessionray usage --by model --since 7d
    sessionray usage --by user --chat onebot11:10001:group:555 --since 24h   # group X: who spent it
    sessionray usage --by chat --since 2026-12-04 --until 2026-12-05 --json

The table has one row per group, most expensive first — the key (``USER``, ``CHAT``, ``BOT`` or
``MODEL``), ``CALLS``, ``INPUT``, ``OUTPUT``, ``CACHE READ``, ``CACHE WRITE`` (tokens) and
``COST USD`` — and a ``TOTAL`` row over every matching call (the rows a ``--limit`` cut included).
``--json`` prints the server's answer as is: ``rows`` with exactly ``key``, ``calls``,
``input_tokens``, ``output_tokens``, ``cache_read_tokens``, ``cache_write_tokens``, ``cost_usd``,
then ``totals`` (shape: :mod:`actors.http.usage`).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from actors.cli.control import _parser, _print, _request, table

__all__ = ["USAGE_COLUMNS", "usage_main", "usage_text"]

USAGE_COLUMNS = (
    ("CALLS", "calls"),
    ("INPUT", "input_tokens"),
    ("OUTPUT", "output_tokens"),
    ("CACHE READ", "cache_read_tokens"),
    ("CACHE WRITE", "cache_write_tokens"),
    ("COST USD", "cost_usd"),
)
"""The number columns of ``sessionray usage`` after the key: header and field of a row."""


def _when(ms: int | None) -> str:
    if ms is None:
        return "now"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def _numbers(row: dict[str, Any]) -> list[str]:
    """A row's number cells: tokens and calls with thousands separators, USD to 6 decimals."""
    cells = [f"{int(row.get(field) or 0):,}" for _, field in USAGE_COLUMNS[:-1]]
    return [*cells, f"{float(row.get('cost_usd') or 0.0):.6f}"]


def usage_text(data: dict[str, Any]) -> str:
    """``GET /admin/usage``'s answer as text: a line naming the range and filters, the table (the
    key column, :data:`USAGE_COLUMNS` right-aligned, a ``TOTAL`` row), and a last line when
    ``limit`` left groups out."""
    by = str(data.get("by", "key"))
    filters = {k: v for k, v in (data.get("filters") or {}).items() if v is not None}
    scope = "".join(f", {name} {value}" for name, value in filters.items())
    lines = [f"usage by {by} from {_when(data.get('since_ms'))} to {_when(data.get('until_ms'))}{scope}"]
    rows = [r for r in data.get("rows", []) if isinstance(r, dict)]
    body = [[str(r.get("key")) or "(none)", *_numbers(r)] for r in rows]
    body.append(["TOTAL", *_numbers(data.get("totals") or {})])
    headers = [by.upper(), *(h for h, _ in USAGE_COLUMNS)]
    lines.append(table(headers, body, right=range(1, len(headers))))
    groups = int(data.get("groups") or 0)
    if groups > len(rows):
        lines.append(f"showing the {len(rows)} most expensive of {groups} (--limit)")
    return "\n".join(lines)


def usage_main(argv: list[str]) -> int:
    """``sessionray usage --by user|chat|bot|model [--since 24h] [--until T] [--chat KEY] …``: the
    usage ledger grouped, most expensive first (:func:`usage_text`; ``--json``: the server's answer)."""
    p = _parser(
        "usage",
        "Show who spent what: LLM calls, tokens and USD from the usage ledger, grouped by user, chat, "
        "bot or model, most expensive first, with a TOTAL row. E.g. what group X cost in the last day "
        "and who spent it: sessionray usage --by user --chat onebot11:10001:group:555 --since 24h",
    )
    p.add_argument("--by", required=True, choices=("user", "chat", "bot", "model"), help="group by this")
    p.add_argument(
        "--since",
        default="24h",
        metavar="WHEN",
        help="from: a span back from now (30m, 24h, 7d, 2w) or an ISO date / date-time, UTC without "
        "an offset (default 24h)",
    )
    p.add_argument("--until", metavar="WHEN", help="up to (excluded), same forms (default: now)")
    p.add_argument("--chat", metavar="SESSION_KEY", help="only this chat (platform:bot_id:scope:scene_id)")
    p.add_argument("--user", metavar="USER_ID", help="only calls started by this platform user")
    p.add_argument("--bot", metavar="BOT_ID", help="only this bot")
    p.add_argument("--model", metavar="PROVIDER/ID", help="only this model")
    p.add_argument("--limit", type=int, default=100, help="most rows (default 100; TOTAL counts all)")
    args = p.parse_args(argv)
    data = _request(args, "GET", "/admin/usage?" + urlencode(_query(args)))
    return _print(args, data, usage_text(data) if isinstance(data, dict) else str(data))


def _query(args: argparse.Namespace) -> dict[str, Any]:
    """The query string of ``args`` (options not given are left out)."""
    names = ("by", "since", "until", "chat", "user", "bot", "model", "limit")
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}

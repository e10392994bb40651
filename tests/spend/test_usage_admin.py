"""``GET /admin/usage`` and ``sessionray usage``: the usage ledger grouped by user, chat, bot or
model, behind the admin token, with totals (docs/decisions.md#spend-reports). The ledger is filled
through the real recording path (attributed calls of priced faux models) plus one older row
written with the ledger API; the admin routes run in a real uvicorn server on loopback (SQLite and
PostgreSQL), and the CLI runs as its own OS process against it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from actors.http.admin import admin_routes
from providers.faux import faux_assistant_message, faux_text, register_faux_provider
from runtime.llm.attribution import attributed
from runtime.llm.stream import complete
from runtime.llm.types import Context, Model, ModelCost, Usage, UserMessage, now_ms
from runtime.memory import Database
from runtime.memory.repository import ContextRepository
from runtime.spend.ledger import write_usage
from tests.actors.edge_support import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
TOKEN_ENV, TOKEN = "USAGE_ADMIN_TEST_TOKEN", "usage-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DAY = 86_400_000

G5, G6, DM = "onebot11:10001:group:555", "onebot11:10001:group:666", "onebot11:20002:private:42"
USAGE = Usage(input=100, output=20, cache_read=40, cache_write=8)
A_USD = (100 * 10.0 + 20 * 50.0 + 40 * 1.0 + 8 * 12.5) / 1e6  # 0.00214 per call of model A
B_USD = (100 * 1.0 + 20 * 2.0) / 1e6  # 0.00014 per call of model B
FIELDS = [
    "key",
    "calls",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "cost_usd",
]


class StubRuntime:
    """The admin routes' runtime handle; the usage route needs none of it."""

    config = None


@dataclass
class Admin:
    url: str
    old_ts: int
    """Unix ms of the one row three days back."""


def priced(provider: str, cost: ModelCost) -> Model:
    reply = faux_assistant_message([faux_text("ok")])
    reply.usage = USAGE.model_copy()
    handle = register_faux_provider(
        provider=provider, models=[Model(id="m", api="faux", cost=cost)], default_response=reply
    )
    return handle.get_model()


async def calls(model: Model, n: int, *, bot: str, chat: str, user: str) -> None:
    with attributed(bot_id=bot, session_key=chat, user_id=user, session_id=f"{chat}#1", turn_id="m1"):
        for _ in range(n):
            await complete(model, Context(messages=[UserMessage(content="hi")]))


async def fill(db: Database) -> int:
    """The ledger of every test: calls recorded now, and one written three days back (its ts)."""
    a = priced("usage-a", ModelCost(input=10.0, output=50.0, cache_read=1.0, cache_write=12.5))
    b = priced("usage-b", ModelCost(input=1.0, output=2.0))
    await calls(a, 3, bot="10001", chat=G5, user="42")
    await calls(a, 1, bot="10001", chat=G5, user="7")
    await calls(b, 1, bot="10001", chat=G5, user="7")
    await calls(b, 2, bot="10001", chat=G6, user="42")
    await calls(a, 1, bot="20002", chat=DM, user="42")
    old = now_ms() - 3 * DAY
    row = {
        "ts": old, "bot_id": "10001", "session_key": G5, "user_id": "42", "model": "usage-a/m",
        "api": "faux", "session_id": "", "turn_id": "", "reason": "turn", "input_tokens": 1000,
        "output_tokens": 100, "cache_read_tokens": 0, "cache_write_tokens": 0, "cost_usd": 5.0,
        "master": False,
    }  # fmt: skip
    await db.run_write(lambda: write_usage(db, [row]))
    return old


@pytest.fixture
async def admin(db: Database, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Admin]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    old = await fill(db)
    app = Starlette(routes=admin_routes(StubRuntime(), TOKEN_ENV, repository=ContextRepository(db)))
    with serve_in_thread(app) as url:
        yield Admin(url, old)


async def get(admin: Admin, query: str, headers: dict[str, str] | None = AUTH) -> httpx.Response:
    async with httpx.AsyncClient(base_url=admin.url, timeout=30) as client:
        return await client.get("/admin/usage" + query, headers=headers)


def row(
    key: str, calls: int, usd: float, *, tokens: tuple[int, int, int, int] | None = None
) -> dict[str, Any]:
    """The expected JSON row of ``calls`` calls of :data:`USAGE` (or the given token sums)."""
    inp, out, cr, cw = tokens or (calls * 100, calls * 20, calls * 40, calls * 8)
    return {
        "key": key, "calls": calls, "input_tokens": inp, "output_tokens": out,
        "cache_read_tokens": cr, "cache_write_tokens": cw, "cost_usd": pytest.approx(usd),
    }  # fmt: skip


def totals(calls: int, usd: float) -> dict[str, Any]:
    return {k: v for k, v in row("", calls, usd).items() if k != "key"}


async def test_refused_without_the_admin_token(admin: Admin, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = await get(admin, "?by=user", headers=None)
    assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
    wrong = await get(admin, "?by=user", headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()) == (401, {"error": "wrong bearer token"})
    monkeypatch.delenv(TOKEN_ENV)
    disabled = await get(admin, "?by=user")
    assert disabled.status_code == 401 and "admin API disabled" in disabled.json()["error"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("", "`by` must be one of user, chat, bot, model (got missing)"),
        ("?by=team", "`by` must be one of user, chat, bot, model (got 'team')"),
        ("?by=user&since=yesterday", "`since`: cannot read the time 'yesterday'"),
        ("?by=user&since=1h&until=2h", "`until` (2h) must be after `since` (1h)"),
        ("?by=user&until=soon", "`until`: cannot read the time 'soon'"),
        ("?by=user&limit=0", "`limit` must be between 1 and 10000, got 0"),
        ("?by=user&limit=ten", "`limit` must be an integer, got 'ten'"),
        ("?by=user&chat=group-555", "`chat`: malformed session key 'group-555'"),
    ],
)
async def test_bad_query_is_a_400_that_says_why(admin: Admin, query: str, message: str) -> None:
    resp = await get(admin, query)
    assert resp.status_code == 400
    assert message in resp.json()["error"]


async def test_who_spent_what_in_one_chat(admin: Admin) -> None:
    """What group X cost in the last day, and who spent it; the older row only from ``since=7d``."""
    resp = await get(admin, f"?by=user&chat={G5}&since=24h")
    assert resp.status_code == 200
    got = resp.json()
    assert [list(r) for r in got["rows"]] == [FIELDS, FIELDS]
    assert got["rows"] == [row("42", 3, 3 * A_USD), row("7", 2, A_USD + B_USD)]
    assert got["totals"] == totals(5, 4 * A_USD + B_USD)
    assert (got["by"], got["groups"], got["until_ms"]) == ("user", 2, None)
    assert got["filters"] == {"chat": G5, "user": None, "bot": None, "model": None}
    assert 0 < now_ms() - got["since_ms"] - DAY < 60_000
    week = (await get(admin, f"?by=user&chat={G5}&since=7d")).json()
    assert week["rows"][0] == row("42", 4, 5.0 + 3 * A_USD, tokens=(1300, 160, 120, 24))
    assert week["totals"]["calls"] == 6


async def test_by_model_bot_and_chat_with_totals_over_a_limit(admin: Admin) -> None:
    by_model = (await get(admin, "?by=model")).json()
    assert by_model["rows"] == [row("usage-a/m", 5, 5 * A_USD), row("usage-b/m", 3, 3 * B_USD)]
    cut = (await get(admin, "?by=model&limit=1")).json()
    assert [r["key"] for r in cut["rows"]] == ["usage-a/m"]
    assert (cut["totals"], cut["groups"]) == (totals(8, 5 * A_USD + 3 * B_USD), 2)
    by_bot = (await get(admin, "?by=bot")).json()
    assert by_bot["rows"] == [row("10001", 7, 4 * A_USD + 3 * B_USD), row("20002", 1, A_USD)]
    by_chat = (await get(admin, "?by=chat&user=42")).json()
    assert by_chat["rows"] == [row(G5, 3, 3 * A_USD), row(DM, 1, A_USD), row(G6, 2, 2 * B_USD)]
    only_b = (await get(admin, "?by=user&model=usage-b/m&bot=10001")).json()
    assert only_b["rows"] == [row("42", 2, 2 * B_USD), row("7", 1, B_USD)]


async def test_until_and_iso_dates_select_a_past_range(admin: Admin) -> None:
    before = datetime.fromtimestamp((admin.old_ts - DAY) / 1000, tz=UTC).isoformat(timespec="seconds")
    after = datetime.fromtimestamp((admin.old_ts + DAY) / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    for query in (
        "?by=user&since=7d&until=24h",
        f"?by=user&since={before}&until={after}".replace("+", "%2B"),
    ):
        got = (await get(admin, query)).json()
        assert got["rows"] == [row("42", 1, 5.0, tokens=(1000, 100, 0, 0))], query
    empty = (await get(admin, "?by=chat&since=2020-01-01&until=2020-01-02")).json()
    assert (empty["rows"], empty["totals"], empty["groups"]) == ([], totals(0, 0.0), 0)


async def test_no_database_is_a_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    app = Starlette(routes=admin_routes(StubRuntime(), TOKEN_ENV))
    with serve_in_thread(app) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            resp = await client.get("/admin/usage?by=user", headers=AUTH)
    assert (resp.status_code, resp.json()) == (503, {"error": "no database configured"})


async def cli(admin: Admin, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "actors.cli.main",
        "usage",
        *args,
        "--url",
        admin.url,
        "--token-env",
        TOKEN_ENV,
    ]
    env = {**os.environ, TOKEN_ENV: TOKEN}
    return await asyncio.to_thread(
        subprocess.run, cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )


async def test_cli_prints_who_spent_what_in_one_chat(admin: Admin) -> None:
    out = await cli(admin, "--by", "user", "--chat", G5, "--since", "24h")
    assert out.returncode == 0, out.stderr
    first, *lines = out.stdout.splitlines()
    assert first.startswith("usage by user from ") and first.endswith(f" UTC to now, chat {G5}")
    assert lines == [
        "USER   CALLS  INPUT  OUTPUT  CACHE READ  CACHE WRITE  COST USD",
        "42         3    300      60         120           24  0.006420",
        "7          2    200      40          80           16  0.002280",
        "TOTAL      5    500     100         200           40  0.008700",
    ]
    week = await cli(admin, "--by", "user", "--chat", G5, "--since", "7d", "--limit", "1")
    assert week.stdout.splitlines()[1:] == [
        "USER   CALLS  INPUT  OUTPUT  CACHE READ  CACHE WRITE  COST USD",
        "42         4  1,300     160         120           24  5.006420",
        "TOTAL      6  1,500     200         200           40  5.008700",
        "showing the 1 most expensive of 2 (--limit)",
    ]


async def test_cli_json_rows_have_exactly_the_report_keys(admin: Admin) -> None:
    out = await cli(admin, "--by", "model", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["rows"] == [row("usage-a/m", 5, 5 * A_USD), row("usage-b/m", 3, 3 * B_USD)]
    assert all(list(r) == FIELDS for r in data["rows"])
    assert data["totals"] == totals(8, 5 * A_USD + 3 * B_USD)


async def test_cli_errors(admin: Admin) -> None:
    bad_since = await cli(admin, "--by", "user", "--since", "yesterday")
    assert bad_since.returncode == 1
    assert "HTTP 400: `since`: cannot read the time 'yesterday'" in bad_since.stderr
    bad_by = await cli(admin, "--by", "team")
    assert bad_by.returncode == 2 and "invalid choice: 'team'" in bad_by.stderr

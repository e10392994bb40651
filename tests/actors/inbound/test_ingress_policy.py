"""Per-bot inbound policy through the webhook (docs/decisions.md#platform-inbound-policy):
allow/deny lists, per-user and per-group token buckets, ``on_limit: drop | notice``.

Real HTTP over loopback (uvicorn in a thread), the real OneBot codec, a real SQLite transcript
store; the runtime is a stand-in that records what was routed and whose delivery pool is the real
delivery core (ledger on the same SQLite file) sending to the platform-API stand-in. A refused
message must be stored (seen, not answered), counted by outcome and never routed."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from actors.inbound.ingress import build_app
from actors.placement.runtime import SubmitResult
from runtime.config import BotConfig, Config, DatabaseConfig, RateLimitConfig, ServerConfig
from runtime.delivery.core import DeliverySender, DeliverySettings
from runtime.platforms.base import InboundMessage
from tests.actors.edge_support import serve_in_thread, transcript_rows
from tests.platform_api_server import PlatformApiServer

NOTICE_BOT, DROP_BOT, MASTER = "10001", "10002", "9000"


class PolicyRuntime:
    """Takes every routed message (``accepted``); ``delivery`` is a real delivery core."""

    def __init__(self, delivery: DeliverySender) -> None:
        self.taken: list[InboundMessage] = []
        self.delivery = delivery

    async def submit(self, msg: InboundMessage) -> SubmitResult:
        self.taken.append(msg)
        return SubmitResult(status="accepted", seq=len(self.taken))

    async def status(self) -> dict[str, Any]:
        return {"live": 0}

    async def session(self, key: str) -> None:
        return None


@dataclass
class Served:
    url: str
    runtime: PolicyRuntime
    app: Any
    api: PlatformApiServer
    db_url: str

    def post(self, bot: str, event: dict[str, Any]) -> httpx.Response:
        body = json.dumps(event).encode()
        headers = {"Content-Type": "application/json"}
        return httpx.post(f"{self.url}/webhooks/onebot11/{bot}", content=body, headers=headers, timeout=30)

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until no cooldown notice is on its way (the ingress's background sends)."""
        deadline = time.monotonic() + timeout_s
        while self.app.state.ingress._notices:
            assert time.monotonic() < deadline, "a cooldown notice never finished"
            time.sleep(0.01)

    def routed(self, user: str) -> list[str]:
        return [m.text for m in self.runtime.taken if m.sender.id == user]

    def stored(self, user: str) -> list[tuple[str, str]]:
        """``(message_id, body)`` of the user's inbound transcript rows."""
        return [(r[1], r[4]) for r in transcript_rows(self.db_url) if r[0] == "inbound" and r[3] == user]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, fixtures_dir: Path) -> Iterator[Served]:
    db_url = f"sqlite:///{tmp_path_factory.mktemp('policy') / 'ingress.db'}"
    with PlatformApiServer(fixtures_dir) as api:
        config = Config(
            bots=[
                BotConfig(
                    platform="onebot11",
                    self_id=NOTICE_BOT,
                    api_base=api.base_url,
                    trigger="always",
                    masters=[MASTER],
                    allow_groups=["300", "301", "310"],
                    deny_groups=["301"],
                    deny_users=["666"],
                    rate_limit=RateLimitConfig(per_user="2/hour", per_group="3/hour", on_limit="notice"),
                ),
                BotConfig(
                    platform="onebot11",
                    self_id=DROP_BOT,
                    api_base=api.base_url,
                    masters=[MASTER],
                    allow_users=["4001"],  # masters need not be listed
                    rate_limit=RateLimitConfig(per_user="1/hour"),
                ),
            ],
            database=DatabaseConfig(url=db_url),
            server=ServerConfig(admin_token_env="POLICY_NO_TOKEN"),
        )
        delivery = DeliverySender(
            DeliverySettings(database_url=db_url, bots=config.bots, max_age_s=1), 0, "0:t"
        )
        runtime = PolicyRuntime(delivery)
        app = build_app(runtime, config)
        with serve_in_thread(app) as url:
            yield Served(url, runtime, app, api, db_url)
        delivery.db.dispose()


def event(bot: str, user: str, message_id: int, text: str, group: str | None = None) -> dict[str, Any]:
    """A OneBot v11 message event (private, or in ``group``)."""
    out: dict[str, Any] = {
        "post_type": "message",
        "message_type": "private" if group is None else "group",
        "sub_type": "friend" if group is None else "normal",
        "self_id": int(bot),
        "user_id": int(user),
        "message_id": message_id,
        "time": 1756168635,
        "message": [{"type": "text", "data": {"text": text}}],
        "sender": {"user_id": int(user), "nickname": f"u{user}"},
    }
    if group is not None:
        out["group_id"] = int(group)
    return out


def at_bot(ev: dict[str, Any], bot: str) -> dict[str, Any]:
    ev["message"].insert(0, {"type": "at", "data": {"qq": bot}})
    return ev


def inbound(outcome: str) -> float:
    labels = {"platform": "onebot11", "outcome": outcome}
    return REGISTRY.get_sample_value("sessionray_inbound_messages_total", labels) or 0.0


def statuses(answers: list[httpx.Response]) -> list[tuple[int, str]]:
    return [(r.status_code, r.json()["status"]) for r in answers]


def test_allow_and_deny_lists(served: Served) -> None:
    before = inbound("denied")
    answers = [
        served.post(NOTICE_BOT, event(NOTICE_BOT, "666", 1, "denied user, private")),
        served.post(NOTICE_BOT, event(NOTICE_BOT, "666", 2, "denied user, allowed group", "300")),
        served.post(NOTICE_BOT, event(NOTICE_BOT, "1001", 3, "allowed and denied group", "301")),
        served.post(NOTICE_BOT, event(NOTICE_BOT, "1001", 4, "group not allowed", "302")),
        served.post(NOTICE_BOT, event(NOTICE_BOT, "1001", 5, "allowed group", "300")),
        served.post(NOTICE_BOT, event(NOTICE_BOT, MASTER, 6, "a master anywhere", "302")),
        served.post(DROP_BOT, event(DROP_BOT, "1001", 7, "user not allowed")),
    ]
    assert statuses(answers) == [(200, "denied")] * 4 + [(200, "accepted")] * 2 + [(200, "denied")]
    assert inbound("denied") == before + 5
    assert (served.routed("666"), served.routed("1001"), served.routed(MASTER)) == (
        [],
        ["allowed group"],
        ["a master anywhere"],
    )
    # every refused message is stored, as seen but not answered
    assert served.stored("666") == [("1", "denied user, private"), ("2", "denied user, allowed group")]
    assert [mid for mid, _ in served.stored("1001")] == ["3", "4", "5", "7"]


def test_per_user_limit_sends_one_notice_per_cooldown_window(served: Served) -> None:
    user, before = "2001", inbound("rate_limited")
    first = [served.post(NOTICE_BOT, event(NOTICE_BOT, user, 100 + i, f"m{i}")) for i in range(3)]
    assert statuses(first) == [(200, "accepted"), (200, "accepted"), (200, "rate_limited")]
    (notice,) = served.api.wait_for_requests(1)
    assert notice.path == "/send_private_msg" and notice.json["user_id"] == int(user)
    (segment,) = notice.json["message"]
    wait = re.fullmatch(r"You are sending messages too fast; please wait (\d+) s\.", segment["data"]["text"])
    assert wait is not None and 1700 <= int(wait.group(1)) <= 1800  # 2/hour: one token per 1800 s
    # later limited messages (and a redelivery) in the same window: stored, counted, no notice
    later = [
        served.post(NOTICE_BOT, event(NOTICE_BOT, user, 103, "m3")),
        served.post(NOTICE_BOT, event(NOTICE_BOT, user, 102, "m2")),
    ]
    assert statuses(later) == [(200, "rate_limited")] * 2
    served.settle()
    assert [r.path for r in served.api.requests] == ["/send_private_msg"]
    assert inbound("rate_limited") == before + 3
    assert served.routed(user) == ["m0", "m1"]
    assert served.stored(user) == [("100", "m0"), ("101", "m1"), ("102", "m2"), ("103", "m3")]
    served.api.reset()


def test_per_group_limit_counts_every_member(served: Served) -> None:
    group = "310"
    answers = [
        served.post(NOTICE_BOT, event(NOTICE_BOT, "3001", 200, "a", group)),
        served.post(NOTICE_BOT, event(NOTICE_BOT, "3001", 201, "b", group)),
        served.post(NOTICE_BOT, event(NOTICE_BOT, "3002", 202, "c", group)),
        served.post(NOTICE_BOT, event(NOTICE_BOT, "3002", 203, "d", group)),  # 3002 has a token, 310 none
        served.post(NOTICE_BOT, event(NOTICE_BOT, "3003", 204, "e", group)),
    ]
    assert statuses(answers) == [(200, "accepted")] * 3 + [(200, "rate_limited")] * 2
    served.settle()
    (notice,) = served.api.requests
    assert notice.path == "/send_group_msg" and notice.json["group_id"] == int(group)
    quote, words = notice.json["message"]
    assert quote == {"type": "reply", "data": {"id": "203"}}  # answers the first refused message
    assert words["data"]["text"].startswith("You are sending messages too fast")
    # the user who was refused for the group's sake kept their own token: another group is fine
    assert served.post(NOTICE_BOT, event(NOTICE_BOT, "3002", 205, "f", "300")).json() == {
        "status": "accepted"
    }
    assert (served.routed("3002"), served.routed("3003")) == (["c", "f"], [])
    served.api.reset()


def test_drop_mode_is_silent_and_untriggered_messages_take_no_token(served: Served) -> None:
    user, requests = "4001", len(served.api.requests)
    answers = [
        served.post(DROP_BOT, event(DROP_BOT, user, 300, "chatter", "400")),  # not mentioned: no turn
        served.post(DROP_BOT, at_bot(event(DROP_BOT, user, 301, " hi", "400"), DROP_BOT)),
        served.post(DROP_BOT, at_bot(event(DROP_BOT, user, 302, " again", "400"), DROP_BOT)),
        served.post(DROP_BOT, event(DROP_BOT, user, 303, "private too")),
        served.post(DROP_BOT, event(DROP_BOT, MASTER, 304, "m1")),
        served.post(DROP_BOT, event(DROP_BOT, MASTER, 305, "m2")),  # masters are never limited
    ]
    assert statuses(answers) == [
        (200, "untriggered"),
        (200, "accepted"),
        (200, "rate_limited"),
        (200, "rate_limited"),
        (200, "accepted"),
        (200, "accepted"),
    ]
    served.settle()
    assert len(served.api.requests) == requests
    assert served.routed(user) == [f"@{DROP_BOT} hi"]
    assert [mid for mid, _ in served.stored(user)] == ["300", "301", "302", "303"]


def test_rate_notation_is_checked_when_the_config_loads() -> None:
    from runtime.config import ConfigError, parse_config, parse_rate

    assert [parse_rate(r) for r in ("5/min", "30/10s", "100/days", "1/h")] == [
        (5, 60.0),
        (30, 10.0),
        (100, 86400.0),
        (1, 3600.0),
    ]
    bad = {"bots": [{"platform": "onebot11", "self_id": 1, "rate_limit": {"per_user": "5/minn"}}]}
    with pytest.raises(ConfigError, match=r"bots\.0\.rate_limit\.per_user: rate must look like '5/min'"):
        parse_config(bad)
    zero = {"bots": [{"platform": "onebot11", "self_id": 1, "rate_limit": {"per_group": "0/min"}}]}
    with pytest.raises(ConfigError, match="at least 1 message"):
        parse_config(zero)

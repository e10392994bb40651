"""The polling settings of a bot and how the poller reads a failed Bot API answer (no Ray)."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import ValidationError

from actors.inbound.telegram_poll import _failure
from actors.inbound.telegram_poll_status import polling_bots
from runtime.config import BotConfig, Config


def test_polling_settings_default_and_are_telegram_only() -> None:
    bot = BotConfig(platform="telegram", self_id="1", token_env="T")
    assert (bot.mode, bot.poll_timeout_s, bot.allowed_updates) == ("webhook", 30, None)
    polling = BotConfig(platform="telegram", self_id="1", token_env="T", mode="polling")
    assert polling_bots(Config(bots=[bot, polling])) == [polling]
    with pytest.raises(ValidationError, match="`mode: polling` is for telegram bots only"):
        BotConfig(platform="onebot11", self_id="1", mode="polling")
    with pytest.raises(ValidationError):
        BotConfig(platform="telegram", self_id="1", token_env="T", poll_timeout_s=301)


@pytest.mark.parametrize(
    ("status", "headers", "body", "expected"),
    [
        (
            429,
            {},
            {"ok": False, "error_code": 429, "description": "Too Many Requests: retry after 7",
             "parameters": {"retry_after": 7}},
            ("rate_limited", 7.0, "HTTP 429: Too Many Requests: retry after 7"),
        ),
        (
            429,
            {"Retry-After": "4"},
            {"ok": False, "error_code": 429},  # no description: the start of the body is shown
            ("rate_limited", 4.0, 'HTTP 429: {"ok": false, "error_code": 429}'),
        ),
        (
            409,
            {},
            {"ok": False, "error_code": 409,
             "description": "Conflict: can't use getUpdates method while webhook is active"},
            ("conflict", None, "HTTP 409: Conflict: can't use getUpdates method while webhook is active"),
        ),
        (502, {}, None, ("server_error", None, "HTTP 502: <html>bad gateway</html>")),
        (401, {}, {"ok": False, "error_code": 401, "description": "Unauthorized"},
         ("http_error", None, "HTTP 401: Unauthorized")),
    ],
)  # fmt: skip
def test_failed_answers_are_classified(
    status: int, headers: dict[str, str], body: object, expected: tuple[str, float | None, str]
) -> None:
    raw = b"<html>bad gateway</html>" if body is None else json.dumps(body).encode()
    failed = _failure(status, httpx.Headers(headers), raw)
    assert (failed.reason, failed.wait_s, failed.text) == expected

"""The outbound leak check runs inside delivery
(docs/decisions.md#security-leak-check, docs/decisions.md#delivery-partitioned) — Ray-free: the
DeliverySender that a DeliveryActor wraps, a real SQLite file and the platform-API test server over
loopback."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import prometheus_client

from runtime.delivery.core import DeliverySender, DeliverySettings
from runtime.reply.leak import LeakPolicy
from tests.actors.edge_support import onebot_bot, private_call, text_job
from tests.platform_api_server import PlatformApiServer

SECRET = "tg-secret-0123456789"


def _leaks(action: str) -> float:
    return (
        prometheus_client.REGISTRY.get_sample_value("sessionray_leak_hits_total", {"action": action}) or 0.0
    )


def test_settings_from_config_collect_the_named_secrets(monkeypatch) -> None:
    monkeypatch.setenv("ONEBOT_TOKEN_FOR_TEST", SECRET)
    monkeypatch.setenv("SESSIONRAY_CONSOLE_API_TOKEN", "console-token-for-test")  # always collected
    config = SimpleNamespace(
        ai=SimpleNamespace(providers={}),
        bots=[SimpleNamespace(platform="onebot11", self_id="1", access_token_env="ONEBOT_TOKEN_FOR_TEST")],
        server=SimpleNamespace(admin_token_env=None),
        database=SimpleNamespace(url="sqlite:///x.db"),
    )
    assert DeliverySettings.from_config(config).leak.secrets == [SECRET, "console-token-for-test"]


async def test_secret_in_reply_is_redacted_before_the_platform_call(
    tmp_path: Path, fixtures_dir: Path
) -> None:
    before = _leaks("redact")
    with PlatformApiServer(fixtures_dir) as api:
        settings = DeliverySettings(
            database_url=f"sqlite:///{tmp_path / 'leak.db'}",
            bots=[onebot_bot(api.base_url)],
            leak=LeakPolicy(secrets=[SECRET]),
        )
        sender = DeliverySender(settings, partition=0, owner="0:test")
        try:
            result = await sender.deliver(
                text_job(f"the token is {SECRET} and sk-{'a' * 30}", reply_id="leak-1")
            )
        finally:
            await sender.close()
        assert result.outcome == "sent"
        assert [(r.path, r.json) for r in api.requests] == [
            ("/send_private_msg", private_call("20002", "the token is [redacted] and [redacted]"))
        ]
    assert _leaks("redact") - before == 1

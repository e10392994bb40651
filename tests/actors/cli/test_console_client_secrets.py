"""Where ``sessionray chat --url`` sends the console master token (by default the admin token):
over https, or over plain http to this machine only (docs/decisions.md#security-console-master-proof).
Before, it went with every request to whatever URL was given."""

from __future__ import annotations

import pytest

from actors.cli.console_client import _safe_for_secrets


@pytest.mark.parametrize(
    ("url", "safe"),
    [
        ("http://127.0.0.1:8000", True),
        ("http://127.8.9.1:8000", True),
        ("http://localhost:8000", True),
        ("http://[::1]:8000", True),
        ("https://bot.example.org", True),
        ("http://bot.example.org:8000", False),
        ("http://10.0.0.5:8000", False),
        ("http://localhost.example.org", False),
        ("http://127.0.0.1.example.org", False),
        ("ftp://127.0.0.1", True),  # loopback whatever the scheme: it never leaves the machine
    ],
)
def test_the_master_token_goes_over_https_or_to_this_machine_only(url: str, safe: bool) -> None:
    assert _safe_for_secrets(url) is safe

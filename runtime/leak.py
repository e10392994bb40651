"""Outbound leak check: no configured secret and no common key format leaves in a reply
(seed 000 "outbound text, Markdown and nested strings still pass the leak check"; issue #4 item 8).

Entry point: ``scan_reply(reply, policy)`` → :class:`LeakResult`. Every string anywhere in the
reply is scanned — text, Markdown content, mention targets, media values, share titles and URLs,
any nested string — for

* the literal secrets of :class:`LeakPolicy` (provider API keys, platform tokens, webhook secrets,
  values named in config; build it with :meth:`LeakPolicy.from_env`), and
* common key formats (:data:`KEY_PATTERNS`: OpenAI/Anthropic ``sk-…``, AWS ``AKIA…``, GitHub
  ``ghp_…``, Slack ``xox?-…``, Google ``AIza…``, Telegram bot tokens, JWTs, PEM private keys).

A hit either redacts the match (``action="redact"``: replaced by ``policy.redaction``) or blocks
the whole reply (``action="block"``: replaced by one text segment ``policy.blocked_text``). Each
string that matched increments ``sessionray_leak_hits_total{action}`` and logs a warning that
names the pattern, never the secret.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime import metrics
from runtime.segments import Reply

__all__ = ["KEY_PATTERNS", "LeakPolicy", "LeakResult", "scan_reply", "scan_text"]

log = logging.getLogger(__name__)

KEY_PATTERNS: dict[str, re.Pattern[str]] = {
    "openai_or_anthropic_key": re.compile(r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}"),
    "aws_access_key": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "github_token": re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})"),
    "slack_token": re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    "google_api_key": re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),
    "telegram_bot_token": re.compile(r"\b\d{8,10}:AA[A-Za-z0-9_-]{33}\b"),
    "jwt": re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    "private_key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
}
"""Common secret formats, by name (the name is what gets logged)."""


@dataclass
class LeakPolicy:
    """What counts as a secret and what to do on a hit.

    Attributes:
        secrets: Literal secret values (shorter than ``min_secret_chars`` are ignored, to avoid
            redacting common words).
        action: ``redact`` (replace each match) or ``block`` (withhold the whole reply).
        use_patterns: Also match :data:`KEY_PATTERNS`.
        redaction: Replacement text for a redacted match.
        blocked_text: The text sent instead of a blocked reply.
        min_secret_chars: Minimum length of a literal secret.
    """

    secrets: list[str] = field(default_factory=list)
    action: Literal["redact", "block"] = "redact"
    use_patterns: bool = True
    redaction: str = "[redacted]"
    blocked_text: str = "[reply withheld: it contained a secret]"
    min_secret_chars: int = 8

    @classmethod
    def from_env(
        cls,
        env_names: Iterable[str],
        *,
        values: Iterable[str] = (),
        environ: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> LeakPolicy:
        """Build a policy from the values of the environment variables ``env_names`` (e.g. every
        ``api_key_env``/``access_token_env``/``secret_env`` named in config) plus literal ``values``.
        Unset variables are skipped. ``kwargs`` go to the constructor."""
        env = os.environ if environ is None else environ
        found = [env[name] for name in env_names if env.get(name)]
        return cls(secrets=[*found, *values], **kwargs)

    @classmethod
    def from_config(
        cls, config: Any, *, environ: Mapping[str, str] | None = None, **kwargs: Any
    ) -> LeakPolicy:
        """Build a policy from a :class:`runtime.config.Config` (duck-typed): the values of every
        secret variable it names — ``ai.providers.*.api_key_env``, ``bots[*].access_token_env`` /
        ``secret_env`` / ``token_env`` and ``server.admin_token_env``."""
        names: list[str] = []
        providers = getattr(getattr(config, "ai", None), "providers", None) or {}
        for p in providers.values() if isinstance(providers, Mapping) else providers:
            names.append(getattr(p, "api_key_env", None) or "")
        for bot in getattr(config, "bots", None) or []:
            names += [getattr(bot, k, None) or "" for k in ("access_token_env", "secret_env", "token_env")]
        names.append(getattr(getattr(config, "server", None), "admin_token_env", None) or "")
        return cls.from_env([n for n in names if n], environ=environ, **kwargs)

    def _literal_pattern(self) -> re.Pattern[str] | None:
        values = sorted({s for s in self.secrets if len(s) >= self.min_secret_chars}, key=len, reverse=True)
        return re.compile("|".join(re.escape(v) for v in values)) if values else None


@dataclass
class LeakResult:
    """Outcome of :func:`scan_reply`.

    Attributes:
        reply: The reply to send (redacted, or replaced when blocked; unchanged without hits).
        hits: Strings that matched.
        blocked: True when the reply was withheld.
        patterns: Names of what matched (``configured_secret`` or a :data:`KEY_PATTERNS` key).
    """

    reply: Reply
    hits: int = 0
    blocked: bool = False
    patterns: list[str] = field(default_factory=list)


def scan_text(text: str, policy: LeakPolicy) -> tuple[str, list[str]]:
    """Return ``(redacted text, names of what matched)`` for one string (no metrics)."""
    names: list[str] = []
    literal = policy._literal_pattern()
    if literal is not None:
        text, n = literal.subn(policy.redaction, text)
        if n:
            names.append("configured_secret")
    if policy.use_patterns:
        for name, pattern in KEY_PATTERNS.items():
            text, n = pattern.subn(policy.redaction, text)
            if n:
                names.append(name)
    return text, names


def _walk(value: Any, policy: LeakPolicy, found: list[list[str]]) -> Any:
    if isinstance(value, str):
        cleaned, names = scan_text(value, policy)
        if names:
            found.append(names)
        return cleaned
    if isinstance(value, dict):
        return {k: _walk(v, policy, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, policy, found) for v in value]
    return value


def scan_reply(reply: Reply, policy: LeakPolicy) -> LeakResult:
    """Scan every string of ``reply`` (nested ones included) and redact or block per ``policy``.

    Returns:
        :class:`LeakResult`. Each matching string counts once in ``LEAKS(action)``.
    """
    found: list[list[str]] = []
    cleaned = _walk(reply.model_dump(mode="json"), policy, found)
    if not found:
        return LeakResult(reply=reply)
    names = sorted({n for group in found for n in group})
    metrics.LEAKS.inc(len(found), action=policy.action)
    log.warning("leak check: %d outbound string(s) matched %s; action=%s", len(found), names, policy.action)
    if policy.action == "block":
        return LeakResult(
            reply=Reply.of_text(policy.blocked_text), hits=len(found), blocked=True, patterns=names
        )
    return LeakResult(reply=Reply.model_validate(cleaned), hits=len(found), patterns=names)

"""The structured-output capability of each model: a cache of the strongest working tier per
``(provider, model id)``, seedable from ``Model.compat["structured_output"]`` (probe once,
cache the tier: docs/decisions.md#structured-capability-cache).

Used by :mod:`runtime.reply.structured` (generic structured output) and :mod:`runtime.reply.im_reply` (the
IM reply contract), which record downgrades here.
"""

from __future__ import annotations

import re
import threading
from typing import Literal, TypeAlias

from runtime.llm.types import Model

__all__ = ["CAPABILITIES", "TIERS", "CapabilityCache", "Tier", "is_capability_error"]

Tier: TypeAlias = Literal["native", "tool", "prompt"]
"""Structured-output strength: ``native`` > ``tool`` > ``prompt``."""
TIERS: tuple[Tier, ...] = ("native", "tool", "prompt")
"""All tiers, strongest first."""


class CapabilityCache:
    """Strongest working tier per ``(provider, model id)``
    (docs/decisions.md#structured-capability-cache).

    The provider part is ``Model.provider`` or, without one, ``Model.api``. Thread-safe.
    """

    def __init__(self) -> None:
        self._tiers: dict[tuple[str, str], Tier] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(model: Model) -> tuple[str, str]:
        """Return the cache key ``(provider or api, model id)``."""
        return (model.provider or model.api, model.id)

    @staticmethod
    def seeded(model: Model) -> Tier | None:
        """Return the tier the model's ``compat`` declares, or ``None`` when it says nothing.

        ``compat["structured_output"]`` (``native``/``tool``/``prompt``) wins; otherwise
        ``supports_json_schema: false`` (the OpenAI-compatible profile flag) means ``tool``.
        """
        value = model.compat.get("structured_output")
        if value in TIERS:
            return value
        if model.compat.get("supports_json_schema") is False:
            return "tool"
        return None

    def get(self, model: Model) -> Tier | None:
        """Return the cached tier, else the compat-seeded one, else ``None`` (unknown)."""
        with self._lock:
            cached = self._tiers.get(self.key(model))
        return cached or self.seeded(model)

    def record(self, model: Model, tier: Tier) -> None:
        """Remember that ``tier`` is the strongest tier that works for ``model``."""
        with self._lock:
            self._tiers[self.key(model)] = tier

    def clear(self) -> None:
        """Forget everything (tests, configuration reload)."""
        with self._lock:
            self._tiers.clear()


CAPABILITIES = CapabilityCache()
"""The process-wide capability cache used when no ``cache`` is passed."""

_CAPABILITY_ERROR = re.compile(
    r"\b(400|404|415|422)\b|not supported|unsupported|invalid[_ ]request|response_format|json_schema"
    r"|tool_choice|does not support",
    re.IGNORECASE,
)
_FEATURE = re.compile(
    r"response_format|json_schema|responseSchema|response_schema|structured|tool_choice|\btools?\b"
    r"|function[_ ]call|not supported|unsupported|does not support",
    re.IGNORECASE,
)
_NOT_A_CAPABILITY = re.compile(
    r"context[_ ]length|context window|maximum context|too many tokens|max_tokens|too long|prompt is too"
    r"|rate[_ ]limit|quota|api[_ ]key|unauthori[sz]ed|authentication|permission|forbidden|billing"
    r"|model[_ ]not[_ ]found|no such model|does not exist",
    re.IGNORECASE,
)


def is_capability_error(error_message: str | None) -> bool:
    """True when a provider error reads like a rejected feature (HTTP 400/404/415/422, "unsupported",
    ``invalid_request``, a complaint about ``response_format``/``json_schema``/``tool_choice``),
    as opposed to a transport failure (429/5xx are retried by the transport already).

    A 4xx that names a request problem unrelated to structured output — context length, max
    tokens, rate limit/quota, API key/auth/permission, an unknown model — is *not* a capability
    error unless it also names the feature (``response_format``, ``json_schema``, ``tool_choice``,
    tools, "not supported"): downgrading would not help, and the downgrade is cached for the
    (provider, model), so a single over-long prompt must not demote a model for good.
    """
    text = error_message or ""
    if not text or not _CAPABILITY_ERROR.search(text):
        return False
    return not _NOT_A_CAPABILITY.search(text) or bool(_FEATURE.search(text))

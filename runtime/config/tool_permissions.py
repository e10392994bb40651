"""Who may use a tool where: :class:`ToolPermissions`, declared by ``*.tool.md`` frontmatter and
by ``ai.mcp_servers.<name>`` (``platforms``, ``scopes``, ``required_any_role``) and checked when the
configuration loads (docs/decisions.md#tool-permissions).

A declaration only: the rule that enforces it on every IM turn (hiding the tool, blocking a forged
call) is :mod:`runtime.session.tool_policy`. It lives here because the configuration validates the
keys and the configuration is a leaf apart from llm types (docs/decisions.md#layout-forbidden-pairs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SCOPES", "ToolPermissions"]

SCOPES = ("private", "group", "channel")
"""Scene types a tool may be limited to (the session key's scope)."""


@dataclass(frozen=True)
class ToolPermissions:
    """Where and for whom a tool exists (docs/decisions.md#tool-permissions).

    Attributes:
        platforms: Allowed platform ids; ``None`` = every platform.
        scopes: Allowed scene types (subset of :data:`SCOPES`); ``None`` = every scope.
        required_any_role: The sender needs one of these roles; ``None`` = anyone.

    Raises:
        ValueError: a scope outside :data:`SCOPES`, or an empty list (write ``None`` / omit the key
            for "no restriction"; an empty list would silently hide the tool everywhere).
    """

    platforms: frozenset[str] | None = None
    scopes: frozenset[str] | None = None
    required_any_role: frozenset[str] | None = None

    def __post_init__(self) -> None:
        for name in ("platforms", "scopes", "required_any_role"):
            value = getattr(self, name)
            if value is not None and not value:
                raise ValueError(f"{name}: an empty list allows nobody; omit the key for no restriction")
        if self.scopes is not None:
            bad = sorted(self.scopes - set(SCOPES))
            if bad:
                raise ValueError(f"scopes: unknown scope(s) {bad}; allowed: {list(SCOPES)}")

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> ToolPermissions:
        """Build from the frontmatter / config keys ``platforms``, ``scopes``, ``required_any_role``
        (each a list of strings or absent).

        Raises:
            ValueError: a value is not a list of strings, or see the class.
        """

        def opt(key: str) -> frozenset[str] | None:
            value = data.get(key)
            if value is None:
                return None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{key}: expected a list of strings, got {value!r}")
            return frozenset(value)

        return cls(opt("platforms"), opt("scopes"), opt("required_any_role"))

    def denies(self, platform: str, scope: str, roles: frozenset[str]) -> str | None:
        """Return why a sender with ``roles`` in a ``scope`` scene on ``platform`` may not use the
        tool (``platform``, ``scope`` or ``role``), or ``None`` when it may."""
        if self.platforms is not None and platform not in self.platforms:
            return "platform"
        if self.scopes is not None and scope not in self.scopes:
            return "scope"
        if self.required_any_role is not None and not (self.required_any_role & roles):
            return "role"
        return None

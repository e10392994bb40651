"""The provider gate: where a provider call asks for a lease before each HTTP attempt
(docs/decisions.md#spend-provider-limits).

Ray-free and policy-free: this module only says what a gate is (:class:`ProviderGate`) and keeps
the one gate of the process (:func:`set_provider_gate` / :func:`provider_gate`; default none: a
call is not gated and only retries its own 429s). The granting itself lives in
:mod:`runtime.spend.limits`; the cluster-wide gate that asks one Ray actor per alias in
``actors/limits``.

Shapes: a call asks ``await gate.acquire(alias, attribution, est_tokens)`` for a :class:`Lease`
before it sends (``est_tokens``: the tokens it expects to use, input and output), and gives it
back with ``await gate.release(lease, used_tokens, status, retry_after_s)`` when the attempt
ended (``used_tokens``: the provider's reported total, ``None`` when it reported none;
``status``: the HTTP status, ``None`` for a connection failure; ``retry_after_s``: the server's
``Retry-After`` of a 429, in seconds). A wait longer than the alias's ``max_wait_s`` raises
:class:`ProviderBusyError`.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from runtime.llm.attribution import CallAttribution

__all__ = [
    "BUSY_PREFIX",
    "Lease",
    "ProviderBusyError",
    "ProviderGate",
    "is_busy_error",
    "provider_gate",
    "set_provider_gate",
]

BUSY_PREFIX = "provider busy:"
"""How the error message of a call refused by its gate starts (the session turns it into the
busy reply, docs/decisions.md#spend-provider-limits)."""


class ProviderBusyError(Exception):
    """No lease within the alias's ``max_wait_s``: the provider's limits are taken.

    Args:
        alias: The provider alias (``ai.providers.<alias>``).
        max_wait_s: The wait allowed, in seconds.
    """

    def __init__(self, alias: str, max_wait_s: float) -> None:
        super().__init__(
            f"{BUSY_PREFIX} no lease for provider {alias!r} within max_wait_s={max_wait_s:g} s "
            "(its limits are taken by other chats)"
        )
        self.alias = alias
        self.max_wait_s = max_wait_s

    def __reduce__(self) -> tuple[type[ProviderBusyError], tuple[str, float]]:
        return (ProviderBusyError, (self.alias, self.max_wait_s))  # crosses Ray intact


def is_busy_error(error_message: str | None) -> bool:
    """Whether an assistant message's ``error_message`` says its gate refused the call."""
    return bool(error_message) and str(error_message).startswith(BUSY_PREFIX)


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """The right to send one request to ``alias``; give it back with :meth:`ProviderGate.release`.

    Attributes:
        alias: The provider alias it was granted for.
        lease_id: Unique per granter (``""`` for a lease of an ungated alias).
        est_tokens: The tokens reserved for it (its estimate), corrected at release.
        waited_s: Seconds the call waited for it.
    """

    alias: str
    lease_id: str
    est_tokens: int = 0
    waited_s: float = 0.0


class ProviderGate(Protocol):
    """What a provider call asks before each HTTP attempt (see the module docstring)."""

    def governs(self, alias: str) -> bool:
        """Whether ``alias`` has limits (an ungated alias is called without a lease)."""
        ...

    async def acquire(self, alias: str, attribution: CallAttribution | None, est_tokens: int) -> Lease:
        """Wait for a lease, fairly between chats, masters first.

        Raises:
            ProviderBusyError: no lease within the alias's ``max_wait_s``.
        """
        ...

    async def release(
        self, lease: Lease, used_tokens: int | None, status: int | None, retry_after_s: float | None
    ) -> None:
        """Give ``lease`` back; a 429 ``status`` lowers the alias's rate for every caller and
        ``retry_after_s`` holds every lease back until it passed. Never raises."""
        ...


_gate: ProviderGate | None = None


def set_provider_gate(gate: ProviderGate | None) -> None:
    """Install the gate of this process (``None``: no gate). The session host installs the
    cluster-wide one when it registers the providers."""
    global _gate
    _gate = gate


def provider_gate(alias: str) -> ProviderGate | None:
    """The gate of this process if it governs ``alias``, else ``None``."""
    gate = _gate
    return gate if gate is not None and gate.governs(alias) else None

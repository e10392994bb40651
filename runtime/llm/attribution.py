"""Who an LLM call is for and why: the attribution every call carries to the usage ledger and to
the provider limits (docs/decisions.md#spend-ledger, docs/decisions.md#spend-provider-limits).

The session sets it once per turn with :func:`attributed`; a call site that calls a model for
another reason (the structured-reply correction, a capability probe, compaction, a sub-agent, an
image) narrows it with ``attributed(reason=...)``. It is a :mod:`contextvars` variable, so it
follows the turn into every task the turn starts and never leaks into another session's turn.
Code that calls a model outside any session (the probe on start, the chat CLI) sees ``None`` from
:func:`current_attribution` unless it sets one.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Literal

__all__ = ["CallAttribution", "CallReason", "attributed", "current_attribution"]

CallReason = Literal["turn", "correction", "probe", "compaction", "sub-agent", "image"]
"""Why a call was made (a bounded set: it is a metric label and a ledger column)."""


@dataclasses.dataclass(frozen=True, slots=True)
class CallAttribution:
    """The owner of an LLM call. Empty strings mean "not known" (e.g. a probe has no chat)."""

    bot_id: str = ""
    session_key: str = ""
    """The chat (``platform:bot:scope:id``; see :mod:`runtime.keys`)."""
    user_id: str = ""
    """The sender whose message started the turn."""
    session_id: str = ""
    turn_id: str = ""
    reason: CallReason = "turn"
    master: bool = False
    """The turn was started by a master of the bot (masters go first and are exempt from quotas)."""


_CURRENT: contextvars.ContextVar[CallAttribution | None] = contextvars.ContextVar(
    "sessionray_call_attribution", default=None
)


def current_attribution() -> CallAttribution | None:
    """The attribution of the code running now (``None`` outside any :func:`attributed` block)."""
    return _CURRENT.get()


@contextlib.contextmanager
def attributed(base: CallAttribution | None = None, /, **changes: object) -> Iterator[CallAttribution]:
    """Run a block with ``base`` (default: the current attribution, or an empty one) updated by
    ``changes`` (field names of :class:`CallAttribution`; ``TypeError`` for an unknown one)."""
    start = base if base is not None else (_CURRENT.get() or CallAttribution())
    value = dataclasses.replace(start, **changes)  # type: ignore[arg-type]
    token = _CURRENT.set(value)
    try:
        yield value
    finally:
        _CURRENT.reset(token)

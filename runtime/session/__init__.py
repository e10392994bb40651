"""One IM session without Ray: :class:`SessionCore` (ordered inbox, overlapping turns, the single
writer, steer / follow_up / abort), the typed control request that reaches it
(:class:`ControlRequest`, dispatched once by :func:`runtime.session.control.run_control`), the
turn records that make crash recovery possible, the agent part of a turn, chat commands, model
routing (vision, fallback chain), the IM tool policy (platforms, scopes, roles), the SQL store of
the capability cache, the console's live events, the tools a session offers (``chat_history``,
Python tools, deferred tasks, sub-agents, MCP servers, ``*.tool.md`` files), and what a turn
spends (the owner of its LLM calls, the usage ledger, the quota check before it starts:
:mod:`runtime.session.spend`). ``actors/`` hosts these cores; they never import Ray
(`docs/decisions.md#session-ray-free-core`).
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from runtime.session.control import (
        ControlKind,
        ControlReply,
        ControlRequest,
    )
    from runtime.session.core import (
        ControlOutcome,
        SessionCore,
    )
    from runtime.session.features import (
        AgentFeatures,
    )
    from runtime.session.turn import (
        SessionSetup,
        SessionWriter,
        TurnInput,
        TurnResult,
    )
else:  # each name is imported on first use (docs/decisions.md#ops-lazy-exports)
    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "AgentFeatures",
    "ControlKind",
    "ControlOutcome",
    "ControlReply",
    "ControlRequest",
    "SessionCore",
    "SessionSetup",
    "SessionWriter",
    "TurnInput",
    "TurnResult",
]

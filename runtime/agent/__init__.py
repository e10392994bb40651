"""The agent: tools and their argument validation, JSON Schema → parameter models, the stateless
``agent_loop`` (LLM call → tool batch → next call, with steer and follow_up polling), its config
and events, the tool executor, replay of stored messages, and the stateful
:class:`Agent` that owns the steer/follow_up queues. Ray-free and platform-free: a live session
drives the same :class:`Agent` as ``sessionray chat`` (`docs/decisions.md#agent-one-engine`).
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from runtime.agent.agent import (
        Agent,
        AgentBusyError,
        AgentListener,
        AgentState,
        QueueMode,
    )
    from runtime.agent.config import (
        AfterToolCallContext,
        AfterToolCallResult,
        AgentContext,
        AgentLoopConfig,
        BeforeToolCallContext,
        BeforeToolCallResult,
        ToolExecutionMode,
    )
    from runtime.agent.events import (
        AgentEndEvent,
        AgentEvent,
        AgentEventStream,
        MessageEndEvent,
    )
    from runtime.agent.loop import (
        agent_loop,
        agent_loop_continue,
    )
    from runtime.agent.tools import (
        AgentTool,
        AgentToolResult,
        ToolNotFoundError,
        ToolValidationError,
        validate_tool_call,
    )
else:  # each name is imported on first use (docs/decisions.md#ops-lazy-exports)
    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "AfterToolCallContext",
    "AfterToolCallResult",
    "Agent",
    "AgentBusyError",
    "AgentContext",
    "AgentEndEvent",
    "AgentEvent",
    "AgentEventStream",
    "AgentListener",
    "AgentLoopConfig",
    "AgentState",
    "AgentTool",
    "AgentToolResult",
    "BeforeToolCallContext",
    "BeforeToolCallResult",
    "MessageEndEvent",
    "QueueMode",
    "ToolExecutionMode",
    "ToolNotFoundError",
    "ToolValidationError",
    "agent_loop",
    "agent_loop_continue",
    "validate_tool_call",
]

"""sessionray's Ray-free core: types, the api registry, stream/complete, the agent loop.

Public API (other packages, tests and users rely on these names):
``Model``, ``Context``, ``UserMessage``, ``AssistantMessage``, ``ToolResultMessage``,
``TextContent``, ``ThinkingContent``, ``ImageContent``, ``ToolCall``, ``Usage``,
``stream``, ``complete``, ``stream_simple``, ``complete_simple``, ``register_api_provider``,
``get_api_provider``, ``agent_loop``, ``agent_loop_continue``, ``AgentLoopConfig``, ``Agent``,
``AgentTool``, ``validate_tool_call``, ``Reply`` (the IM reply contract), ``complete_structured``,
``StructuredOutputError``.
"""

from typing import TYPE_CHECKING

from runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from runtime.agent.agent import Agent, AgentState, QueueMode
    from runtime.agent.config import (
        AfterToolCallContext,
        AfterToolCallResult,
        AgentContext,
        BeforeToolCallContext,
        BeforeToolCallResult,
    )
    from runtime.agent.events import AgentEvent
    from runtime.agent.loop import AgentLoopConfig, agent_loop, agent_loop_continue
    from runtime.agent.tools import (
        AgentTool,
        AgentToolResult,
        ToolNotFoundError,
        ToolValidationError,
        validate_tool_call,
    )
    from runtime.llm.abort import AbortController, AbortSignal
    from runtime.llm.events import AssistantMessageEvent, AssistantMessageEventStream
    from runtime.llm.options import SimpleStreamOptions, StreamOptions
    from runtime.llm.registry import (
        UnknownApiError,
        get_api_provider,
        register_api_provider,
        unregister_api_providers,
    )
    from runtime.llm.stream import complete, complete_simple, stream, stream_simple
    from runtime.llm.types import (
        AgentMessage,
        AssistantMessage,
        Context,
        CustomMessage,
        ImageContent,
        Message,
        Model,
        TextContent,
        ThinkingContent,
        Tool,
        ToolCall,
        ToolResultMessage,
        Usage,
        UserMessage,
    )
    from runtime.reply.segments import Reply
    from runtime.reply.structured import StructuredOutputError, complete_structured
else:  # each name is imported on first use (docs/decisions.md#ops-lazy-exports)
    __getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "AbortController",
    "AbortSignal",
    "AfterToolCallContext",
    "AfterToolCallResult",
    "Agent",
    "AgentContext",
    "AgentEvent",
    "AgentLoopConfig",
    "AgentMessage",
    "AgentState",
    "AgentTool",
    "AgentToolResult",
    "AssistantMessage",
    "AssistantMessageEvent",
    "AssistantMessageEventStream",
    "BeforeToolCallContext",
    "BeforeToolCallResult",
    "Context",
    "CustomMessage",
    "ImageContent",
    "Message",
    "Model",
    "QueueMode",
    "Reply",
    "SimpleStreamOptions",
    "StreamOptions",
    "StructuredOutputError",
    "TextContent",
    "ThinkingContent",
    "Tool",
    "ToolCall",
    "ToolNotFoundError",
    "ToolResultMessage",
    "ToolValidationError",
    "UnknownApiError",
    "Usage",
    "UserMessage",
    "agent_loop",
    "agent_loop_continue",
    "complete",
    "complete_simple",
    "complete_structured",
    "get_api_provider",
    "register_api_provider",
    "stream",
    "stream_simple",
    "unregister_api_providers",
    "validate_tool_call",
]

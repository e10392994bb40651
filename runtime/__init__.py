"""sessionray's Ray-free core: types, the api registry, stream/complete, the agent loop.

Public API (other packages, tests and users rely on these names):
``Model``, ``Context``, ``UserMessage``, ``AssistantMessage``, ``ToolResultMessage``,
``TextContent``, ``ThinkingContent``, ``ImageContent``, ``ToolCall``, ``Usage``,
``stream``, ``complete``, ``stream_simple``, ``complete_simple``, ``register_api_provider``,
``get_api_provider``, ``agent_loop``, ``agent_loop_continue``, ``AgentLoopConfig``, ``Agent``,
``AgentTool``, ``validate_tool_call``.
"""

from runtime.abort import AbortController, AbortSignal
from runtime.events import AssistantMessageEvent, AssistantMessageEventStream
from runtime.options import SimpleStreamOptions, StreamOptions
from runtime.registry import (
    UnknownApiError,
    get_api_provider,
    register_api_provider,
    unregister_api_providers,
)
from runtime.stream import complete, complete_simple, stream, stream_simple
from runtime.types import (
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

__all__ = [
    "AbortController",
    "AbortSignal",
    "AgentMessage",
    "AssistantMessage",
    "AssistantMessageEvent",
    "AssistantMessageEventStream",
    "Context",
    "CustomMessage",
    "ImageContent",
    "Message",
    "Model",
    "SimpleStreamOptions",
    "StreamOptions",
    "TextContent",
    "ThinkingContent",
    "Tool",
    "ToolCall",
    "ToolResultMessage",
    "UnknownApiError",
    "Usage",
    "UserMessage",
    "complete",
    "complete_simple",
    "get_api_provider",
    "register_api_provider",
    "stream",
    "stream_simple",
    "unregister_api_providers",
]

"""The LLM layer: message and model types, call options, the event stream and its builder, the
api registry, ``stream``/``complete`` and cancellation. It knows no agent, no session and no
platform; provider adapters (``providers/``) register wire protocols here by ``api`` id, and
everything above calls a model only through :func:`stream` / :func:`complete`
(`docs/decisions.md#llm-single-entry`).
"""

from runtime.llm.abort import (
    AbortController,
    AbortSignal,
)
from runtime.llm.builder import (
    MessageBuilder,
)
from runtime.llm.event_stream import EventStream
from runtime.llm.events import (
    AssistantMessageEvent,
    AssistantMessageEventStream,
)
from runtime.llm.options import (
    ReasoningLevel,
    SimpleStreamOptions,
    StreamOptions,
)
from runtime.llm.registry import (
    ApiMismatchError,
    ApiProvider,
    StreamFn,
    StreamSimpleFn,
    UnknownApiError,
    get_api_provider,
    list_api_providers,
    register_api_provider,
    unregister_api_providers,
)
from runtime.llm.stream import (
    complete,
    complete_simple,
    stream,
    stream_simple,
)
from runtime.llm.types import (
    AgentMessage,
    AssistantContent,
    AssistantMessage,
    Context,
    Cost,
    CustomMessage,
    ImageContent,
    InputKind,
    Message,
    Model,
    ModelCost,
    StopReason,
    TextContent,
    ThinkingContent,
    Tool,
    ToolCall,
    ToolResultContent,
    ToolResultMessage,
    Usage,
    UserContent,
    UserMessage,
    now_ms,
)

__all__ = [
    "AbortController",
    "AbortSignal",
    "AgentMessage",
    "ApiMismatchError",
    "ApiProvider",
    "AssistantContent",
    "AssistantMessage",
    "AssistantMessageEvent",
    "AssistantMessageEventStream",
    "Context",
    "Cost",
    "CustomMessage",
    "EventStream",
    "ImageContent",
    "InputKind",
    "Message",
    "MessageBuilder",
    "Model",
    "ModelCost",
    "ReasoningLevel",
    "SimpleStreamOptions",
    "StopReason",
    "StreamFn",
    "StreamOptions",
    "StreamSimpleFn",
    "TextContent",
    "ThinkingContent",
    "Tool",
    "ToolCall",
    "ToolResultContent",
    "ToolResultMessage",
    "UnknownApiError",
    "Usage",
    "UserContent",
    "UserMessage",
    "complete",
    "complete_simple",
    "get_api_provider",
    "list_api_providers",
    "now_ms",
    "register_api_provider",
    "stream",
    "stream_simple",
    "unregister_api_providers",
]

"""The built-in offline model: a ``faux`` provider whose reply is a fixed function of the input.

It is **not an LLM**. It lets ``make run`` (``sessionray chat``) and the runtime work with no
provider configured (docs/decisions.md#llm-builtin-model). Its behaviour, :func:`builtin_respond`,
looks only at the last message of the context:

1. No messages: a greeting that says what it is.
2. Last message is a tool result: ``"Tool <name> returned: <text>"`` for each tool result of the
   running turn — every one after the last assistant message without tool calls (one line each;
   ``"Tool <name> failed: <text>"`` for error results).
3. Last message is from the user, with text ``T`` (text blocks joined; images counted; the sender
   prefix ``[sender:id=… name=… roles=…]`` that group scenes put before the text for the model is
   removed by :func:`runtime.reply.sender.strip_forged_prefix`, so the answer is about the user's
   words only):

   * ``T`` contains ``count`` and ``slow`` (any case: "count to 10 slowly") and the
     ``count_slowly`` tool is available: it calls ``count_slowly`` with ``{"to": N}``, ``N`` the
     first number in ``T`` (default 10, at most :data:`COUNT_MAX`): a turn of ~N seconds, so
     a steer can be seen mid-turn;
   * ``T`` contains ``time`` or ``clock`` (any case) and the ``clock`` tool is available: it calls
     ``clock`` with ``{}``;
   * otherwise ``T`` contains ``tool`` and the ``echo`` tool is available: it calls ``echo`` with
     ``{"text": T}``;
   * otherwise it answers ``"You said: T"`` (plus ``" [+N image(s)]"`` when images were sent),
     or ``"You sent no text."`` for an empty message; when the message was steered in after the
     running turn's tool results (it follows a tool result), those results' lines (as in 2.) come
     first, so what the tools did still reaches the user.

Tool-call ids are ``builtin-<number of messages in the context>``, so a reply depends on nothing
but its input. Usage is reported as zero tokens and zero cost.

The responder is one small replaceable function: :func:`set_builtin_responder` swaps it (the
structured-replies layer uses this to answer ``output_schema``/forced ``tool_choice`` calls), and
``set_builtin_responder(None)`` restores :func:`builtin_respond`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import re
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from providers.faux import (
    faux_assistant_message,
    faux_text,
    faux_tool_call,
    get_faux_provider,
    register_faux_provider,
)
from runtime.agent.tools import AgentTool, AgentToolResult, ToolUpdateFn
from runtime.llm.abort import AbortSignal
from runtime.llm.options import StreamOptions
from runtime.llm.types import (
    AssistantMessage,
    Context,
    ImageContent,
    Model,
    TextContent,
    ToolResultMessage,
    UserMessage,
)

__all__ = [
    "BUILTIN_MAX_CHUNKS",
    "BUILTIN_MODEL_ID",
    "BUILTIN_PROVIDER",
    "COUNT_MAX",
    "COUNT_STEP_S",
    "BuiltinResponder",
    "CountArgs",
    "builtin_model",
    "builtin_respond",
    "builtin_tools",
    "set_builtin_responder",
]

BUILTIN_PROVIDER = "builtin"
"""``Model.provider`` of the built-in model (its ``api`` is ``faux``)."""
BUILTIN_MODEL_ID = "sessionray-builtin"
BUILTIN_MAX_CHUNKS = 64
"""At most this many streamed deltas per content block of a built-in reply (short replies still
stream in 4-character chunks; a longer one in proportionally larger ones — same text)."""

COUNT_MAX = 60
"""The ``count_slowly`` demo tool counts to at most this many."""
COUNT_STEP_S = 1.0
"""Seconds between two steps of ``count_slowly`` (its default ``step_s``)."""

BuiltinResponder = Callable[[Context, StreamOptions | None], AssistantMessage]

GREETING = (
    "Hello! I am sessionray's built-in offline model. I am not an LLM: I echo what you write, "
    "and I call the demo tools when you mention the time or a tool. Configure a provider in "
    "sessionray.yaml for real answers."
)


def _user_text(message: UserMessage) -> tuple[str, int]:
    """The user's own text (the group sender prefix removed) and the number of images."""
    from runtime.reply.sender import strip_forged_prefix

    if isinstance(message.content, str):
        return strip_forged_prefix(message.content), 0
    text = "".join(b.text for b in message.content if isinstance(b, TextContent))
    images = sum(1 for b in message.content if isinstance(b, ImageContent))
    return strip_forged_prefix(text), images


def _result_text(message: ToolResultMessage) -> str:
    return "".join(b.text for b in message.content if isinstance(b, TextContent))


def _segments_mode(context: Context, options: StreamOptions | None) -> str | None:
    """How an IM reply is requested (runtime.reply.im_reply): ``tool`` (a ``reply`` tool is offered and
    forced), ``text`` (native ``output_schema`` named ``reply``, or the IM instructions in the system
    prompt: the prompt tier), or ``None`` (plain text)."""
    from runtime.reply.im_reply import IM_INSTRUCTIONS, REPLY_TOOL

    tools = {t.name for t in context.tools or []}
    if options is not None and REPLY_TOOL in tools and options.tool_choice in (REPLY_TOOL, "required"):
        return "tool"
    if options is not None and options.output_schema is not None and options.output_schema_name == REPLY_TOOL:
        return "text"
    return "text" if IM_INSTRUCTIONS in context.system_prompt else None


def builtin_respond(context: Context, options: StreamOptions | None = None) -> AssistantMessage:
    """The built-in model's reply: a pure function of ``context`` (see the module docstring).

    When the call asks for the IM reply contract (``runtime.reply.im_reply``: native ``output_schema``
    named ``reply``, a forced ``reply`` tool, or the IM instructions in the system prompt), a text
    answer is wrapped as a valid ``Reply`` — ``{"segments": [{"type": "text", ...}]}`` — as the
    message text or as the ``reply`` tool's arguments; business tool calls stay as they are.
    """
    plain = _plain_respond(context)
    mode = _segments_mode(context, options)
    if mode is None or plain.tool_calls():
        return plain
    from runtime.reply.segments import Reply

    reply = Reply.of_text(plain.text()).model_dump(mode="json")
    if mode == "tool":
        return faux_assistant_message([faux_tool_call("reply", reply, id=f"builtin-{len(context.messages)}")])
    return faux_assistant_message(json.dumps(reply, ensure_ascii=False))


def _plain_respond(context: Context) -> AssistantMessage:
    messages = context.messages
    if not messages:
        return faux_assistant_message(GREETING)
    last = messages[-1]
    if isinstance(last, ToolResultMessage):
        return faux_assistant_message("\n".join(_result_lines(_turn_results(messages))))
    if not isinstance(last, UserMessage):
        return faux_assistant_message(GREETING)
    answer = _user_answer(context, last)
    before = messages[: len(messages) - _trailing_users(messages)]
    if answer.tool_calls() or not before or not isinstance(before[-1], ToolResultMessage):
        return answer
    # Steered: the message came after the running turn's tool results. Report them with the
    # answer, or the user never sees what the tools did (docs/providers.md#the-built-in-model).
    lines = [*_result_lines(_turn_results(before)), answer.text()]
    return faux_assistant_message(faux_text("\n".join(lines)))


def _turn_results(messages: list[Any]) -> list[ToolResultMessage]:
    """The tool results of the running turn, in order: every tool result after the last assistant
    message without tool calls (the previous final answer)."""
    found: list[ToolResultMessage] = []
    for m in reversed(messages):
        if isinstance(m, AssistantMessage) and not m.tool_calls():
            break
        if isinstance(m, ToolResultMessage):
            found.insert(0, m)
    return found


def _trailing_users(messages: list[Any]) -> int:
    """How many user messages end ``messages`` (the steered ones after a tool batch)."""
    n = 0
    for m in reversed(messages):
        if not isinstance(m, UserMessage):
            break
        n += 1
    return n


def _result_lines(results: list[ToolResultMessage]) -> list[str]:
    return [
        f"Tool {r.tool_name} {'failed' if r.is_error else 'returned'}: {_result_text(r)}" for r in results
    ]


def _user_answer(context: Context, last: UserMessage) -> AssistantMessage:
    """The answer to the user message ``last`` alone: a demo tool call or ``You said: …``."""
    messages = context.messages
    text, images = _user_text(last)
    tools = {t.name for t in context.tools or []}
    lowered = text.lower()
    call_id = f"builtin-{len(messages)}"
    if "count" in lowered and "slow" in lowered and "count_slowly" in tools:
        number = re.search(r"\d+", text)
        to = min(int(number.group()), COUNT_MAX) if number else 10
        return faux_assistant_message([faux_tool_call("count_slowly", {"to": max(to, 1)}, id=call_id)])
    if ("time" in lowered or "clock" in lowered) and "clock" in tools:
        return faux_assistant_message([faux_tool_call("clock", {}, id=call_id)])
    if "tool" in lowered and "echo" in tools:
        return faux_assistant_message([faux_tool_call("echo", {"text": text}, id=call_id)])
    if not text.strip() and not images:
        return faux_assistant_message("You sent no text.")
    suffix = f" [+{images} image(s)]" if images else ""
    return faux_assistant_message(faux_text(f"You said: {text}{suffix}"))


_responder: BuiltinResponder = builtin_respond


def set_builtin_responder(responder: BuiltinResponder | None) -> None:
    """Replace the built-in model's reply function (``None`` restores :func:`builtin_respond`)."""
    global _responder
    _responder = responder or builtin_respond


def _respond(context: Context, options: StreamOptions | None) -> AssistantMessage:
    return _responder(context, options)


def builtin_model() -> Model:
    """Return the built-in model, registering its faux provider (``builtin``) on first use.

    Idempotent; the model is ``Model(id="sessionray-builtin", api="faux", provider="builtin")``
    with a 32 768-token context window.
    """
    try:
        return get_faux_provider(BUILTIN_PROVIDER).get_model()
    except KeyError:
        pass
    model = Model(
        id=BUILTIN_MODEL_ID,
        name="built-in offline model (not an LLM)",
        api="faux",
        provider=BUILTIN_PROVIDER,
        context_window=32_768,
        max_tokens=1_024,
    )
    # max_recorded_calls=0: the built-in model serves long-lived sessions; keep no context copies.
    # max_chunks: a reply streams in at most BUILTIN_MAX_CHUNKS deltas per block (a multi-MB echo
    # in 4-character deltas kept a session busy for minutes; docs/decisions.md#llm-builtin-model).
    handle = register_faux_provider(
        provider=BUILTIN_PROVIDER,
        models=[model],
        default_response=_respond,
        max_recorded_calls=0,
        max_chunks=BUILTIN_MAX_CHUNKS,
    )
    return handle.get_model()


class ClockArgs(BaseModel):
    """Arguments of the ``clock`` demo tool."""

    timezone: str = Field(default="UTC", description="IANA time zone name, e.g. Europe/Paris.")


class CountArgs(BaseModel):
    """Arguments of the ``count_slowly`` demo tool."""

    to: int = Field(default=10, ge=1, le=COUNT_MAX, description="Count from 1 up to this number.")
    step_s: float = Field(default=COUNT_STEP_S, ge=0, le=10, description="Seconds between two numbers.")


class EchoArgs(BaseModel):
    """Arguments of the ``echo`` demo tool."""

    text: str = Field(description="Text to echo back.")


async def _clock(
    call_id: str, params: Any, signal: AbortSignal | None, on_update: ToolUpdateFn
) -> AgentToolResult:
    try:
        zone = ZoneInfo(params.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {params.timezone!r}") from None
    now = dt.datetime.now(zone).replace(microsecond=0)
    return AgentToolResult(content=[TextContent(text=now.isoformat())], details={"timezone": params.timezone})


async def _echo(
    call_id: str, params: Any, signal: AbortSignal | None, on_update: ToolUpdateFn
) -> AgentToolResult:
    return AgentToolResult.text(params.text)


async def _count_slowly(
    call_id: str, params: Any, signal: AbortSignal | None, on_update: ToolUpdateFn
) -> AgentToolResult:
    """Count 1..``to``, one number every ``step_s`` seconds (each one reported through
    ``on_update``); the abort signal is checked between steps and ends the count early (the
    result says where it stopped)."""
    counted: list[int] = []
    for n in range(1, params.to + 1):
        if signal is not None and signal.aborted:
            break
        counted.append(n)
        on_update(AgentToolResult.text(str(n)))
        if n < params.to:
            await _pause(params.step_s, signal)
    shown = " ".join(map(str, counted))
    if len(counted) < params.to:
        return AgentToolResult.text(f"stopped at {len(counted)} of {params.to} (aborted): {shown}")
    return AgentToolResult.text(f"counted to {params.to}: {shown}")


async def _pause(seconds: float, signal: AbortSignal | None) -> None:
    """Sleep ``seconds``, returning early when ``signal`` fires."""
    if signal is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(signal.wait(), seconds)


def builtin_tools() -> list[AgentTool[Any]]:
    """Return the demo tools the built-in model knows: ``clock`` (current time, ISO 8601, in an
    IANA zone, default UTC), ``echo`` (returns its ``text``) and ``count_slowly`` (counts to ``to``,
    one number every ``step_s`` = 1 s, stopping early on abort: a turn long enough to steer)."""
    return [
        AgentTool("clock", "Return the current date and time (ISO 8601) in a time zone.", ClockArgs, _clock),
        AgentTool("echo", "Echo the given text back.", EchoArgs, _echo),
        AgentTool(
            "count_slowly",
            "Count from 1 to a number slowly, one number per step (default 1 s); stops when aborted.",
            CountArgs,
            _count_slowly,
        ),
    ]

"""The example bot's model replaced by scripted faux models, inside the Ray worker processes.

The example (``examples/bot/sessionray.yaml``) names real providers. The test keeps every key of
it and adds two ``api: faux`` providers (:data:`FAUX_PROVIDERS`), made ``ai.default_model`` and
``ai.vision_model``. A faux model answers only where a handle is registered under its provider
name, and session actors build their setup in their own process; so :class:`ExampleFauxSetup` is
the real :class:`actors.placement.hosts.setup.ConfigSetupFactory` whose ``prepare`` (run in each session
actor) first registers the two scripted handles. Everything else — tools, MCP, delegate, commands,
vision routing, the IM preset — comes from the configuration as in ``sessionray serve``.

The scripts fake only the model's judgement; each reply is a pure function of the context sent:

chat model (``faux-chat/chat``), on the last user text ``T`` (group sender prefix removed):

* ``delegate X``            → call ``delegate`` with task ``X``;
* ``... convert N U1 to U2`` → call ``convert_units`` (the Python ``AgentTool``);
* ``... count: X``          → call ``text_stats`` (the ``*.tool.md`` tool) with text ``X``;
* ``... faq X``             → call ``faq_search`` (the MCP server) with query ``X``;
* anything else             → answer ``You said: T`` (no tool);
* after tool results        → answer ``<tool>: <result>`` per result, joined by ``; ``.

Answers are reply-contract JSON when the IM preset is in the system prompt; otherwise (the
``delegate`` sub-agent, which never gets the preset) plain text prefixed ``helper: ``.

vision model (``faux-vision/vision``): ``vision model saw N image(s): <reference lines>``.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from actors.placement.hosts.setup import ConfigSetupFactory
from runtime.llm.types import (
    AssistantMessage,
    Context,
    ImageContent,
    TextContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

CHAT, VISION = "faux-chat", "faux-vision"
"""Provider aliases of the scripted models (also the faux handle names)."""

FAUX_PROVIDERS: dict[str, dict[str, Any]] = {
    CHAT: {
        "api": "faux",
        "models": [{"id": "chat", "context_window": 8192}],
        "compat": {"structured_output": "native"},
    },
    VISION: {
        "api": "faux",
        "models": [{"id": "vision", "input": ["text", "image"], "context_window": 8192}],
        "compat": {"structured_output": "native"},
    },
}
"""``ai.providers`` entries added to the example's configuration (``compat`` pins the structured
output tier, so ``/models`` shows the same in every process)."""

_PREFIX = re.compile(r"\A\[sender:[^\]]*\]\s*")


def _text(message: Any) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(b.text for b in content if isinstance(b, TextContent))


def _answer(context: Context, text: str) -> AssistantMessage:
    from runtime.reply.im_reply import IM_INSTRUCTIONS

    if IM_INSTRUCTIONS in context.system_prompt:
        body = json.dumps({"segments": [{"type": "text", "data": {"text": text}}]}, ensure_ascii=False)
    else:
        body = f"helper: {text}"
    return AssistantMessage(content=[TextContent(text=body)])


def _call(name: str, arguments: dict[str, Any]) -> AssistantMessage:
    call = ToolCall(id=f"call-{uuid.uuid4().hex[:10]}", name=name, arguments=arguments)
    return AssistantMessage(content=[call], stop_reason="toolUse")


def chat_reply(context: Context, options: Any = None) -> AssistantMessage:
    """The scripted chat model (module docstring)."""
    msgs = context.messages
    if msgs and isinstance(msgs[-1], ToolResultMessage):
        start = len(msgs)
        while start > 0 and isinstance(msgs[start - 1], ToolResultMessage):
            start -= 1
        results = [m for m in msgs[start:] if isinstance(m, ToolResultMessage)]
        return _answer(context, "; ".join(f"{r.tool_name}: {_text(r)}" for r in results))
    user = next((m for m in reversed(msgs) if isinstance(m, UserMessage)), None)
    text = _PREFIX.sub("", _text(user)) if user is not None else ""
    if m := re.match(r"delegate (.+)", text, re.S):
        return _call("delegate", {"task": m[1]})
    if m := re.search(r"convert (-?[\d.]+) ?([a-z]+) to ([a-z]+)", text):
        return _call("convert_units", {"value": m[1], "from_unit": m[2], "to_unit": m[3]})
    if m := re.search(r"count: (.+)", text, re.S):
        return _call("text_stats", {"text": m[1]})
    if m := re.search(r"faq (.+)", text, re.S):
        return _call("faq_search", {"query": m[1]})
    return _answer(context, f"You said: {text}")


def vision_reply(context: Context, options: Any = None) -> AssistantMessage:
    """The scripted vision model (module docstring)."""
    user = next((m for m in reversed(context.messages) if isinstance(m, UserMessage)), None)
    refs = re.findall(r"\[image url=[^\]]+\]", _text(user)) if user is not None else []
    blocks = [] if user is None or isinstance(user.content, str) else user.content
    n = len(refs) + len([b for b in blocks if isinstance(b, ImageContent)])
    return _answer(context, f"vision model saw {n} image(s): {' '.join(refs)}")


class ExampleFauxSetup(ConfigSetupFactory):
    """:class:`ConfigSetupFactory` that first registers the scripted handles in its process."""

    def prepare(self, *, database: Any = None) -> None:
        """Register :func:`chat_reply` / :func:`vision_reply` under :data:`CHAT` / :data:`VISION`
        (once per process), then build the setup as the real factory does."""
        if self._shared is None:
            from providers.faux import register_faux_provider

            for provider, model, respond in ((CHAT, "chat", chat_reply), (VISION, "vision", vision_reply)):
                register_faux_provider(
                    provider=provider,
                    models=[model],
                    chunk_size=256,
                    default_response=respond,
                    max_recorded_calls=0,
                )
        super().prepare(database=database)

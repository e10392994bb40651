"""The agent features of an IM session, wired into one turn
(through the loop's hooks: docs/decisions.md#agent-loop-hooks).

:class:`AgentFeatures` is what ``SessionSetup.features`` holds. The turn runner
(:mod:`runtime.session.turn`, :mod:`runtime.session.core`) calls it at four points:

1. **before the agent** — :meth:`AgentFeatures.command` recognises a chat command
   (:mod:`runtime.session.commands`); :meth:`AgentFeatures.run_command` answers it with a ``Reply`` that
   the session delivers like any reply; the agent never sees it;
2. **the user message** — :meth:`AgentFeatures.user_message`: the inbound text plus one
   ``[image url=...]`` line per media reference (so the model can reuse what it was given,
   :mod:`runtime.reply.provenance`) and the inbound images as image blocks;
3. **the loop** — :meth:`AgentFeatures.prepare_turn` routes the model (vision,
   :mod:`runtime.session.model_routing`) and adds the MCP tools (lazy connection,
   :mod:`runtime.session.mcp_tools`);
   :meth:`AgentFeatures.configure` installs the fallback chain and the tool permissions
   (:mod:`runtime.session.tool_policy`) on the ``AgentLoopConfig``;
4. **the reply** — :meth:`AgentFeatures.identity` validates mentions and media provenance.

Built from the configuration by :meth:`AgentFeatures.from_config` inside the session host.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from runtime.agent.config import AgentLoopConfig
from runtime.agent.tools import AgentTool
from runtime.config.spend import QuotaScope
from runtime.llm.types import AgentMessage, ImageContent, Model, TextContent, UserMessage
from runtime.reply.provenance import IdentityFold, ProvenanceIdentity
from runtime.reply.segments import Reply
from runtime.session.commands import CommandHandler, ParsedCommand, SessionStatus, command_text
from runtime.session.mcp_tools import McpToolset
from runtime.session.model_routing import FallbackChain, has_image_segments, select_model
from runtime.session.spend import turn_owner
from runtime.session.tool_policy import PolicyCheck, TurnScope, apply_tool_policy
from runtime.spend.quotas import Quotas, QuotaStatus

__all__ = ["AgentFeatures"]

log = logging.getLogger("runtime.session.features")


@dataclass
class AgentFeatures:
    """Per-session agent features (see the module docstring).

    Attributes:
        vision_model: ``ai.vision_model`` (``None``: images go to the main model or become a placeholder).
        fallback_models: ``ai.fallback_models`` in order.
        mcp: The session's MCP servers (``None``: none configured).
        policies: Tool-call policies (``tool name`` or ``"*"`` → checks), see
            :mod:`runtime.session.tool_policy`.
        media_url_allowlist: ``ai.media_url_allowlist``.
        commands: The chat-command handler (``None``: no commands).
        media_policy: How inbound image references are read for the model
            (:class:`runtime.reply.media.MediaPolicy`; default: public URLs and base64 only).
        quotas: ``spend.quotas`` checked before each turn (:class:`runtime.spend.quotas.Quotas`;
            ``None``: none; docs/decisions.md#spend-quotas).
    """

    vision_model: Model | None = None
    fallback_models: list[Model] = field(default_factory=list)
    mcp: McpToolset | None = None
    policies: dict[str, list[PolicyCheck]] = field(default_factory=dict)
    media_url_allowlist: list[str] = field(default_factory=list)
    commands: CommandHandler | None = None
    media_policy: Any = None
    quotas: Quotas | None = None

    @classmethod
    def from_config(cls, config: Any, *, builtin_model: Model | None = None) -> AgentFeatures:
        """Build from a :class:`runtime.config.Config` (``ai.vision_model``, ``fallback_models``,
        ``mcp_servers``, ``media_url_allowlist``, ``commands``; ``spend``); ``builtin_model``: the model the
        sessions run on when none is configured (``/models`` lists it: ``CommandHandler``).

        Raises:
            runtime.config.ConfigError: a model reference names an unknown provider.
            ValueError: a bad ``ai.commands`` entry.
        """
        from runtime.config import resolve_model_ref

        ai = config.ai
        return cls(
            vision_model=resolve_model_ref(ai.vision_model, config) if ai.vision_model else None,
            fallback_models=[resolve_model_ref(ref, config) for ref in ai.fallback_models],
            mcp=McpToolset(ai.mcp_servers) if ai.mcp_servers else None,
            media_url_allowlist=list(ai.media_url_allowlist),
            commands=CommandHandler.from_config(config, builtin_model=builtin_model),
            quotas=Quotas(config.spend),
        )

    # ------------------------------------------------------------------ 1. commands
    def command(self, turn: Any) -> ParsedCommand | None:
        """The chat command in an inbound turn's text, or ``None`` (control turns are never
        commands). Leading mentions of the bot are skipped (``@bot /new`` in a group,
        :func:`runtime.session.commands.command_text`)."""
        if self.commands is None or getattr(turn, "kind", "inbound") != "inbound":
            return None
        return self.commands.parse(command_text(turn.text, turn.segments, turn.bot_id))

    async def run_command(self, cmd: ParsedCommand, turn: Any, core: Any, ctl: Any) -> Reply:
        """Answer ``cmd`` against the live session ``core`` (a ``SessionCore``); ``ctl`` is the
        command's own turn, which steer/follow-up and ``/status`` leave out. The turn's scene
        decides who may run ``/new`` (masters only in groups and channels)."""
        assert self.commands is not None
        host = _CoreHost(core, ctl, turn)
        return await self.commands.handle(cmd, turn.sender, host, scene_type=turn.scene_type)

    # ------------------------------------------------------------------ 2. user message
    async def user_message(self, turn: Any, model: Model) -> UserMessage:
        """The stored user message of an inbound turn: text, then one line per non-text segment
        (media references, ``[face 14]``, ``[sticker 😀 file=…]``…: :mod:`runtime.platforms.placeholders`;
        never empty), then image blocks.

        Images are read only when some model of the session can see them (``vision_model`` is set
        or the main ``model`` accepts ``image``). An image that cannot be read (refused address,
        too large, not an image) stays only as its reference line; the turn goes on.
        """
        base: UserMessage = turn.user_message()  # text and placeholder lines, never empty
        text = cast(str, base.content)  # TurnInput.user_message: docs/decisions.md#platform-placeholders
        sees = self.vision_model is not None or "image" in model.input
        images = await self._images(turn) if sees and has_image_segments(turn.segments) else []
        content: str | list[TextContent | ImageContent] = (
            [TextContent(text=text), *images] if images else text
        )
        return base.model_copy(update={"content": content})

    async def _images(self, turn: Any) -> list[ImageContent]:
        from runtime.reply.media import MediaPolicy, MediaRejected, resolve_media
        from runtime.reply.segments import Media

        policy = self.media_policy or MediaPolicy()
        out: list[ImageContent] = []
        for seg in turn.segments:
            media = (seg.get("data") or {}).get("media") if seg.get("type") == "image" else None
            if not isinstance(media, dict) or media.get("kind") == "file":
                continue
            try:
                got = await resolve_media("image", Media.model_validate(media), policy, turn.platform)
            except (MediaRejected, ValueError) as exc:
                log.info("inbound image not readable for the model (%s): %s", media.get("kind"), exc)
                continue
            if got.data is not None and got.mime:
                out.append(ImageContent(data=base64.b64encode(got.data).decode(), mime_type=got.mime))
        return out

    # ------------------------------------------------------------------ 3. the loop
    async def prepare_turn(self, setup: Any, turn: Any) -> tuple[Any, list[AgentTool[Any]]]:
        """Return ``(setup with the routed model, every tool of the turn incl. MCP tools)``.

        Vision routing: the turn's inbound images + ``vision_model`` → the vision model;
        otherwise the session's main model (docs/decisions.md#model-routing).
        """
        has_images = has_image_segments(getattr(turn, "segments", []))
        model, _route = select_model(setup.model, self.vision_model, has_images)
        tools = list(setup.tools)
        if self.mcp is not None:
            tools += await self.mcp.tools()
        return (replace(setup, model=model) if model is not setup.model else setup), tools

    def configure(
        self, loop_config: AgentLoopConfig, tools: Sequence[AgentTool[Any]], turn: Any
    ) -> AgentLoopConfig:
        """Install the fallback chain (``stream_fn``) and the tool permissions of ``turn``'s
        platform, scope and sender roles on ``loop_config``. Run the loop with ``tools``."""
        chain = FallbackChain(self.fallback_models, base_stream_fn=loop_config.stream_fn)
        config = replace(loop_config, stream_fn=chain)
        scope = TurnScope.of(turn.platform, turn.scene_type, turn.sender)
        return apply_tool_policy(config, tools, scope, self.policies)

    # ------------------------------------------------------------------ 4. the reply
    def identity(
        self, sender_id: str | None, messages: Sequence[AgentMessage], fold: IdentityFold | None = None
    ) -> ProvenanceIdentity:
        """Mention identity + media provenance over the turn's whole context; ``fold``: the
        session's, which reads only what is new since its last call
        (docs/decisions.md#agent-incremental-convert)."""
        return (fold or IdentityFold()).with_media(sender_id, messages, self.media_url_allowlist)

    async def close(self) -> None:
        """Close the MCP connections (session passivation)."""
        if self.mcp is not None:
            await self.mcp.close()


class _CoreHost:
    """:class:`runtime.session.commands.CommandHost` over a live ``SessionCore``."""

    def __init__(self, core: Any, ctl: Any, turn: Any) -> None:
        self.core, self.ctl, self.turn = core, ctl, turn

    async def archive(self) -> int:
        session_id: str = await self.core.archive()
        return _epoch(session_id)

    async def status(self) -> SessionStatus:
        info = await self.core.repo.get_session(self.core.session_id)
        model = (info.model if info is not None else "") or self.core.setup.model.ref()
        running = max(0, int(self.core.status()["active_turns"]) - 1)  # not the command's own turn
        return SessionStatus(model, len(self.core.writer), _epoch(self.core.session_id), running)

    async def usage(self, scopes: Sequence[QuotaScope]) -> tuple[list[QuotaStatus], str]:
        spend = self.core.spend
        owner = turn_owner(self.turn, self.core.session_id)
        zone = spend.quotas.config.timezone if spend.quotas is not None else "UTC"
        return await spend.usage(owner, scopes), zone

    def steer(self, text: str, sender_id: str) -> str:
        self.ctl.closed = True  # the command's own turn never receives the steering
        return str(self.core.steer(text, sender_id))

    def follow_up(self, text: str, sender_id: str) -> str:
        self.ctl.closed = True
        return str(self.core.follow_up(text, sender_id))


def _epoch(session_id: str) -> int:
    from runtime.keys import parse_session_id

    return parse_session_id(session_id).epoch

"""Chat commands handled before the agent, never sent to the model
(docs/decisions.md#chat-commands).

Commands (names configurable in ``ai.commands.names``; the text must start with ``/<name>``,
optionally ``/<name>@<bot username>`` as Telegram groups send it; in a group the command may
follow leading mentions of the bot — ``@bot /new`` — see :func:`command_text`):

* ``/new``, ``/clear`` — archive the session and start a new epoch (``ContextRepository.archive_session``);
  in a private chat anyone (it is their own conversation); in a group or channel masters only,
  since the context is shared by every member (state-changing control stays with masters:
  docs/decisions.md#steer-masters-only); others get the ``not_master`` refusal and nothing is
  archived;
* ``/models`` — the configured models: ``provider/id``, api, context window, input kinds and the
  structured-output tier (``native``/``tool``/``prompt``, ``unknown`` before first use) with its
  source (``probe``/``config``/``downgrade``) and age, read from the capability store
  (docs/decisions.md#structured-capability-cache);
* ``/status`` — the session's model, message count, epoch and whether a turn is running;
* ``/usage`` — what the sender used in the current quota windows and what is left of each quota
  (``spend.quotas``); a master also sees the chat's and the bot's (docs/decisions.md#spend-quotas);
* ``/steer <text>``, ``/followup <text>`` — masters only (docs/decisions.md#steer-masters-only);
  others get a refusal;
* ``/help`` — the commands the sender may use here, by the names they type, one line each
  (``help_<command>`` texts): a master sees every command, anyone else neither ``/steer`` nor
  ``/followup``, and in a group or channel not ``/new``/``/clear`` either.

A command's answer is a :class:`~runtime.reply.segments.Reply` (one text segment) that the session
delivers through the same segments path and delivery as an agent reply. Reply texts are
``str.format`` templates keyed as in :data:`DEFAULT_TEXTS`, overridable in ``ai.commands.texts``.
Each handled command counts ``sessionray_chat_commands_total{command, outcome}``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from runtime import metrics
from runtime.config.spend import QuotaScope
from runtime.llm.types import Model
from runtime.reply.segments import Reply
from runtime.session.spend import amount_text
from runtime.spend.quotas import QuotaStatus

__all__ = [
    "COMMANDS",
    "DEFAULT_TEXTS",
    "MASTER_ONLY",
    "MASTER_ONLY_IN_GROUPS",
    "CommandHandler",
    "CommandHost",
    "ParsedCommand",
    "SessionStatus",
    "command_text",
]

COMMANDS = ("new", "clear", "models", "status", "usage", "steer", "followup", "help")
"""Canonical command names."""

MASTER_ONLY_IN_GROUPS = frozenset({"new", "clear"})
"""Commands that change a shared group/channel session: masters only outside private chats."""

MASTER_ONLY = frozenset({"steer", "followup"})
"""Commands for masters only, in every scene (docs/decisions.md#steer-masters-only)."""

DEFAULT_TEXTS: dict[str, str] = {
    "new": "New conversation started (epoch {epoch}). Earlier messages are archived.",
    "models_header": "Configured models:",
    "models_line": (
        "- {ref}{marks}: api {api}, context {context_window} tokens, input {input}, "
        "structured output {tier}{detail}"
    ),
    "models_none": "No models are configured.",
    "status": "Model: {model}\nMessages: {messages}\nEpoch: {epoch}\nTurn running: {running}",
    "steer_ok": "Steering the running turn.",
    "steer_started": "No turn was running; started one with your message.",
    "followup_ok": "Queued as a follow-up.",
    "followup_started": "No turn was running; started one with your message.",
    "usage": "Usage: /{name} <text>",
    "not_master": "Only a master of this bot may use /{name}.",
    "yes": "yes",
    "no": "no",
    "help_header": "Commands you can use here:",
    "help_line": "/{name} — {text}",
    "help_new": "start a new conversation (earlier messages are archived)",
    "help_clear": "the same as /{new}",
    "help_models": "list the configured models",
    "help_status": "show this conversation's model, size and state",
    "help_steer": "steer the running turn: /{name} <text>",
    "help_followup": "queue a follow-up message: /{name} <text>",
    "help_help": "this list",
    "help_usage": "show what you used and what is left of your quotas",
    "spend_header": "Usage (windows in {zone} time):",
    "spend_line": "- {who}, this {window}: {used}{left}",
    "spend_left": "; left {amount} (resets {reset})",
    "spend_who_user": "you",
    "spend_who_chat": "this chat",
    "spend_who_bot": "this bot",
    "spend_who_global": "everyone",
}
"""Reply templates (``str.format`` fields as used above)."""


@dataclass(frozen=True)
class ParsedCommand:
    """A recognised command: canonical ``command``, the ``name`` typed, and the rest as ``args``."""

    command: str
    name: str
    args: str


@dataclass(frozen=True)
class SessionStatus:
    """What ``/status`` shows: model ref, context message count, epoch and running turns."""

    model: str
    messages: int
    epoch: int
    running_turns: int


class CommandHost(Protocol):
    """What a session offers the command handler (``runtime.session.features`` adapts ``SessionCore``)."""

    def archive(self) -> Awaitable[int]:
        """Archive the active epoch; return the new epoch number."""
        ...

    def status(self) -> Awaitable[SessionStatus]:
        """The session's status (excluding the command's own turn)."""
        ...

    def steer(self, text: str, sender_id: str) -> str:
        """Steer the latest running turn; ``steered`` or ``started``."""
        ...

    def follow_up(self, text: str, sender_id: str) -> str:
        """Queue a follow-up; ``queued`` or ``started``."""
        ...

    def usage(self, scopes: Sequence[QuotaScope]) -> Awaitable[tuple[list[QuotaStatus], str]]:
        """The command sender's quota statuses in ``scopes`` and the quotas' time zone name."""
        ...


class CommandHandler:
    """Parses and runs chat commands (see the module docstring).

    Args:
        names: ``command → typed name`` overrides (``ai.commands.names``).
        texts: Template overrides (``ai.commands.texts``).
        models: The configured models for ``/models`` (in config order).
        builtin_model: The model sessions run on when none is configured (the offline built-in one,
            ``actors.models.builtin``); when ``models`` is empty ``/models`` lists it, marked
            ``(default, built-in offline model, not an LLM)``, so it agrees with ``/status``.
        capabilities: A :class:`runtime.reply.capability.CapabilityCache` (the session setup
            injects the store-backed one; default: the process-wide in-memory one).
        enabled: ``False`` turns every command into an ordinary message.

    Raises:
        ValueError: an unknown command or text key, or two commands sharing a name.
    """

    def __init__(
        self,
        names: dict[str, str] | None = None,
        texts: dict[str, str] | None = None,
        models: Sequence[Model] = (),
        *,
        capabilities: Any = None,
        default_model: str | None = None,
        vision_model: str | None = None,
        builtin_model: Model | None = None,
        enabled: bool = True,
    ) -> None:
        names = dict(names or {})
        texts = dict(texts or {})
        bad = sorted(set(names) - set(COMMANDS))
        if bad:
            raise ValueError(f"ai.commands.names: unknown command(s) {bad}; known: {list(COMMANDS)}")
        bad = sorted(set(texts) - set(DEFAULT_TEXTS))
        if bad:
            raise ValueError(f"ai.commands.texts: unknown key(s) {bad}; known: {sorted(DEFAULT_TEXTS)}")
        self.by_name: dict[str, str] = {}
        for command in COMMANDS:
            typed = names.get(command, command).lstrip("/").lower()
            if typed in self.by_name:
                raise ValueError(
                    f"ai.commands.names: /{typed} is used by both {self.by_name[typed]} and {command}"
                )
            self.by_name[typed] = command
        self.texts = {**DEFAULT_TEXTS, **texts}
        self.models = list(models)
        self.builtin_model = builtin_model
        self.capabilities = capabilities
        self.default_model = default_model
        self.vision_model = vision_model
        self.enabled = enabled

    @classmethod
    def from_config(cls, config: Any, *, builtin_model: Model | None = None) -> CommandHandler:
        """Build from a :class:`runtime.config.Config`: ``ai.commands``; for ``/models`` every model
        listed under ``ai.providers`` plus the default/vision/fallback models not listed there
        (``builtin_model``: see the class)."""
        from runtime.session.capabilities import configured_models

        ai = config.ai
        models = configured_models(config)
        return cls(
            ai.commands.names,
            ai.commands.texts,
            models,
            default_model=ai.default_model,
            vision_model=ai.vision_model,
            builtin_model=builtin_model,
            enabled=ai.commands.enabled,
        )

    def parse(self, text: str) -> ParsedCommand | None:
        """Recognise ``/<name>[@bot] [args]`` at the start of ``text``; ``None`` for other text."""
        if not self.enabled:
            return None
        m = re.match(r"\s*/([A-Za-z0-9_-]+)(?:@[A-Za-z0-9_]+)?(?:\s+(.*))?\s*\Z", text, re.S)
        if m is None:
            return None
        typed = m.group(1).lower()
        command = self.by_name.get(typed)
        if command is None:
            return None
        return ParsedCommand(command, typed, (m.group(2) or "").strip())

    def _text(self, key: str, **fields: Any) -> str:
        return self.texts[key].format(**fields)

    async def handle(
        self, cmd: ParsedCommand, sender: dict[str, Any], host: CommandHost, *, scene_type: str = "private"
    ) -> Reply:
        """Run ``cmd`` for ``sender`` (``{"id", "roles"}``) against ``host``; return the reply.

        ``scene_type`` (``private`` | ``group`` | ``channel``) decides who may run
        :data:`MASTER_ONLY_IN_GROUPS`: anyone in a private chat, masters elsewhere (a refusal
        counts ``outcome="refused"`` and leaves the session untouched).
        """
        outcome = "ok"
        raw_roles = sender.get("roles") or ()
        roles = {raw_roles} if isinstance(raw_roles, str) else {str(r) for r in raw_roles}
        if cmd.command in MASTER_ONLY_IN_GROUPS and scene_type != "private" and "master" not in roles:
            outcome, text = "refused", self._text("not_master", name=cmd.name)
        elif cmd.command == "help":
            text = self._help("master" in roles, scene_type)
        elif cmd.command in ("new", "clear"):
            text = self._text("new", epoch=await host.archive())
        elif cmd.command == "models":
            text = await self._models()
        elif cmd.command == "usage":
            text = await self._usage(host, "master" in roles)
        elif cmd.command == "status":
            st = await host.status()
            running = self._text("yes" if st.running_turns else "no")
            text = self._text("status", model=st.model, messages=st.messages, epoch=st.epoch, running=running)
        else:  # steer / followup: masters only (docs/decisions.md#steer-masters-only)
            if "master" not in roles:
                outcome, text = "refused", self._text("not_master", name=cmd.name)
            elif not cmd.args:
                outcome, text = "refused", self._text("usage", name=cmd.name)
            elif cmd.command == "steer":
                result = host.steer(cmd.args, str(sender.get("id", "")))
                text = self._text("steer_ok" if result == "steered" else "steer_started")
            else:
                result = host.follow_up(cmd.args, str(sender.get("id", "")))
                text = self._text("followup_ok" if result == "queued" else "followup_started")
        metrics.CHAT_COMMANDS.inc(command=cmd.command, outcome=outcome)
        return Reply.of_text(text)

    def may_use(self, command: str, *, master: bool, scene_type: str) -> bool:
        """Whether a sender (``master`` or not) may run ``command`` in a ``scene_type`` scene."""
        if master or command in MASTER_ONLY:
            return master
        return scene_type == "private" or command not in MASTER_ONLY_IN_GROUPS

    def _help(self, master: bool, scene_type: str) -> str:
        """``/help``: one ``help_line`` per command the sender may use, in :data:`COMMANDS` order,
        by the names users type."""
        typed = {command: name for name, command in self.by_name.items()}
        lines = [self._text("help_header")]
        for command in COMMANDS:
            if self.may_use(command, master=master, scene_type=scene_type):
                about = self._text(f"help_{command}", name=typed[command], new=typed["new"])
                lines.append(self._text("help_line", name=typed[command], text=about))
        return "\n".join(lines)

    async def _usage(self, host: CommandHost, master: bool) -> str:
        """``/usage``: one line per window and scope (the sender's; a master's also the chat's, the
        bot's and, under a global quota, everyone's): what was used and, under a quota, what is
        left and when it resets."""
        statuses, zone = await host.usage(("user", "chat", "bot", "global") if master else ("user",))
        lines = [self._text("spend_header", zone=zone)]
        for st in statuses:
            lim, use = st.limit, st.use
            left = ""
            if lim.tokens is not None or lim.usd is not None:
                reset = datetime.fromtimestamp(use.reset_ms / 1000, ZoneInfo(zone))
                amount = amount_text(st.tokens_left, st.usd_left)
                left = self._text("spend_left", amount=amount, reset=f"{reset:%Y-%m-%d %H:%M}")
            who = self._text(f"spend_who_{lim.scope}")
            used = amount_text(use.tokens, use.usd)
            lines.append(self._text("spend_line", who=who, window=lim.window, used=used, left=left))
        return "\n".join(lines)

    async def _models(self) -> str:
        builtin = [self.builtin_model] if self.builtin_model is not None and not self.models else []
        models = self.models or builtin
        if not models:
            return self._text("models_none")
        from runtime.reply.capability import age_text
        from runtime.session.capabilities import describe

        cache = self.capabilities
        if cache is None:
            from runtime.reply.capability import CAPABILITIES

            cache = CAPABILITIES
        lines = [self._text("models_header")]
        for m, rec in await cache.snapshot(models):
            row = describe(m, rec)
            detail = ""
            if row["source"] is not None:
                age = f", {age_text(row['age_s'])} old" if row["age_s"] is not None else ""
                detail = f" ({row['source']}{age})"
            marks = "".join(
                f" ({label})"
                for label, ref in (("default", self.default_model), ("vision", self.vision_model))
                if ref == m.ref()
            ) + (" (default, built-in offline model, not an LLM)" if m in builtin else "")
            lines.append(
                self._text(
                    "models_line",
                    ref=m.ref(),
                    marks=marks,
                    api=m.api,
                    context_window=m.context_window,
                    input="+".join(m.input),
                    tier=row["tier"] or "unknown",
                    detail=detail,
                )
            )
        return "\n".join(lines)


def command_text(text: str, segments: Sequence[dict[str, Any]], bot_id: str) -> str:
    """The text a command is looked for in: ``text`` without the mentions of the bot it starts
    with (a group's ``@bot /new``; docs/decisions.md#chat-commands).

    Only real mentions count: the message's first segments (after a ``reply`` quote and blank
    text) must be ``mention`` segments targeting ``bot_id``; that many leading ``@<bot_id>``
    tokens are then cut from ``text`` (the codecs render a mention as ``@<id>``). Typed text
    ``@10001 /new`` without a mention segment, a mention of someone else, or text before the
    mention leave ``text`` as it is.

    >>> segs = [{"type": "mention", "data": {"target": "10001"}}, {"type": "text", "data": {"text": " /new"}}]
    >>> command_text("@10001 /new", segs, "10001")
    ' /new'
    """
    leading = 0
    for seg in segments:
        kind, data = seg.get("type"), seg.get("data") or {}
        if kind == "reply" or (kind == "text" and not str(data.get("text", "")).strip()):
            continue
        if kind == "mention" and str(data.get("target")) == bot_id:
            leading += 1
            continue
        break
    token = re.compile(rf"\s*@{re.escape(bot_id)}(?![\w.-])")
    for _ in range(leading):
        m = token.match(text)
        if m is None:
            break
        text = text[m.end() :]
    return text

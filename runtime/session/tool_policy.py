"""Tool permissions for IM turns: who may use a tool where, enforced in ``before_tool_call``
(docs/decisions.md#tool-permissions).

A tool may declare *who may use it where* with a
:class:`~runtime.config.tool_permissions.ToolPermissions` attached to it by
:func:`set_permissions` (an extra attribute on the tool object, so :class:`~runtime.agent.tools.AgentTool`'s
fields are unchanged and any tool — built-in, ``*.tool.md``, MCP — can carry one):

* ``platforms``: platform ids (``onebot11``, ``telegram``, ``console``) where the tool exists;
* ``scopes``: ``private`` / ``group`` / ``channel`` scenes where it exists;
* ``required_any_role``: the sender needs at least one of these roles (``master``,
  ``scene_admin``, ...). ``None``/empty means "no restriction" for each of the three.

Per turn, :func:`filter_tools` keeps only the tools the inbound's platform, scope and sender roles
allow, so the model never sees a tool it may not use. :class:`ToolGuard` is a
``before_tool_call`` hook: a call that still names a filtered tool (a forged call, or a tool from
an older turn's context) or that a :data:`PolicyCheck` denies (e.g. a file tool outside its allowed
paths) is blocked with a reason the model can read, and counted in
``sessionray_tool_calls_total{outcome="blocked"}`` (by the tool executor) and
``sessionray_tool_policy_blocks_total{reason}``.

:func:`apply_tool_policy` wires both into an ``AgentLoopConfig``: the loop keeps *every* tool
executable (so a forged call reaches ``before_tool_call`` and gets a readable reason, rather than
"not found"), while a ``stream_fn`` wrapper removes the hidden tools from each request's
``Context.tools`` — the model is never shown them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias

from runtime import metrics
from runtime.agent.config import (
    AgentLoopConfig,
    BeforeToolCallContext,
    BeforeToolCallResult,
    MaybeAwaitable,
    StreamFnT,
    resolve,
)
from runtime.agent.tools import AgentTool
from runtime.config.tool_permissions import ToolPermissions
from runtime.llm.abort import AbortSignal
from runtime.llm.events import AssistantMessageEventStream
from runtime.llm.options import StreamOptions
from runtime.llm.types import Context, Model

__all__ = [
    "PolicyCheck",
    "ToolGuard",
    "TurnScope",
    "apply_tool_policy",
    "filter_tools",
    "get_permissions",
    "hide_tools",
    "set_permissions",
]

log = logging.getLogger("runtime.session.tool_policy")


@dataclass(frozen=True)
class TurnScope:
    """Who asks where: the inbound's platform, scene type and the sender's roles.

    Attributes:
        platform: Platform id of the inbound message.
        scope: ``private`` | ``group`` | ``channel``.
        roles: The sender's roles (the platform's, plus ``master`` for configured masters).
        sender_id: The sender's platform id (for logs and policy checks).
    """

    platform: str
    scope: str
    roles: frozenset[str] = frozenset()
    sender_id: str = ""

    @classmethod
    def of(cls, platform: str, scope: str, sender: dict[str, Any] | None) -> TurnScope:
        """Build from a turn's platform, scope and ``sender`` dict (``{"id", "name", "roles"}``)."""
        sender = sender or {}
        return cls(
            platform, scope, frozenset(str(r) for r in sender.get("roles") or ()), str(sender.get("id", ""))
        )


_ATTR = "_im_permissions"


def set_permissions(tool: AgentTool[Any], permissions: ToolPermissions | None) -> AgentTool[Any]:
    """Attach ``permissions`` to ``tool`` (``None`` removes them) and return the tool.

    Stored as an extra instance attribute (``AgentTool``'s fields are unchanged; the value
    survives ``copy`` and pickling of the tool)."""
    if permissions is None:
        if hasattr(tool, _ATTR):
            delattr(tool, _ATTR)
    else:
        setattr(tool, _ATTR, permissions)
    return tool


def get_permissions(tool: AgentTool[Any]) -> ToolPermissions | None:
    """The permissions attached to ``tool`` (``None``: unrestricted)."""
    perms: ToolPermissions | None = getattr(tool, _ATTR, None)
    return perms


def filter_tools(tools: Iterable[AgentTool[Any]], scope: TurnScope) -> list[AgentTool[Any]]:
    """The tools ``scope`` may see, in their original order (the model never sees a tool it
    may not use: docs/decisions.md#tool-permissions)."""
    out = []
    for tool in tools:
        perms = get_permissions(tool)
        if perms is None or perms.denies(scope.platform, scope.scope, scope.roles) is None:
            out.append(tool)
    return out


PolicyCheck: TypeAlias = Callable[[BeforeToolCallContext, TurnScope], MaybeAwaitable[str | None]]
"""``(ctx, scope) -> reason | None``: a policy for calls of visible tools (e.g. a file tool's
allowed paths); a returned text blocks the call and is what the model reads."""


@dataclass
class ToolGuard:
    """A ``before_tool_call`` hook enforcing the turn's tool set and policies
    (docs/decisions.md#tool-permissions).

    Attributes:
        all_tools: Every tool the session has (before filtering).
        scope: The turn's :class:`TurnScope`.
        policies: ``tool name → checks``; the key ``"*"`` applies to every tool.
        then: An inner ``before_tool_call`` hook called for calls this guard allows.

    A call is blocked when its tool is not visible to ``scope`` (reason
    ``tool "x" is not available to you here (needs role ...)``), or a policy returns a reason.
    The loop itself answers calls of tools it does not have at all, so a forged call of a filtered
    tool normally ends as "not found"; the guard makes the reason explicit when the loop is given
    the unfiltered set, and applies policies in every case.
    """

    all_tools: Sequence[AgentTool[Any]]
    scope: TurnScope
    policies: dict[str, list[PolicyCheck]] = field(default_factory=dict)
    then: Callable[[BeforeToolCallContext, AbortSignal | None], Any] | None = None

    async def __call__(
        self, ctx: BeforeToolCallContext, signal: AbortSignal | None = None
    ) -> BeforeToolCallResult | None:
        """Return ``BeforeToolCallResult(block=True, reason=...)`` or the inner hook's result."""
        name = ctx.tool_call.name
        reason = self._visibility(name)
        kind = "filtered"
        if reason is None:
            for check in [*self.policies.get("*", []), *self.policies.get(name, [])]:
                reason = await resolve(check(ctx, self.scope))
                if reason:
                    kind = "policy"
                    break
        if reason:
            metrics.TOOL_POLICY_BLOCKS.inc(reason=kind)
            log.info("tool call %s blocked for sender %s (%s): %s", name, self.scope.sender_id, kind, reason)
            return BeforeToolCallResult(block=True, reason=reason)
        if self.then is not None:
            result: BeforeToolCallResult | None = await resolve(self.then(ctx, signal))
            return result
        return None

    def _visibility(self, name: str) -> str | None:
        tool = next((t for t in self.all_tools if t.name == name), None)
        if tool is None:
            return None  # unknown tools are answered by the loop ("not found")
        perms = get_permissions(tool)
        scope = self.scope
        why = perms.denies(scope.platform, scope.scope, scope.roles) if perms is not None else None
        if perms is None or why is None:
            return None
        if why == "role":
            need = ", ".join(sorted(perms.required_any_role or ()))
            return f'tool "{name}" is not available to you here: it needs one of the roles [{need}]'
        if why == "scope":
            where = ", ".join(sorted(perms.scopes or ()))
            return f'tool "{name}" is not available in a {self.scope.scope} chat (only: {where})'
        where = ", ".join(sorted(perms.platforms or ()))
        return f'tool "{name}" is not available on {self.scope.platform} (only: {where})'


def hide_tools(stream_fn: StreamFnT, hidden: Iterable[str]) -> StreamFnT:
    """Wrap a ``stream_fn`` so requests never list the tools named in ``hidden``."""
    names = frozenset(hidden)
    if not names:
        return stream_fn

    def wrapped(model: Model, context: Context, options: StreamOptions | None) -> AssistantMessageEventStream:
        if context.tools:
            kept = [t for t in context.tools if t.name not in names]
            context = context.model_copy(update={"tools": kept or None})
        return stream_fn(model, context, options)

    return wrapped


def apply_tool_policy(
    loop_config: AgentLoopConfig,
    all_tools: Sequence[AgentTool[Any]],
    scope: TurnScope,
    policies: dict[str, list[PolicyCheck]] | None = None,
) -> AgentLoopConfig:
    """Return a copy of ``loop_config`` enforcing the tool permissions of ``scope``.

    Run the loop with ``all_tools`` as its executable tools: the tools ``scope`` may not see are
    removed from every request (:func:`hide_tools`) and a :class:`ToolGuard` (chained before the
    config's own ``before_tool_call``) blocks calls to them and policy-denied calls.
    """
    visible = {t.name for t in filter_tools(all_tools, scope)}
    hidden = [t.name for t in all_tools if t.name not in visible]
    guard = ToolGuard(all_tools, scope, dict(policies or {}), then=loop_config.before_tool_call)
    return replace(loop_config, stream_fn=hide_tools(loop_config.stream_fn, hidden), before_tool_call=guard)

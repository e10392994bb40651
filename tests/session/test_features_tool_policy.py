"""Tool permissions: filtering by platform/scope/role, forged calls blocked in before_tool_call
(docs/decisions.md#tool-permissions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from providers.faux import faux_assistant_message, faux_text, faux_tool_call, register_faux_provider
from runtime.agent.config import AgentContext, AgentLoopConfig, BeforeToolCallContext
from runtime.agent.events import AgentEndEvent
from runtime.agent.loop import agent_loop
from runtime.agent.tools import AgentTool, AgentToolResult
from runtime.config.tool_permissions import ToolPermissions
from runtime.llm.types import TextContent, ToolResultMessage, UserMessage
from runtime.session.tool_policy import TurnScope, apply_tool_policy, filter_tools, set_permissions


class PathArgs(BaseModel):
    path: str = ""


def make_tool(name: str, perms: ToolPermissions | None, ran: list[str]) -> AgentTool[Any]:
    async def execute(call_id: str, params: Any, signal: Any, on_update: Any) -> AgentToolResult:
        ran.append(name)
        return AgentToolResult.text(f"{name} ok")

    return set_permissions(AgentTool(name, f"The {name} tool.", PathArgs, execute), perms)


def tools(ran: list[str]) -> list[AgentTool[Any]]:
    return [
        make_tool("search", None, ran),
        make_tool("shutdown", ToolPermissions(required_any_role=frozenset({"master"})), ran),
        make_tool(
            "kick",
            ToolPermissions(
                scopes=frozenset({"group"}), required_any_role=frozenset({"master", "scene_admin"})
            ),
            ran,
        ),
        make_tool("tg_only", ToolPermissions(platforms=frozenset({"telegram"})), ran),
        make_tool("read_file", None, ran),
    ]


def test_filter_by_platform_scope_and_role() -> None:
    all_tools = tools([])
    names = lambda scope: [t.name for t in filter_tools(all_tools, scope)]  # noqa: E731
    member = TurnScope("onebot11", "group", frozenset({"member"}), "42")
    admin = TurnScope("onebot11", "group", frozenset({"scene_admin"}), "7")
    master_private = TurnScope("telegram", "private", frozenset({"master"}), "1")
    assert names(member) == ["search", "read_file"]
    assert names(admin) == ["search", "kick", "read_file"]
    assert names(master_private) == ["search", "shutdown", "tg_only", "read_file"]
    assert TurnScope.of("onebot11", "group", {"id": 5, "roles": ["owner"]}) == TurnScope(
        "onebot11", "group", frozenset({"owner"}), "5"
    )


async def test_member_does_not_see_master_tool_and_forged_call_is_blocked(
    metric: Callable[..., float],
) -> None:
    ran: list[str] = []
    all_tools = tools(ran)
    outside_allowed = lambda ctx, scope: (  # noqa: E731
        None
        if ctx.args.path.startswith("/srv/shared/")
        else f"read_file may only read /srv/shared/, not {ctx.args.path}"
    )
    faux = register_faux_provider(
        [
            faux_assistant_message(
                [
                    faux_tool_call("shutdown", {}, id="c1"),
                    faux_tool_call("read_file", {"path": "/etc/passwd"}, id="c2"),
                    faux_tool_call("read_file", {"path": "/srv/shared/a.txt"}, id="c3"),
                    faux_tool_call("search", {}, id="c4"),
                ]
            ),
            faux_assistant_message([faux_text("done")]),
        ],
        provider="policy-faux",
    )
    scope = TurnScope("onebot11", "group", frozenset({"member"}), "42")
    config = apply_tool_policy(
        AgentLoopConfig(model=faux.get_model()), all_tools, scope, {"read_file": [outside_allowed]}
    )
    events = [e async for e in agent_loop([UserMessage(content="hi")], AgentContext(tools=all_tools), config)]
    end = events[-1]
    assert isinstance(end, AgentEndEvent)
    # the model was never shown the tools the member may not use (both calls)
    assert [[t.name for t in call.context.tools or []] for call in faux.calls] == [
        ["search", "read_file"],
        ["search", "read_file"],
    ]
    results = [
        (m.tool_call_id, m.is_error, "".join(b.text for b in m.content if isinstance(b, TextContent)))
        for m in end.messages
        if isinstance(m, ToolResultMessage)
    ]
    assert results == [
        ("c1", True, 'tool "shutdown" is not available to you here: it needs one of the roles [master]'),
        ("c2", True, "read_file may only read /srv/shared/, not /etc/passwd"),
        ("c3", False, "read_file ok"),
        ("c4", False, "search ok"),
    ]
    assert sorted(ran) == ["read_file", "search"]
    assert [
        metric("sessionray_tool_policy_blocks_total", reason="filtered"),
        metric("sessionray_tool_policy_blocks_total", reason="policy"),
        metric("sessionray_tool_calls_total", outcome="blocked"),
        metric("sessionray_tool_calls_total", outcome="ok"),
    ] == [1.0, 1.0, 2.0, 2.0]


async def test_guard_explains_scope_and_platform_and_chains_inner_hook() -> None:
    all_tools = tools([])
    seen: list[str] = []

    def inner(ctx: BeforeToolCallContext, signal: Any) -> None:
        seen.append(ctx.tool_call.name)

    config = apply_tool_policy(
        AgentLoopConfig(
            model=register_faux_provider(provider="policy-faux2").get_model(), before_tool_call=inner
        ),
        all_tools,
        TurnScope("onebot11", "private", frozenset({"master"}), "1"),
    )
    guard = config.before_tool_call
    assert guard is not None

    async def verdict(name: str) -> Any:
        from runtime.llm.types import AssistantMessage, ToolCall

        call = ToolCall(id="x", name=name, arguments={})
        r = await guard(BeforeToolCallContext(AssistantMessage(), call, PathArgs(), AgentContext()), None)
        return (r.block, r.reason) if r is not None else None

    assert await verdict("kick") == (True, 'tool "kick" is not available in a private chat (only: group)')
    assert await verdict("tg_only") == (True, 'tool "tg_only" is not available on onebot11 (only: telegram)')
    assert await verdict("shutdown") is None
    assert seen == ["shutdown"]

"""How tests script the model *inside* session hosts.

A faux handle registered in the test process is invisible in an actor's process, so tests pass a
picklable :class:`ScriptedSetup` to ``SessionRuntime.start(config, setup_factory=...)``. Each
session host calls it at each activation; it registers a faux provider in that process whose replies
are a pure function of the context the model is sent (so a crash retry, a re-activation or any
interleaving gets the same answer for the same context):

* last user text ``echo X``   → reply ``X``;
* last user text ``slow N``   → call the ``sleep`` tool (N seconds), then, after its result,
  reply ``tool: <result>; then: <user texts that arrived after the tool call, e.g. steering>``;
* last user text ``defer square N`` → call ``run_deferred_task`` (task ``square``, ``{"x": N}``);
* last user text ``delegate T`` → call the ``delegate`` sub-agent tool with task ``T``;
* last user text ``block G`` / ``ablock G`` (in a group: after the sender prefix) → call the
  gated tool ``block`` (a *plain, blocking* function: ``time.sleep`` in a loop) / ``ablock`` (a
  coroutine: ``asyncio.sleep`` in a loop) for gate ``G``; either returns ``released G`` once the
  test opened the gate;
* anything else ``T``         → reply ``re: T``.

Replies are segments JSON (docs/decisions.md#reply-segments) only when the IM reply contract asked
for it (its instructions are in the system prompt); a sub-agent (no IM preset) gets plain text.

The ``sleep`` tool writes ``<marker_dir>/<call id>.started`` when it starts, so tests can wait
for "the tool runs now" and count executions. The gated tools write ``<marker_dir>/gate-G.waiting``
when they start, wait until ``gate-G.open`` exists (at most ``GATE_LIMIT_S``), then write
``gate-G.done``: tests order events by them instead of by wall-clock time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from runtime.llm.types import AssistantMessage, Context, TextContent, ToolCall, ToolResultMessage, UserMessage
from runtime.session.turn import SessionSetup

SENDER_PREFIX = re.compile(r"^\[sender:[^\]]*\] ")
"""The sender prefix a group's user messages get when converted for the model."""
GATE_LIMIT_S = 120.0
"""A gated tool gives up waiting after this many seconds (a test that failed never opens it)."""


class SleepArgs(BaseModel):
    seconds: float


class GateArgs(BaseModel):
    gate: str


def reply_json(text: str) -> str:
    """The segments JSON of a one-text-segment reply."""
    return json.dumps({"segments": [{"type": "text", "data": {"text": text}}]}, ensure_ascii=False)


def _text(m: Any) -> str:
    if isinstance(m.content, str):
        return m.content
    return "".join(b.text for b in m.content if isinstance(b, TextContent))


def square(args: dict[str, Any]) -> str:
    """The ``square`` deferred task (runs as a Ray task, outside the session host)."""
    import os

    return f"square of {args['x']:g} is {args['x'] ** 2:g} (pid {os.getpid()})"


def _last_index(msgs: list[Any], kind: type) -> int:
    """The index of the last message of ``kind`` in ``msgs``, or -1."""
    for i in range(len(msgs) - 1, -1, -1):
        if isinstance(msgs[i], kind):
            return i
    return -1


def scripted_reply(context: Context) -> AssistantMessage:
    """The scripted model: see the module docstring."""
    from runtime.reply.im_reply import IM_INSTRUCTIONS

    def answer(text: str) -> AssistantMessage:
        body = reply_json(text) if IM_INSTRUCTIONS in context.system_prompt else text
        return AssistantMessage(content=[TextContent(text=body)])

    def call(name: str, arguments: dict[str, Any]) -> AssistantMessage:
        tc = ToolCall(id=f"call-{uuid.uuid4().hex[:10]}", name=name, arguments=arguments)
        return AssistantMessage(content=[tc], stop_reason="toolUse")

    msgs = context.messages
    # read from the end (the scripted model's cost must not grow with the context: the bench
    # counts the host's CPU, which is the runtime's, not the model's)
    last_asst = _last_index(msgs, AssistantMessage)
    last_user = _last_index(msgs, UserMessage)
    asst = msgs[last_asst] if last_asst >= 0 else None
    later_users = [m for m in msgs[last_asst + 1 :] if isinstance(m, UserMessage)]
    steering_only = all("master" in ((m.sender or {}).get("roles") or []) for m in later_users)
    if isinstance(asst, AssistantMessage) and asst.tool_calls() and steering_only:
        # The loop calls the model again after the batch's results (plus any steering): answer them.
        results = [m for m in msgs[last_asst + 1 :] if isinstance(m, ToolResultMessage)]
        after = [_text(m) for m in msgs[last_asst + 1 :] if isinstance(m, UserMessage)]
        result = "; ".join(_text(r) for r in results)
        return answer(f"tool: {result}; then: {after}")
    text = _text(msgs[last_user]) if last_user >= 0 else ""
    if text.startswith("slow "):
        return call("sleep", {"seconds": float(text[5:])})
    if text.startswith("defer square "):
        return call("run_deferred_task", {"task": "square", "args": {"x": float(text[13:])}})
    if text.startswith("delegate "):
        return call("delegate", {"task": text[9:]})
    bare = SENDER_PREFIX.sub("", text, count=1)  # a group's sender prefix
    if bare.startswith(("block ", "ablock ")):
        name, gate = bare.split(" ", 1)
        return call(name, {"gate": gate})
    if text.startswith("echo "):
        return answer(text[5:])
    return answer(f"re: {text}")


class ScriptedSetup:
    """A picklable ``SetupFactory`` for tests (see the module docstring).

    Args:
        marker_dir: Directory where the ``sleep`` tool records each start.
        steering_mode / follow_up_mode: Queue modes of the session.
        think_s: Seconds the model "thinks" before each reply.
        coalesce: The sessions' hot-chat coalescing (``runtime.config.ai.CoalesceConfig``;
            ``None``: off, docs/decisions.md#session-hot-chat-coalescing).
    """

    def __init__(
        self,
        marker_dir: str,
        *,
        steering_mode: Literal["one-at-a-time", "all"] = "one-at-a-time",
        follow_up_mode: Literal["one-at-a-time", "all"] = "one-at-a-time",
        think_s: float = 0.0,
        coalesce: Any = None,
    ) -> None:
        self.marker_dir = marker_dir
        self.coalesce = coalesce
        self.steering_mode = steering_mode
        self.follow_up_mode = follow_up_mode
        self.think_s = think_s
        self._handle: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handle": None}  # the faux registration is process-local

    async def respond(self, context: Context, options: Any) -> AssistantMessage:
        if self.think_s:
            await asyncio.sleep(self.think_s)
        return scripted_reply(context)

    def prepare(self, *, database: Any = None) -> None:
        """Session-independent part, run once per process in the host's warm-up:
        register the faux provider and import what a turn needs; again only when another
        registration replaced ours (in-process tests). ``database`` (the host's) is not needed.
        Each build writes ``<marker_dir>/prepare-<pid>-<n>`` so tests can count the builds of a
        process."""
        import os

        from providers.faux import get_faux_provider, register_faux_provider

        with contextlib.suppress(KeyError):
            if self._handle is not None and get_faux_provider("script") is self._handle:
                return
        from runtime.reply.im_reply import IM_INSTRUCTIONS  # noqa: F401  (scripted_reply's import)
        from runtime.session.turn_tools import make_subagent_tool  # noqa: F401  (warm the import)

        handle = register_faux_provider(
            provider="script",
            models=["script-model"],
            chunk_size=256,
            default_response=self.respond,
            max_recorded_calls=0,  # long-lived actors: no context copies (the bench runs this too)
        )
        self._handle = handle
        marker_dir = Path(self.marker_dir)
        marker_dir.mkdir(parents=True, exist_ok=True)
        n = len(list(marker_dir.glob(f"prepare-{os.getpid()}-*")))
        (marker_dir / f"prepare-{os.getpid()}-{n + 1}").write_text("")

    def __call__(self, session_key: str) -> SessionSetup:
        from runtime.agent.tools import AgentTool, AgentToolResult
        from runtime.session.turn_tools import make_subagent_tool

        self.prepare()  # a no-op in a warmed actor
        marker_dir = Path(self.marker_dir)

        async def sleep(call_id: str, params: SleepArgs, signal: Any, on_update: Any) -> AgentToolResult:
            marker_dir.mkdir(parents=True, exist_ok=True)
            (marker_dir / f"{call_id}.started").write_text(session_key)
            await asyncio.sleep(params.seconds)
            return AgentToolResult.text(f"slept {params.seconds:g}")

        def block(call_id: str, params: GateArgs, signal: Any, on_update: Any) -> AgentToolResult:
            # a plain function: the tool executor runs it in a worker thread, off the host's loop
            gate = marker_dir / f"gate-{params.gate}"
            gate.with_suffix(".waiting").write_text(session_key)
            deadline = time.monotonic() + GATE_LIMIT_S
            while not gate.with_suffix(".open").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            gate.with_suffix(".done").write_text(session_key)
            return AgentToolResult.text(f"released {params.gate}")

        async def ablock(call_id: str, params: GateArgs, signal: Any, on_update: Any) -> AgentToolResult:
            gate = marker_dir / f"gate-{params.gate}"
            gate.with_suffix(".waiting").write_text(session_key)
            deadline = time.monotonic() + GATE_LIMIT_S
            while not gate.with_suffix(".open").exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            gate.with_suffix(".done").write_text(session_key)
            return AgentToolResult.text(f"released {params.gate}")

        model = self._handle.get_model()
        sleep_tool = AgentTool("sleep", "Sleep for some seconds.", SleepArgs, sleep)
        gated = [
            AgentTool("block", "Wait for a gate (blocking).", GateArgs, block),
            AgentTool("ablock", "Wait for a gate.", GateArgs, ablock),
        ]
        return SessionSetup(
            model=model,
            tools=[sleep_tool, *gated, make_subagent_tool(model, [sleep_tool])],
            deferred_tasks={"square": square},
            system_prompt="You are a test bot.",
            steering_mode=self.steering_mode,
            follow_up_mode=self.follow_up_mode,
            coalesce=self.coalesce,
        )


class ProbedSetup(ScriptedSetup):
    """:class:`ScriptedSetup` whose sessions resolve the model's structured-output tier through the
    SQL capability store on ``db_url`` (docs/decisions.md#structured-capability-cache), with a
    stand-in probe that writes ``<marker_dir>/probe-<pid>-<n>`` per call and, to give another
    host's probe the chance to overlap, waits until a second probe started or ``overlap_s``
    passed; it answers ``native``."""

    def __init__(self, marker_dir: str, db_url: str, overlap_s: float = 5.0) -> None:
        super().__init__(marker_dir)
        self.db_url = db_url
        self.overlap_s = overlap_s
        self._cache: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_cache": None}

    async def probe(self, model: Any) -> Any:
        import os

        from runtime.reply.capability import ProbeResult

        markers = Path(self.marker_dir)
        (markers / f"probe-{os.getpid()}-{uuid.uuid4().hex[:8]}").write_text("")
        deadline = time.monotonic() + self.overlap_s
        while len(list(markers.glob("probe-*"))) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return ProbeResult("native", "native: valid", 'native: {"ok": true}')

    def __call__(self, session_key: str) -> SessionSetup:
        from runtime.memory.db import Database
        from runtime.reply.capability import CapabilityCache
        from runtime.session.capability_store import SqlCapabilityStore

        setup = super().__call__(session_key)
        if self._cache is None:
            self._cache = CapabilityCache(SqlCapabilityStore(Database(self.db_url, threads=1)), ttl_s=600)
        setup.capabilities = self._cache
        setup.probe = self.probe
        return setup

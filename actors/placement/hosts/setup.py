"""The default ``SetupFactory``: what a session's turns run with, built from the configuration.

A factory runs *inside* each session actor (models, provider registrations and faux scripts are
process-local; a faux handle registered in the driver is invisible in an actor). It must be
picklable: :class:`ConfigSetupFactory` holds only the ``Config``.

Tests script the model the same way: they pass their own picklable factory to
``SessionRuntime.start(config, setup_factory=...)`` — a top-level class whose ``__call__``
registers a faux provider in the actor process with replies computed from the context (see
``tests/actors/session_scripts.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a setup is built (a host), not where the factory is passed on
    from runtime.session.turn import SessionSetup  # (docs/decisions.md#ops-lazy-exports)

__all__ = ["IM_SYSTEM_PROMPT", "ConfigSetupFactory", "business_tools", "output_schema", "output_sink"]

IM_SYSTEM_PROMPT = (
    "You are a helpful assistant in an instant-messaging chat. Keep answers short and friendly. "
    "In group chats each user message starts with a [sender:...] block naming who wrote it."
)
"""The IM preset's base system prompt (the reply contract adds its own instructions)."""


def agent_code(config: Any) -> tuple[list[Any], dict[str, Any]]:
    """``(pre_tools, deferred_tasks)`` imported from ``ai.agent.pre_tools`` /
    ``ai.agent.deferred_tasks``. ``SessionRuntime.start`` calls it once so a bad reference stops
    start-up (as a bad tool does); each session host calls it again.

    Raises:
        runtime.config.entry_points.PythonToolError: a reference cannot be imported or is not callable.
    """
    from runtime.session.python_tools import load_deferred_tasks, load_pre_tools

    agent = config.ai.agent
    return load_pre_tools(agent.pre_tools), load_deferred_tasks(agent.deferred_tasks)


def output_schema(config: Any) -> Any:
    """``ai.agent.output_schema`` as a session uses it: ``"segments"``, ``False`` or a custom
    :class:`runtime.reply.custom_output.OutputSpec` (imported / read / checked here).
    ``SessionRuntime.start`` calls it once so a bad schema stops start-up; each session host calls
    it again (docs/decisions.md#structured-custom-schema).

    Raises:
        runtime.reply.custom_output.OutputSchemaError: the schema cannot be loaded or breaks the
            closed/required rules.
    """
    value = config.ai.agent.output_schema
    if value in ("segments", False):
        return value
    from runtime.config import ENTRY_POINT_RE
    from runtime.reply.custom_output import OutputSchemaError, spec_from_json_schema, spec_from_model

    if isinstance(value, dict):
        return spec_from_json_schema(value, source="ai.agent.output_schema")
    if ENTRY_POINT_RE.fullmatch(value):  # a pydantic model (or a JSON Schema dict) by import path
        from runtime.config.entry_points import import_entry_point

        try:
            target = import_entry_point(value)
        except (ImportError, AttributeError, ValueError) as exc:
            raise OutputSchemaError(f"{value}: cannot be imported: {exc}") from None
        if isinstance(target, dict):
            return spec_from_json_schema(target, source=value)
        return spec_from_model(target, source=value)
    try:  # a path to a JSON file (made absolute when the configuration loaded)
        schema = json.loads(Path(value).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise OutputSchemaError(f"{value}: cannot read a JSON Schema: {exc}") from None
    return spec_from_json_schema(schema, source=value)


def output_sink(config: Any) -> Any:
    """The :class:`runtime.session.output_sink.OutputSink` of ``ai.agent.output_sink`` (``None``
    when unset: the transcript only)."""
    sink = config.ai.agent.output_sink
    if sink is None:
        return None
    from runtime.session.output_sink import OutputSink

    return OutputSink(
        url=sink.url, transcript=sink.transcript, timeout_s=sink.timeout_s, attempts=sink.attempts
    )


def business_tools(config: Any) -> list[Any]:
    """The configured business tools: ``ai.python_tools`` then the ``*.tool.md`` of
    ``ai.tools_dir``. ``SessionRuntime.start`` calls it once so a bad tool stops start-up
    (``docs/decisions.md#tool-md-hard-fail``); each session host calls it again.

    Raises:
        runtime.config.entry_points.PythonToolError: a bad ``ai.python_tools`` entry, or a
            ``*.tool.md`` declaring the name of a Python tool.
        runtime.session.tool_md.ToolMdError: a bad ``ai.tools_dir``.
    """
    from runtime.config.entry_points import PythonToolError
    from runtime.session.python_tools import load_python_tools

    tools = load_python_tools(config.ai.python_tools)
    if config.ai.tools_dir:  # *.tool.md tools
        from runtime.session.tool_md import load_tool_dir

        python_names = {t.name for t in tools}
        for tool in load_tool_dir(config.ai.tools_dir):
            if tool.name in python_names:
                raise PythonToolError(
                    f"{config.ai.tools_dir}: tool name {tool.name!r} is also declared by ai.python_tools"
                )
            tools.append(tool)
    return tools


class ConfigSetupFactory:
    """``(session_key) -> SessionSetup`` from ``config``: the model ``ai.default_model`` (the built-in
    offline model when unset), the ``chat_history`` tool bound to the session's scene, the
    business tools (:func:`business_tools`), the ``generate_image`` tool when ``ai.image_model`` is
    set and the session's bot has a ``media_dir`` (``actors.models.image_tool``), the ``delegate``
    sub-agent tool when ``ai.agent.delegate`` is on, the IM preset prompt, ``ai.agent`` output
    schema and queue modes, the structured-output capability cache on the SQL store with the probe
    at first use (``runtime.session.capabilities``), and — for console sessions only — the live-events hook
    (``runtime.session.console_events``).

    Args:
        config: ``runtime.config.Config``.
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self._db: Any = None
        self._shared: tuple[Any, list[Any]] | None = None
        self._capabilities: Any = None
        self._code: tuple[list[Any], dict[str, Any]] = ([], {})
        self._output: Any = "segments"

    def prepare(self, *, database: Any = None) -> None:
        """Build, once per process, everything that does not depend on the session key: provider
        registration, the model, the business tools (:func:`business_tools`) and built-in tools,
        the chat-history database, and the imports of an activation. The session host calls it
        while a new session host warms up (docs/decisions.md#session-hosts); :meth:`__call__`
        calls it too (a no-op then).

        Args:
            database: A :class:`runtime.memory.db.Database` of ``database.url`` to share for the
                ``chat_history`` tool (the session host passes its own: one SQL thread and
                connection per actor); ``None`` opens one.

        Raises:
            runtime.config.ConfigError: ``ai.default_model`` names an unknown provider.
            runtime.session.tool_md.ToolMdError: a bad ``ai.tools_dir``.
            runtime.config.entry_points.PythonToolError: a bad ``ai.python_tools`` entry.
        """
        if self._shared is not None:
            return
        from actors.models.faux_script import register_configured_providers
        from runtime.memory.db import Database
        from runtime.session.chat_history import make_chat_history_tool  # noqa: F401
        from runtime.session.console_events import console_event_hook  # noqa: F401
        from runtime.session.features import AgentFeatures  # noqa: F401  (warm the imports of __call__)

        register_configured_providers(self.config.ai.providers)  # API keys: ai.providers.*.api_key_env
        from actors.limits import install_provider_gate

        install_provider_gate(self.config.ai.providers)  # docs/decisions.md#spend-provider-limits
        if self._db is None:
            self._db = database if database is not None else Database(self.config.database.url, threads=1)
        if self._capabilities is None:  # one per process, on the shared SQL store
            from runtime.session.capabilities import capability_cache

            self._capabilities = capability_cache(self.config, self._db)
        tools = business_tools(self.config)  # validated at start-up (SessionRuntime.start)
        self._code = agent_code(self.config)
        self._output = output_schema(self.config)
        model = self._model()
        if not self.config.ai.default_model:
            from actors.models.builtin import builtin_tools

            tools += builtin_tools()  # the offline model's demo tools (clock, echo, count_slowly)
        self._shared = (model, tools)

    def __call__(self, session_key: str) -> SessionSetup:
        """Build the setup in the calling (actor) process; only the session-bound parts (the
        ``chat_history`` tool, the console hook, the agent features) are new per call.

        Raises:
            runtime.config.ConfigError: ``ai.default_model`` names an unknown provider.
        """
        from runtime.keys import parse_session_key
        from runtime.session.chat_history import make_chat_history_tool
        from runtime.session.console_events import console_event_hook
        from runtime.session.context_window import budget_policy
        from runtime.session.features import AgentFeatures
        from runtime.session.turn import ABORT_TEXT, SessionSetup

        key = parse_session_key(session_key)
        self.prepare()
        assert self._shared is not None
        model, shared_tools = self._shared
        agent = self.config.ai.agent
        tools: list[Any] = [
            make_chat_history_tool(self._db, platform=key.platform, bot_id=key.bot_id, scene_id=key.scene_id),
            *shared_tools,
        ]
        from actors.models.image_tool import image_tool_for

        image_tool = image_tool_for(self.config, key.platform, key.bot_id)  # ai.image_model + media_dir
        tools += [image_tool] if image_tool is not None else []
        if agent.delegate:  # a sub-agent with the business tools, without the IM preset
            from runtime.session.turn_tools import make_subagent_tool

            tools.append(make_subagent_tool(model, shared_tools))
        from runtime.session.capabilities import default_probe

        features = AgentFeatures.from_config(
            self.config, builtin_model=None if self.config.ai.default_model else model
        )
        if features.commands is not None:  # /models reads the same store
            features.commands.capabilities = self._capabilities
        return SessionSetup(
            model=model,
            tools=tools,
            system_prompt=IM_SYSTEM_PROMPT,
            output_schema=self._output,
            output_sink=output_sink(self.config),
            steering_mode=agent.steering_mode,
            follow_up_mode=agent.follow_up_mode,
            features=features,
            on_event=console_event_hook(self.config, session_key),  # console live events
            compaction_threshold=agent.compaction_threshold,
            context_budget=budget_policy(self.config.ai),  # docs/decisions.md#agent-context-budget
            # docs/decisions.md#session-hot-chat-coalescing: the queue fits the host's mailbox
            coalesce=agent.coalesce.within_mailbox(self.config.runtime.mailbox_size),
            max_iterations=agent.max_iterations,
            pre_tools=list(self._code[0]),
            deferred_tasks=dict(self._code[1]),
            **({"failure_text": agent.failure_text} if agent.failure_text else {}),
            **({"busy_text": agent.busy_text} if agent.busy_text else {}),
            abort_text=ABORT_TEXT if agent.abort_text is None else (agent.abort_text or None),
            capabilities=self._capabilities,  # docs/decisions.md#structured-capability-cache
            # the built-in offline model answers every tier: nothing to probe
            probe=default_probe if self.config.ai.default_model else None,
        )

    def _model(self) -> Any:
        ref = self.config.ai.default_model
        if ref:
            from runtime.config import resolve_model_ref

            return resolve_model_ref(ref, self.config)
        from actors.models.builtin import builtin_model  # the offline built-in model

        return builtin_model()

    def __getstate__(self) -> dict[str, Any]:
        # process-local parts
        return {
            "config": self.config,
            "_db": None,
            "_shared": None,
            "_capabilities": None,
            "_code": ([], {}),
            "_output": "segments",
        }

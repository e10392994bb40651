"""``ai.probe_on_start`` through :meth:`actors.placement.runtime.SessionRuntime.start` on real local Ray
(docs/decisions.md#structured-capability-cache): the configured models are probed before the hosts
start — here a scripted faux provider named by ``ai.providers.<alias>.script``
(docs/decisions.md#faux-script-from-config) — and each probed tier is one ``model_capabilities``
row in the runtime's SQLite database; a pinned model is neither probed nor stored."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from providers.faux import unregister_faux_provider
from runtime.llm.types import AssistantMessage, Context, TextContent, ToolCall
from runtime.memory.db import Database
from runtime.session.capability_store import SqlCapabilityStore
from tests.actors.session_support import running_runtime

pytestmark = pytest.mark.ray

ALIAS = "probed"
PROSE = "Sure, ok!"


def tool_tier_model(context: Context, options: Any = None) -> AssistantMessage:
    """The scripted model (``ai.providers.probed.script``): prose under a native schema, a valid
    call of the offered tool, ``{"ok": true}`` as text otherwise — a model whose tier is ``tool``."""
    content: list[Any] = [TextContent(text='{"ok": true}')]
    if options is not None and options.output_schema is not None:
        content = [TextContent(text=PROSE)]
    elif context.tools:
        content = [ToolCall(id="call_1", name=context.tools[0].name, arguments={"ok": True})]
    stop = "toolUse" if isinstance(content[0], ToolCall) else "stop"
    return AssistantMessage(content=content, provider=ALIAS, model="m", stop_reason=stop)


def test_start_probes_the_configured_models_and_stores_the_tiers(
    ray_session: None, tmp_path: Path, fixtures_dir: Path
) -> None:
    ai = {
        "probe_on_start": True,
        "providers": {
            ALIAS: {
                "api": "faux",
                "script": f"{__name__}:tool_tier_model",
                "models": [{"id": "m"}, {"id": "pinned", "structured_tier": "prompt"}],
            }
        },
    }
    try:
        with running_runtime(tmp_path, fixtures_dir, ai=ai, wait_warm=False) as h:
            db = Database(h.config.database.url)
            try:
                rows = asyncio.run(SqlCapabilityStore(db).load_all())
            finally:
                db.dispose()
    finally:
        unregister_faux_provider(ALIAS)  # registered in this (driver) process by the start-up probe
    assert [(r.provider, r.model, r.tier, r.source, r.failures) for r in rows] == [
        (ALIAS, "m", "tool", "probe", 0)
    ]
    assert rows[0].evidence == f'native: {PROSE}\ntool: {{"ok": true}}'
    assert rows[0].reason.startswith("native: (root): Invalid JSON")
    assert rows[0].reason.endswith("; tool: valid")

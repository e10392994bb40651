"""A picklable ``SetupFactory`` for the actor-level feature tests: the scripted model of
``tests/actors/session_scripts.py`` plus :class:`runtime.session.features.AgentFeatures` with chat
commands (``/models`` lists the scripted model)."""

from __future__ import annotations

from runtime.session.turn import SessionSetup
from tests.actors.session_scripts import ScriptedSetup


class FeatureSetup(ScriptedSetup):
    """``ScriptedSetup`` + chat commands (``ai.commands``-style ``names``/``texts`` overrides)."""

    def __init__(self, marker_dir: str, names: dict[str, str] | None = None) -> None:
        super().__init__(marker_dir)
        self.names = names or {}

    def __call__(self, session_key: str) -> SessionSetup:
        from dataclasses import replace

        from runtime.reply.capability import CAPABILITIES
        from runtime.session.commands import CommandHandler
        from runtime.session.features import AgentFeatures

        setup = super().__call__(session_key)
        model = setup.model.model_copy(update={"context_window": 8192})
        CAPABILITIES.record(model, "native")
        commands = CommandHandler(self.names, models=[model], default_model=model.ref())
        return replace(setup, model=model, features=AgentFeatures(commands=commands))

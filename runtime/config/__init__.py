"""``sessionray.yaml`` as one closed pydantic model: ``ai`` (providers, models, agent modes, MCP
servers, chat commands), ``bots``, ``database``, ``server`` and ``runtime``. Every default lives
here and nowhere else; :func:`load_config` names the file and the dotted key of each problem
(`docs/decisions.md#config-closed-model`).
"""

from runtime.config import settings
from runtime.config.settings import *  # noqa: F403  (the names of settings.__all__, listed once there)

__all__ = list(settings.__all__)

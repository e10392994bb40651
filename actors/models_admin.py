"""``GET /admin/models``: every configured model with its structured-output tier, the tier's
source (``probe`` / ``config`` / ``downgrade``) and age, read from the SQL ``model_capabilities``
store every process shares (docs/decisions.md#structured-capability-cache).

Answer::

    {"models": [{"model": "local/qwen", "api": "openai-completions", "tier": "tool",
                 "source": "downgrade", "age_s": 12.5, "reason": "...", "failures": 0}, ...]}

``tier``/``source`` are ``null`` for a model not used (nor probed) yet; ``age_s`` is ``null`` for a
config tier. ``sessionray models`` (:func:`actors.control_cli.models_main`) prints it.
"""

from __future__ import annotations

from typing import Any

from runtime.memory.db import Database

__all__ = ["models_payload"]


async def models_payload(config: Any, db: Database | None) -> dict[str, Any]:
    """The answer of ``GET /admin/models`` for ``config`` (``None``: no models) over ``db``
    (``None``: config tiers only, nothing stored is read).

    Raises:
        runtime.config.ConfigError: a model reference names an unknown provider.
        sqlalchemy.exc.SQLAlchemyError: the store failed (logged by the cache; the rows then show
            what this process knows).
    """
    if config is None:
        return {"models": []}
    from runtime.reply.capability import CapabilityCache
    from runtime.session.capabilities import capability_cache, configured_models, model_rows

    cache = capability_cache(config, db) if db is not None else CapabilityCache()
    return {"models": await model_rows(configured_models(config), cache)}

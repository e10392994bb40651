"""``GET /admin/models``: every configured model with its structured-output tier, the tier's
source (``probe`` / ``config`` / ``downgrade``) and age, read from the SQL ``model_capabilities``
store every process shares (docs/decisions.md#structured-capability-cache).

Answer::

    {"models": [{"model": "local/qwen", "api": "openai-completions", "tier": "tool",
                 "source": "downgrade", "age_s": 12.5, "reason": "...", "failures": 0,
                 "default": true, "note": "default"}, ...]}

``tier``/``source`` are ``null`` for a model not used (nor probed) yet (``note`` then says
``probed at first use``); ``age_s`` is ``null`` for a config tier. ``default`` marks
``ai.default_model``. With no model configured (the embedded defaults of ``make run``) the one row
is the built-in offline model (``builtin/sessionray-builtin``, ``api`` ``faux``): it answers every
tier and is never probed, so its row says ``tier`` ``native`` (what its turns use), ``source``
``built-in`` and a note saying it is not an LLM — the model ``/models`` and ``/status`` name.
``sessionray models`` (:func:`actors.cli.control.models_main`) prints it. Mounted by
:func:`actors.http.admin.admin_routes` behind its guard (:func:`models_routes`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from actors.http.admin_guard import Guard
from runtime.memory.db import Database

__all__ = ["BUILTIN_NOTE", "models_payload", "models_routes"]

BUILTIN_NOTE = "default; built-in offline model, not an LLM: answers every tier, never probed"
"""The ``note`` of the built-in model's row."""


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

    models = configured_models(config)
    if not models and not config.ai.default_model:
        from actors.models.builtin import builtin_model

        row = {**(await model_rows([builtin_model()], CapabilityCache()))[0], "default": True}
        return {"models": [{**row, "tier": "native", "source": "built-in", "note": BUILTIN_NOTE}]}
    cache = capability_cache(config, db) if db is not None else CapabilityCache()
    rows = []
    for row in await model_rows(models, cache):
        default = row["model"] == config.ai.default_model
        notes = ["default"] if default else []
        if row["tier"] is None:
            notes.append("probed at first use")
        rows.append({**row, "default": default, "note": "; ".join(notes)})
    return {"models": rows}


def models_routes(
    guarded: Guard, database: Callable[[], Awaitable[Database | None]], runtime: Any
) -> list[BaseRoute]:
    """``GET /admin/models``, wrapped by ``guarded`` (the admin token check and error mapping).

    Args:
        guarded: :func:`~actors.http.admin_guard.bearer_guard`'s wrapper.
        database: Returns the SQL store (the ingress's Database), or None when there is none.
        runtime: The session runtime handle (its ``config``, when it has one).
    """

    async def models(request: Request) -> Response:
        return JSONResponse(await models_payload(getattr(runtime, "config", None), await database()))

    return [Route("/admin/models", guarded(models), methods=["GET"])]

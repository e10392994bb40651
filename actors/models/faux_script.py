"""Scripted ``faux`` providers named in the configuration: ``ai.providers.<alias>.script``
(docs/decisions.md#faux-script-from-config).

A faux model answers only where a handle is registered under its provider alias, and handles are
process-local; a ``script`` makes the configuration itself say how the alias answers, so
``sessionray serve`` (whose session hosts build their setup from the configuration alone) can run
a scripted model. Example::

    ai:
      default_model: scripted/chat
      providers:
        scripted:
          api: faux
          script: mypackage.replies:answer     # (context, options) -> AssistantMessage
          models: [{id: chat, structured_tier: native}]

:func:`register_configured_providers` registers the built-in apis and these handles from the
configured providers (each session host does, in
:meth:`actors.placement.hosts.setup.ConfigSetupFactory.prepare`).
It lives above ``providers/`` because it loads code named in the configuration
(docs/decisions.md#layout-forbidden-pairs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from providers import register_builtin_providers
from providers.faux import register_faux_provider

if TYPE_CHECKING:
    from providers.common import ProviderConfigs

__all__ = ["SCRIPT_CHUNK_SIZE", "faux_scripts", "register_configured_providers", "register_faux_scripts"]

SCRIPT_CHUNK_SIZE = 64
"""Characters per streamed chunk of a scripted reply."""


def faux_scripts(provider_configs: ProviderConfigs | None) -> dict[str, Any]:
    """Alias → the imported ``script`` function of every ``api: faux`` provider that has one.

    Raises:
        runtime.config.entry_points.PythonToolError: a script cannot be imported or is not
            callable (the message starts with the reference).
    """
    from runtime.config.entry_points import load_callable

    return {
        alias: load_callable(pc.script)
        for alias, pc in (provider_configs or {}).items()
        if pc.api == "faux" and pc.script
    }


def register_faux_scripts(provider_configs: ProviderConfigs | None) -> list[str]:
    """Register (or replace) one faux handle per scripted provider: the alias's configured model
    ids, each call answered by its script (no recorded calls: hosts are long-lived).

    Returns:
        The aliases registered, sorted.

    Raises:
        runtime.config.entry_points.PythonToolError: as :func:`faux_scripts`.
    """
    scripts = faux_scripts(provider_configs)
    for alias, fn in scripts.items():
        assert provider_configs is not None
        register_faux_provider(
            provider=alias,
            models=[m.id for m in provider_configs[alias].models],
            chunk_size=SCRIPT_CHUNK_SIZE,
            default_response=fn,
            max_recorded_calls=0,
        )
    return sorted(scripts)


def register_configured_providers(provider_configs: ProviderConfigs | None = None) -> list[str]:
    """Register the built-in apis with the configured providers
    (:func:`providers.register_builtin_providers`), then one faux handle per scripted provider
    (:func:`register_faux_scripts`); what an entry point calls once.

    Returns:
        The api ids registered, sorted (as :func:`providers.register_builtin_providers`).

    Raises:
        runtime.config.entry_points.PythonToolError: as :func:`faux_scripts`.
    """
    apis = register_builtin_providers(provider_configs)
    register_faux_scripts(provider_configs)
    return apis

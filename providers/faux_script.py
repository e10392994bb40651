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

:func:`providers.register_builtin_providers` registers these handles whenever it is given the
configured providers (each session host does, in
:meth:`actors.placement.hosts.setup.ConfigSetupFactory.prepare`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from providers.faux import register_faux_provider

if TYPE_CHECKING:
    from providers.common import ProviderConfigs

__all__ = ["SCRIPT_CHUNK_SIZE", "faux_scripts", "register_faux_scripts"]

SCRIPT_CHUNK_SIZE = 64
"""Characters per streamed chunk of a scripted reply."""


def faux_scripts(provider_configs: ProviderConfigs | None) -> dict[str, Any]:
    """Alias → the imported ``script`` function of every ``api: faux`` provider that has one.

    Raises:
        runtime.session.python_tools.PythonToolError: a script cannot be imported or is not
            callable (the message starts with the reference).
    """
    from runtime.session.python_tools import load_callable

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
        runtime.session.python_tools.PythonToolError: as :func:`faux_scripts`.
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

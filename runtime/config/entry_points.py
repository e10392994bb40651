"""A Python object named in the configuration by a ``"package.module:attribute"`` reference
(:data:`runtime.config.ai.ENTRY_POINT_RE`): ``ai.python_tools``, ``ai.agent.pre_tools`` and
``deferred_tasks``, ``ai.providers.<alias>.script``, an ``output_schema`` model, a ``*.tool.md``
handler. The configuration checks the form of a reference when it loads; this module imports it
where it is used (a session host, the start-up checks), so every wing above the configuration
loads references the same way and no provider module needs a session to do it
(docs/decisions.md#layout-forbidden-pairs).
"""

from __future__ import annotations

import importlib
from typing import Any

from runtime.config.ai import ENTRY_POINT_RE

__all__ = ["PythonToolError", "import_entry_point", "load_callable"]


class PythonToolError(ValueError):
    """A reference named in the configuration (an ``ai.python_tools`` entry, a pre-tool, a deferred
    task, a faux ``script``) cannot be loaded; the message starts with the reference."""


def import_entry_point(ref: str) -> Any:
    """Import ``"package.module:attribute"`` and return the attribute.

    Raises:
        ValueError: ``ref`` is not of the form ``module:attribute``.
        ImportError: the module cannot be imported.
        AttributeError: the module has no such attribute.
    """
    if not ENTRY_POINT_RE.fullmatch(ref):
        raise ValueError(f"{ref!r} is not of the form 'package.module:attribute'")
    module_name, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def load_callable(ref: str) -> Any:
    """The callable named by ``"module:function"`` (also ``ai.providers.<alias>.script``).

    Raises:
        PythonToolError: it cannot be imported or is not callable.
    """
    try:
        fn = import_entry_point(ref)
    except (ImportError, AttributeError, ValueError) as exc:
        raise PythonToolError(f"{ref}: cannot be imported: {exc}") from None
    if not callable(fn):
        raise PythonToolError(f"{ref}: is not callable")
    return fn

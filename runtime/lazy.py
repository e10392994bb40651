"""Lazy package exports (PEP 562): a package's ``__init__`` writes the names it re-exports once,
as imports inside ``if TYPE_CHECKING:``; type checkers read them there, and at run time each name
is imported on its first use through the package's module ``__getattr__``.

Why: every ``import runtime.<anything>`` first runs ``runtime/__init__.py``; when that file imported
its public API eagerly, a process that needs one small module (the router needs the metrics and
the control types, not the agent loop nor SQLAlchemy) carried every wing — ≈ 26 MiB more per Ray
process (docs/decisions.md#ops-lazy-exports).

Shape::

    if TYPE_CHECKING:
        from runtime.agent.agent import Agent
    else:  # hidden from type checkers: they would take any name the package is asked for
        __getattr__, __dir__ = lazy_exports(__name__, __file__)

Rules (checked by ``tests/layout/test_lazy_exports.py``): an exported name never equals the name
of a submodule of its package (a submodule imported first would shadow it), and only
``from <absolute module> import <name>`` statements count (no ``*``, no relative import).
"""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["lazy_exports", "read_exports"]


def read_exports(init_file: str | Path) -> dict[str, str]:
    """The ``name → module`` table of a package ``__init__``'s ``if TYPE_CHECKING:`` block.

    Raises:
        ValueError: a ``*`` or relative import in that block (the name could not be resolved).
    """
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"))
    table: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"):
            continue
        for stmt in node.body:
            if not isinstance(stmt, ast.ImportFrom):
                continue
            if stmt.level or stmt.module is None or any(a.name == "*" for a in stmt.names):
                raise ValueError(f"{init_file}: lazy exports need `from <absolute module> import <names>`")
            for alias in stmt.names:
                table[alias.asname or alias.name] = f"{stmt.module}:{alias.name}"
    return table


def lazy_exports(package: str, init_file: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose ``__init__`` is ``init_file``.

    ``__getattr__(name)`` imports the module that defines ``name``, caches the value on the package
    (later lookups are plain attribute reads) and returns it; an unknown name raises
    ``AttributeError`` as for any module.
    """
    table = read_exports(init_file)

    def __getattr__(name: str) -> object:
        target = table.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = target.partition(":")
        value = getattr(importlib.import_module(module), attr)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(table) | set(vars(sys.modules[package])))

    return __getattr__, __dir__

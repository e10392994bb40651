"""Sizes as smell detectors: no source file over :data:`FILE_LINES` lines, no function over
:data:`FUNCTION_LINES` lines in ``runtime/``, ``providers/`` and ``actors/``
(docs/decisions.md#layout-cut-by-purpose).

A file or function over the line is a sign that it does more than one job: it is cut by job,
never squeezed or split at a line count to pass. :data:`LONG_FUNCTIONS` names the functions
being cut right now; it only shrinks — an entry whose function is back under the line (or gone)
fails the test until it is removed. Read with :mod:`ast`, nothing is run.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "providers", "actors")
FILE_LINES = 650
FUNCTION_LINES = 80
LONG_FUNCTIONS: set[tuple[str, str]] = set()
"""Functions over :data:`FUNCTION_LINES` lines being cut now, as (file name, function name): the
file's name without its folder, so that a module moved to another package keeps its entry."""


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _measure(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every def and async def in ``tree``, nested ones too."""
    return [
        (node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def _function_lines() -> dict[tuple[str, str], list[tuple[str, int]]]:
    """(file name, function name) -> [(``path:line``, lines)] over :data:`PACKAGES`."""
    found: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for path in _sources():
        for name, first, lines in _measure(ast.parse(path.read_text(encoding="utf-8"))):
            found.setdefault((path.name, name), []).append((f"{path.relative_to(ROOT)}:{first}", lines))
    return found


FUNCTIONS = _function_lines()


def test_no_source_file_over_650_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > FILE_LINES
    }
    assert long == {}, (
        f"files over {FILE_LINES} lines: cut each by job (docs/decisions.md#layout-cut-by-purpose)"
    )


def test_no_function_over_80_lines() -> None:
    long = {
        where: lines
        for key, places in FUNCTIONS.items()
        if key not in LONG_FUNCTIONS
        for where, lines in places
        if lines > FUNCTION_LINES
    }
    assert long == {}, (
        f"functions over {FUNCTION_LINES} lines: cut each into steps named for what they do "
        "(docs/decisions.md#layout-cut-by-purpose)"
    )


def test_long_function_allow_list_only_shrinks() -> None:
    stale = {}
    for key in sorted(LONG_FUNCTIONS):
        longest = max((lines for _, lines in FUNCTIONS.get(key, [])), default=0)
        if longest <= FUNCTION_LINES:
            stale[f"{key[0]}:{key[1]}"] = longest
    assert stale == {}, (
        f"allow-listed functions now at most {FUNCTION_LINES} lines (0: no such function): "
        "remove them from LONG_FUNCTIONS in tests/layout/test_sizes.py"
    )


def test_function_size_counts_def_to_last_line() -> None:
    # The measure itself: a def, its docstring and 80 statements are 82 lines; a nested def counts too.
    body = "".join(f"    x{i} = {i}\n" for i in range(80))
    short = "async def short():\n    def inner():\n        pass\n"
    source = f'@decorated\ndef long():\n    """Doc."""\n{body}\n\n{short}'
    assert _measure(ast.parse(source)) == [("long", 2, 82), ("short", 86, 3), ("inner", 87, 2)]
    assert len(FUNCTIONS) > 1000  # every package was read

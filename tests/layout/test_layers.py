"""The import structure: every import runs downward and there is no cycle.

Rooms from the bottom up (`docs/architecture.md`, "Layers"): the leaves ``runtime.keys`` and
``runtime.metrics``, then the wings of ``runtime`` in the order of :data:`WINGS`, then
``providers``, then ``actors``. A module may import its own wing and any wing below it, never
one above; ``runtime/__init__.py`` only re-exports and is imported by nothing inside ``runtime``.
Imports inside functions count like top-level ones (an upward import hidden in a function is
still an upward import). Checked by reading the source with :mod:`ast`, so nothing is run.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "providers", "actors")
WINGS = (
    "runtime.keys",
    "runtime.metrics",
    "runtime.llm",
    "runtime.agent",
    "runtime.reply",
    "runtime.memory",
    "runtime.config",
    "runtime.platforms",
    "runtime.delivery",
    "runtime.spend",
    "runtime.session",
    "runtime",
    "providers",
    "actors.raylife",
    "actors.delivery",
    "actors.placement.hosts",
    "actors.placement",
    "actors.http",
    "actors.inbound",
    "actors.serve",
    "actors.cli",
    "actors",
)
"""Bottom first. ``runtime`` is the package's own ``__init__`` (re-exports only); ``actors`` its
package's ``__init__`` (the wings of ``actors`` are listed in ``docs/architecture.md``, "Layers")."""


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _imports(path: Path, name: str) -> set[str]:
    """Modules of ours that ``path`` imports (the longest known prefix of each target)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            # ``from pkg import mod`` imports the module ``pkg.mod``; ``from pkg import Name`` the
            # package ``pkg`` itself (its ``__init__``).
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _wing(module: str) -> int:
    best = -1
    for rank, wing in enumerate(WINGS):
        if module == wing or module.startswith(wing + "."):
            best = rank if best < 0 or len(wing) > len(WINGS[best]) else best
    assert best >= 0, f"{module} is in no wing of WINGS"
    return best


GRAPH = {name: _imports(path, name) for name, path in MODULES.items()}


def test_every_module_is_in_a_wing() -> None:
    assert {m for m in MODULES if not any(m == w or m.startswith(w + ".") for w in WINGS)} == set()


def test_imports_only_run_downward() -> None:
    upward = sorted(
        f"{src} -> {dst}"
        for src, dsts in GRAPH.items()
        for dst in dsts
        if _wing(dst) > _wing(src) or (dst == "runtime" and src != "runtime")
    )
    assert upward == []


def test_no_import_cycle() -> None:
    # Tarjan's strongly connected components over module imports; a package's __init__ that
    # re-exports its own modules is an edge like any other, so a module importing its own
    # package's __init__ back would show up as a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert cycles == []


def test_runtime_top_level_is_small() -> None:
    entries = [p.name for p in (ROOT / "runtime").iterdir() if p.name != "__pycache__"]
    assert len(entries) <= 13, sorted(entries)


def test_no_source_file_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert long == {}


def test_wing_graph_helper_sees_known_edges() -> None:
    # The checker itself: a known downward edge is seen, so an empty "upward" list means something.
    assert "runtime.llm.types" in GRAPH["runtime.agent.loop"]
    assert _wing("runtime.session.core") > _wing("runtime.delivery.core") > _wing("runtime.platforms.base")

"""The import structure: every import runs downward and there is no cycle.

Rooms from the bottom up (`docs/architecture.md`, "Layers"): the leaves ``runtime.lazy`` (the
lazy package exports every package ``__init__`` may use), ``runtime.keys`` and
``runtime.metrics``, then the wings of ``runtime`` in the order of :data:`WINGS`, then
``providers``, then ``actors``. A module may import its own wing and any wing below it, never
one above; ``runtime/__init__.py`` only re-exports and is imported by nothing inside ``runtime``.
Imports inside functions count like top-level ones (an upward import hidden in a function is
still an upward import). Checked by reading the source with :mod:`ast`, so nothing is run.

The ranking says what may never run upward; :data:`FORBIDDEN` says which pairs of wings may never
meet at all, whatever their rank (docs/decisions.md#layout-forbidden-pairs): each wing imports
only what its own job needs.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("runtime", "providers", "actors")
WINGS = (
    "runtime.lazy",
    "runtime.keys",
    "runtime.metrics",
    "runtime.tracing",
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
    "actors.limits",
    "actors.models",
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


def _modules(root: Path = ROOT) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _imports(path: Path, name: str, modules: dict[str, Path] = MODULES) -> set[str]:
    """Modules of ours (``modules``) that ``path`` imports (the longest known prefix of each target)."""
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
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for target in targets:
            while target and target not in modules:
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


class Forbidden(NamedTuple):
    """A pair of wings that never meet: no module under ``importer`` imports a module under any of
    ``imported`` (package prefixes, e.g. ``runtime.agent``), except the modules named in
    ``allowed``. ``reason`` cites the rule in docs/decisions.md."""

    importer: str
    imported: tuple[str, ...]
    reason: str
    allowed: tuple[str, ...] = ()


def _runtime_above(wing: str) -> tuple[str, ...]:
    """The wings of ``runtime`` ranked above ``wing`` in :data:`WINGS` (its own ``__init__`` aside),
    bottom first: the ones a row of :data:`FORBIDDEN` names when its wing knows nothing above it."""
    return tuple(w for w in WINGS[WINGS.index(wing) + 1 :] if w.startswith("runtime."))


_PAIRS = "docs/decisions.md#layout-forbidden-pairs"
FORBIDDEN = (
    # The LLM layer knows no agent, no session, no platform; providers plug in through its registry.
    Forbidden("runtime.llm", (*_runtime_above("runtime.llm"), "providers", "actors"), _PAIRS),
    # The agent loop knows no IM: the terminal chat and a live session drive the same Agent.
    Forbidden("runtime.agent", _runtime_above("runtime.agent"), "docs/decisions.md#agent-one-engine"),
    # The reply contract knows no storage, no configuration file and no platform's wire format.
    Forbidden("runtime.reply", _runtime_above("runtime.reply"), _PAIRS),
    # Memory stores; it runs no agent and renders no reply. The one exception is the forged-sender
    # check, which user messages pass before they are stored (docs/decisions.md#security-sender-prefix).
    Forbidden(
        "runtime.memory",
        ("runtime.agent", "runtime.reply", *_runtime_above("runtime.memory")),
        _PAIRS,
        allowed=("runtime.reply.sender",),
    ),
    # The configuration is a leaf apart from llm types: it describes, it does not run.
    Forbidden(
        "runtime.config",
        (
            "runtime.keys",
            "runtime.metrics",
            "runtime.agent",
            "runtime.reply",
            "runtime.memory",
            *_runtime_above("runtime.config"),
        ),
        _PAIRS,
    ),
    # A codec turns bytes into messages and replies into calls: no agent, no storage, no sending.
    Forbidden(
        "runtime.platforms",
        ("runtime.agent", "runtime.memory", "runtime.delivery", "runtime.spend", "runtime.session"),
        "docs/decisions.md#platform-codecs",
    ),
    # Delivery sends what the session hands over; it runs no agent.
    Forbidden("runtime.delivery", ("runtime.agent", "runtime.spend", "runtime.session"), _PAIRS),
    # Providers are wire protocols: they know the llm types (and config types), nothing of the IM.
    Forbidden(
        "providers",
        (
            "runtime.agent",
            "runtime.reply",
            "runtime.memory",
            "runtime.platforms",
            "runtime.delivery",
            "runtime.spend",
            "runtime.session",
            "actors",
        ),
        "docs/decisions.md#provider-split-by-concern",
    ),
    # runtime/ reaches a provider only through the api registry, and never imports Ray's shells.
    Forbidden("runtime", ("providers",), "docs/decisions.md#llm-api-registry"),
    Forbidden("runtime", ("actors",), "docs/decisions.md#session-ray-free-core"),
)
"""Every pair of wings that never meet, with its reason (docs/decisions.md#layout-forbidden-pairs)."""


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def forbidden_imports(root: Path) -> list[str]:
    """Every import under ``root`` (a tree holding ``runtime/``, ``providers/``, ``actors/``) that
    :data:`FORBIDDEN` rules out, as ``"importer -> imported (reason)"``, sorted."""
    modules = _modules(root)
    found = set()
    for src, path in modules.items():
        for dst in _imports(path, src, modules):
            for rule in FORBIDDEN:
                if not _under(src, rule.importer) or dst in rule.allowed:
                    continue
                if any(_under(dst, wing) for wing in rule.imported):
                    found.add(f"{src} -> {dst} ({rule.reason})")
    return sorted(found)


def test_no_forbidden_pair_of_wings_meets() -> None:
    assert forbidden_imports(ROOT) == []


def test_every_wing_of_the_forbidden_pairs_exists() -> None:
    # A misspelt wing would make its row match nothing and pass forever.
    named = {w for rule in FORBIDDEN for w in (rule.importer, *rule.imported)}
    assert named - set(WINGS) == set()
    allowed = {m for rule in FORBIDDEN for m in rule.allowed}
    assert allowed - set(MODULES) == set()


def test_forbidden_pairs_checker_reports_a_reintroduced_wrong_import(tmp_path: Path) -> None:
    sources = {
        "runtime/__init__.py": "",
        "runtime/agent/__init__.py": "",
        "runtime/agent/loop.py": "from runtime.llm.types import Model\n",
        "runtime/agent/x.py": "import runtime.platforms\n",
        "runtime/llm/__init__.py": "",
        "runtime/llm/types.py": "",
        "runtime/platforms/__init__.py": "",
        "runtime/reply/__init__.py": "",
        "runtime/reply/sender.py": "",
        "runtime/reply/segments.py": "",
        "runtime/memory/__init__.py": "",
        # the named exception passes; a relative import of another reply module does not
        "runtime/memory/repository.py": "from runtime.reply.sender import x\nfrom ..reply import segments\n",
        "runtime/session/__init__.py": "",
        "runtime/session/core.py": "from runtime.agent import loop\n",
        "providers/__init__.py": "",
        "providers/builtin.py": "def model():\n    from runtime.session.core import x\n",
        "actors/__init__.py": "from providers import builtin\n",
    }
    for rel, text in sources.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    assert forbidden_imports(tmp_path) == [
        "providers.builtin -> runtime.session.core (docs/decisions.md#provider-split-by-concern)",
        "runtime.agent.x -> runtime.platforms (docs/decisions.md#agent-one-engine)",
        "runtime.memory.repository -> runtime.reply.segments (docs/decisions.md#layout-forbidden-pairs)",
    ]


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
    # 14: the tracing leaf (runtime/tracing, next to runtime/metrics.py; docs/decisions.md#ops-traces);
    # 15: the lazy-exports leaf (runtime/lazy.py; docs/decisions.md#ops-lazy-exports)
    assert len(entries) <= 15, sorted(entries)


def test_wing_graph_helper_sees_known_edges() -> None:
    # The checker itself: a known downward edge is seen, so an empty "upward" list means something.
    assert "runtime.llm.types" in GRAPH["runtime.agent.loop"]
    assert _wing("runtime.session.core") > _wing("runtime.delivery.core") > _wing("runtime.platforms.base")

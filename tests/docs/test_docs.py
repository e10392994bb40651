"""The documentation stands on its own and agrees with the code.

* docs/configuration.md lists exactly the keys of :class:`runtime.config.Config` (the page's
  convention: ``a.b`` for a nested section, ``a[].b`` for a list of objects, ``a.<name>.b`` for a
  mapping whose keys the user chooses);
* every ``docs/decisions.md#<anchor>`` cited in code, tests, examples and docs exists;
* nothing in the repository points at files a fresh clone does not have;
* README.md stays short, and the relative links of README.md and docs/*.md resolve;
* every YAML example of docs/configuration.md loads.
"""

from __future__ import annotations

import re
import subprocess
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import yaml
from pydantic import BaseModel

from runtime.config import Config, parse_config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
DECISIONS = DOCS / "decisions.md"
CONFIGURATION = DOCS / "configuration.md"

CITING_DIRS = ("runtime", "actors", "providers", "tests", "examples", "docs")
CITATION = re.compile(r"docs/decisions\.md#([A-Za-z0-9_-]+)")


# --------------------------------------------------------------------------- helpers


def _model_in(annotation: typing.Any) -> tuple[str, type[BaseModel]] | None:
    """``("", M)`` for a model (or an optional one), ``("[]", M)`` for a list of models,
    ``(".<name>", M)`` for a mapping of models; None for anything else (a leaf)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "", annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and args:
        inner = _model_in(args[0])
        return ("[]", inner[1]) if inner and inner[0] == "" else None
    if origin is dict and len(args) == 2:
        inner = _model_in(args[1])
        return (".<name>", inner[1]) if inner and inner[0] == "" else None
    if origin in (typing.Union, types.UnionType):
        models = [m for m in (_model_in(a) for a in args if a is not type(None)) if m]
        return models[0] if len(models) == 1 else None
    return None


def config_paths(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every field of the configuration model as a dotted path, nested models included."""
    paths = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        nested = _model_in(field.annotation)
        if nested is not None:
            suffix, sub = nested
            paths += config_paths(sub, f"{path}{suffix}.")
    return paths


def documented_keys() -> list[str]:
    """First-column keys of the table rows of configuration.md that belong to the file's sections."""
    roots = set(Config.model_fields)
    cells = re.findall(r"^\| `([^`]+)` \|", CONFIGURATION.read_text(), flags=re.M)
    return [c for c in cells if re.split(r"[.\[]", c, maxsplit=1)[0] in roots]


def repo_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files (what a commit would contain)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [ROOT / name for name in out.split("\0") if name and (ROOT / name).is_file()]


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Explicit ``<a id>`` anchors and heading anchors of a Markdown page."""
    text = page.read_text()
    ids = set(re.findall(r'<a id="([^"]+)"></a>', text))
    headings = {slug(h) for h in re.findall(r"^#{1,6} (.+)$", _without_code_blocks(text), flags=re.M)}
    return ids | headings


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def relative_links(page: Path) -> Iterator[str]:
    text = _without_code_blocks(page.read_text())
    text = re.sub(r"`[^`\n]*`", "x", text)  # link text may be code; code itself holds no links
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: …
            yield target


# --------------------------------------------------------------------------- tests


def test_every_config_key_is_documented() -> None:
    documented = set(documented_keys())
    missing = [p for p in config_paths() if p not in documented]
    assert missing == [], f"keys of runtime.config.Config missing from docs/configuration.md: {missing}"


def test_every_documented_key_exists() -> None:
    known = set(config_paths())
    unknown = [k for k in documented_keys() if k not in known]
    assert unknown == [], f"docs/configuration.md documents keys the model does not have: {unknown}"


def test_cited_decisions_exist() -> None:
    defined = set(re.findall(r'<a id="([^"]+)"></a>', DECISIONS.read_text()))  # explicit anchors only
    files = [f for d in CITING_DIRS for f in sorted((ROOT / d).rglob("*")) if f.is_file()]
    files.append(ROOT / "README.md")
    broken = []
    for f in files:
        if "fixtures" in f.relative_to(ROOT).parts or f.suffix in (".pyc", ".png"):
            continue
        for anchor in CITATION.findall(f.read_text(errors="replace")):
            if anchor not in defined:
                broken.append(f"{f.relative_to(ROOT)}: #{anchor}")
    assert broken == []


def test_decision_anchors_are_unique_and_kebab_case() -> None:
    ids = re.findall(r'<a id="([^"]+)"></a>', DECISIONS.read_text())
    assert len(ids) == len(set(ids))
    assert [i for i in ids if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", i)] == []


def test_nothing_points_outside_the_repository() -> None:
    # Built from pieces so this file does not match itself.
    needles = [s.encode() for s in ("../" + "shared", "DESIGN" + ".md", "seeds" + "/")]
    offending = []
    for f in repo_files():
        rel = f.relative_to(ROOT)
        if rel.parts[:2] == ("tests", "fixtures"):
            continue
        data = f.read_bytes()
        offending += [f"{rel}: {n.decode()}" for n in needles if n in data]
    assert offending == []


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"


def test_relative_links_resolve() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in relative_links(page):
            path, _, fragment = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such anchor)")
    assert broken == []


def test_configuration_examples_validate() -> None:
    # Every YAML example on the configuration page is a whole file a user may paste: it must load.
    blocks = re.findall(r"^```yaml\n(.*?)^```", CONFIGURATION.read_text(), flags=re.M | re.S)
    assert len(blocks) >= 3
    for block in blocks:
        parse_config(yaml.safe_load(block), "docs/configuration.md")

"""The house's dependency rule, checked on the sources: tiers point downward, nothing but the
public face imports the CLI, and no module is over 400 lines.

Ground (``sketchrec``'s own modules) -> sketches -> privacy -> models -> stream -> replay ->
experiments/benchmarks -> cli. A module may import its own tier or any tier below it, at the top
of the file or inside a function alike.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIERS = ["sketchrec", "sketchrec.sketches", "sketchrec.privacy", "sketchrec.models", "sketchrec.stream",
         "sketchrec.replay", "sketchrec.experiments", "sketchrec.benchmarks", "sketchrec.cli"]
# experiments and benchmarks are side by side: neither imports the other
RANK = {name: n for n, name in enumerate(TIERS)}
RANK["sketchrec.benchmarks"] = RANK["sketchrec.experiments"]


def _folders() -> dict[str, Path]:
    setup = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {pkg: REPO / folder for pkg, folder in setup["package-dir"].items() if pkg in TIERS}


def tier_of(module: str) -> str:
    """The tier a dotted ``sketchrec`` module name belongs to."""
    parts = module.split(".")
    name = ".".join(parts[:2])
    return name if name in RANK else "sketchrec"


def imports() -> list[tuple[str, str, int]]:
    """(importing file, imported module, line) for every ``sketchrec`` import of the product."""
    found = []
    for pkg, folder in _folders().items():
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                         else [])
                found += [(f"{pkg}:{path.relative_to(folder)}", n, node.lineno)
                          for n in names if n.split(".")[0] == "sketchrec"]
    return found


# the public face sits above everything: the package's __init__ re-exports the learners, and
# `python -m sketchrec` runs the CLI
FACE = {"sketchrec:__init__.py", "sketchrec:__main__.py"}


def upward(found: list[tuple[str, str, int]]) -> list[str]:
    """The imports that climb: a module importing a tier above its own (or a sibling tier)."""
    bad = []
    for where, module, line in found:
        if where in FACE:
            continue
        own = tier_of(where.split(":")[0])
        target = tier_of(module)
        if RANK[target] > RANK[own] or (target != own and RANK[target] == RANK[own]):
            bad.append(f"{where}:{line} imports {module}")
    return bad


def test_dependencies_point_downward():
    found = imports()
    assert len(found) > 100   # the walk reached the product's modules
    assert upward(found) == []


def test_the_check_catches_an_import_that_climbs():
    climbing = [("sketchrec.stream:serving/http.py", "sketchrec.cli.options", 1),
                ("sketchrec.sketches:bloom.py", "sketchrec.models.base", 2),
                ("sketchrec.benchmarks:suite.py", "sketchrec.experiments.common", 3)]
    assert len(upward(climbing)) == 3


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for folder in [*_folders().values(), REPO / "tests"]
                                        for p in folder.rglob("*.py")))
def test_no_module_over_400_lines(path):   # the product's modules and the tests alike
    assert len((REPO / path).read_text().splitlines()) <= 400


def module_imports() -> dict[str, set[str]]:
    """Each product module's dotted name -> the product modules its top-level statements import
    (an import inside a function runs when called, after every module is loaded). ``from a
    import b`` counts as an import of ``a.b`` where that is a module, else of ``a``."""
    files = {}
    for pkg, folder in _folders().items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            files[".".join((pkg, *parts))] = path
    graph = {}
    for name, path in files.items():
        targets = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files
                            else node.module for a in node.names}
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, found = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    graph = module_imports()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200   # the walk reached them
    assert cycles(graph) == []


def test_the_cycle_check_catches_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

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


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for folder in _folders().values()
                                        for p in folder.rglob("*.py")))
def test_no_module_over_400_lines(path):
    assert len((REPO / path).read_text().splitlines()) <= 400

"""The examples in the docstrings run: one test per module of the installed ``sketchrec`` package.

pytest's ``--doctest-modules`` would collect the product folders (``models/``, ``sketches/``, ...)
from the file system and import them a second time under their folder names; here every module
is imported by its ``sketchrec.`` name and handed to :mod:`doctest`. The product folders are mapped
onto subpackages (pyproject ``[tool.setuptools.package-dir]``), so in an editable install they are
not sub-folders of ``sketchrec.__path__``: each mapped subpackage is imported and walked from its
own ``__path__``.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import io
import pkgutil
import tomllib
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _roots() -> list[str]:
    """sketchrec and the subpackages pyproject maps from other folders (none in a plain wheel)."""
    roots = {"sketchrec"}
    if PYPROJECT.exists():
        setup = tomllib.loads(PYPROJECT.read_text()).get("tool", {}).get("setuptools", {})
        roots |= set(setup.get("package-dir", {})) - {""}
        roots |= {p for p in setup.get("packages", []) if isinstance(p, str)}
    return sorted(r for r in roots if r.split(".")[0] == "sketchrec")


def module_names() -> list[str]:
    names = set()
    for root in _roots():
        package = importlib.import_module(root)
        names.add(root)
        for info in pkgutil.walk_packages(package.__path__, root + "."):
            names.add(info.name)
    # __main__ modules run their command on import
    return sorted(n for n in names if n.rsplit(".", 1)[-1] != "__main__")


MODULES = module_names()


def test_the_walk_reaches_every_subpackage():
    assert {"sketchrec.data", "sketchrec.sketches.count_sketch"} <= set(MODULES)
    assert any(n.count(".") >= 3 for n in MODULES)  # modules of nested subpackages too
    tops = {n.split(".")[1] for n in MODULES if n.count(".") >= 1}
    assert {"sketches", "models", "privacy", "stream", "replay"} <= tops


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    report = io.StringIO()
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, name):
        runner.run(test, out=report.write)
    assert runner.failures == 0, report.getvalue()


def test_every_public_sketch_class_shows_an_example():
    import sketchrec.sketches as package

    missing = []
    for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        for cls_name, cls in vars(module).items():
            if (inspect.isclass(cls) and cls.__module__ == module.__name__ and not cls_name.startswith("_")
                    and ">>>" not in (cls.__doc__ or "")):
                missing.append(f"{module.__name__}.{cls_name}")
    assert not missing, f"no runnable example in the docstring of {missing}"


def test_a_broken_example_fails():
    """The runner above does report a wrong example (it is not silently skipping them)."""
    def wrong():
        """
        >>> 1 + 1
        3
        """
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    for test in doctest.DocTestFinder().find(wrong, "wrong", globs={}):
        runner.run(test, out=lambda _: None)
    assert runner.failures == 1 and runner.tries == 1


"""mkdocs hook: let mkdocstrings read the package's source as installed.

The product's folders sit at the repository's top and pyproject.toml maps each onto a subpackage
of ``sketchrec`` (``[tool.setuptools.package-dir]``), so ``sketchrec/`` on disk holds no
``models/``: a static reader of the source tree (griffe) finds ``sketchrec`` but not
``sketchrec.models``. Before the build this hook lays out, in a temporary directory, the tree the
wheel installs — ``sketchrec/`` with every mapped folder linked in under its subpackage name — and
hands that directory to mkdocstrings. Nothing is imported and nothing is fetched.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import tomllib
from pathlib import Path

import griffe
from mkdocs.plugins import event_priority


def _installed_tree(repo: Path) -> Path:
    mapping = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = Path(tempfile.mkdtemp(prefix="sketchrec-docs-src-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    package = root / "sketchrec"
    package.mkdir()
    # the top package's own modules are copied (a reader resolves links, and the real folder has no
    # subpackages); the mapped folders are linked whole
    for entry in (repo / mapping["sketchrec"]).glob("*.py"):
        shutil.copy2(entry, package / entry.name)
    for name, folder in mapping.items():
        if name != "sketchrec":
            target = package.joinpath(*name.split(".")[1:])
            if not target.exists():
                target.symlink_to(repo / folder, target_is_directory=True)
    return root


@event_priority(100)   # before mkdocstrings' own on_config, which sets up its handlers
def on_config(config):
    repo = Path(config.config_file_path).parent
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python["paths"] = [str(_installed_tree(repo))]
    return config


class DoctestsAsCode(griffe.Extension):
    """A griffe extension: a docstring's ``>>>`` examples (and their expected output) render as
    code. The docstrings are plain text with doctests, not markdown; left as text, an output such as
    ``['a', 'b']`` reads as a markdown link and a strict build fails on it."""

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)


def fence_doctests(text: str) -> str:
    """Wrap each run of ``>>>`` lines, with the output lines after it up to a blank line, in a
    ``pycon`` fence (text already inside a fence is left alone)."""
    out, inside, fenced = [], False, False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        if not fenced and not inside and stripped.startswith(">>>"):
            out.append("```pycon")
            inside = True
        elif inside and not stripped:
            out.append("```")
            inside = False
        out.append(line)
    if inside:
        out.append("```")
    return "\n".join(out)

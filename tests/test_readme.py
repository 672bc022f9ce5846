"""The README stays a short, runnable front page, and the docs site builds with warnings as errors.

- the set-up is exactly two commands, the second the one CI runs;
- the Python quickstart runs as a doctest;
- every relative link of the README and the docs resolves to a file;
- no tracker number (an issue, a pull request, a work session) in user text;
- ``mkdocs build --strict`` passes (skipped, saying so, where mkdocs is not installed).
"""

from __future__ import annotations

import doctest
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"

# "issue 22", "issues 20 and 21", "#20", "stop 31", "(D4)": what a reader outside the tracker cannot follow
TRACKER = re.compile(r"\b[Ii]ssues? \d+|(?<![\w&/])#\d+\b|\b[Ss]tops? \d+\b|\bD\d+\b|\b[Dd]eliverable \d+")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _section(text: str, title: str) -> str:
    start = text.index(title)
    following = text.find("\n## ", start + len(title))
    return text[start:following if following >= 0 else None]


def _fenced(text: str, lang: str) -> list[str]:
    return [b.split("```", 1)[0].strip("\n") for b in text.split(f"```{lang}\n")[1:]]


def test_the_readme_is_a_front_page_not_a_manual():
    assert len(README.read_text().splitlines()) <= 150


def test_readme_setup_is_two_commands_and_the_second_is_what_ci_runs():
    # the first installs the core only (what `replay` needs), the second the test extra; each
    # runs pasted into a fresh shell (the second activates the environment the first made)
    blocks = _fenced(_section(README.read_text(), "## Set up and run"), "bash")
    assert len(blocks) == 2 and all("\n" not in b for b in blocks)
    assert ". .venv/bin/activate" in blocks[0] and blocks[0].endswith("&& pip install -e . && replay")
    assert blocks[1].startswith(". .venv/bin/activate && ") and "pip install -e '.[test]'" in blocks[1]
    ci = (REPO / ".ci" / "run").read_text()
    assert blocks[1].endswith("&& python -m pytest -q") and "python -m pytest -q" in ci
    assert "pip install --quiet -e '.[test]'" in ci


def test_readme_python_quickstart_runs():
    blocks = _fenced(README.read_text(), "python")
    assert blocks, "the README has no Python quickstart"
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for n, block in enumerate(blocks):
        test = parser.get_doctest(block, {}, f"README python block {n + 1}", str(README), 0)
        assert test.examples, f"README python block {n + 1} has no >>> examples"
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} README example(s) failed (output above)"


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def test_relative_links_resolve():
    broken = []
    for page in _markdown_files():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:|#|mailto:", target):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_no_tracker_numbers_in_user_text():
    found = [f"{page.relative_to(REPO)}:{n}: {m.group(0)}" for page in _markdown_files()
             for n, line in enumerate(page.read_text().splitlines(), 1) for m in TRACKER.finditer(line)]
    assert not found, "tracker numbers in user text:\n" + "\n".join(found)


def test_the_tracker_pattern_catches_what_it_must():
    # the check above would pass on any text if the pattern matched nothing
    for text in ("see issue 22", "issues 20 and 21", "fixed in #20", "(stop 31)", "deliverable D4"):
        assert TRACKER.search(text), text
    for text in ("ε = 1", "`/recommend?k=10`", "the top 10 (k = 10)", "C# code", "[link](#anchor)"):
        assert not TRACKER.search(text), text


def _mkdocs() -> list[str] | None:
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "mkdocs"]


def _build(repo: Path, site: Path) -> subprocess.CompletedProcess:
    cmd = _mkdocs()
    if cmd is None:
        pytest.skip("mkdocs is not installed: pip install -e '.[docs]' to build the docs site")
    return subprocess.run([*cmd, "build", "--strict", "--site-dir", str(site)], cwd=repo, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.mark.slow
def test_docs_build_strict(tmp_path):
    res = _build(REPO, tmp_path / "site")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "api" / "models" / "index.html").read_text().count("SketchMF") > 1


@pytest.mark.slow
def test_the_strict_build_fails_on_a_broken_link_or_anchor(tmp_path):
    # the same site with one page linking to a missing page and a missing anchor: the build must fail,
    # or the test above would pass on a site whose links are never checked
    repo = tmp_path / "repo"
    repo.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in ("docs", "mkdocs.yml", "site") and not entry.name.startswith("."):
            (repo / entry.name).symlink_to(entry)
    shutil.copytree(DOCS, repo / "docs")
    shutil.copy2(REPO / "mkdocs.yml", repo / "mkdocs.yml")
    with (repo / "docs" / "index.md").open("a") as page:
        page.write("\n[gone](no-such-page.md) and [moved](cli.md#no-such-anchor)\n")
    res = _build(repo, tmp_path / "site")
    assert res.returncode != 0
    assert "no-such-page.md" in res.stderr and "no-such-anchor" in res.stderr


def test_the_surfaces_page_holds_the_generated_table():
    from sketchrec.privacy.mode import surface_table
    page = (DOCS / "privacy" / "surfaces.md").read_text()
    begin, end = "<!-- surface_table: begin -->\n", "\n<!-- surface_table: end -->"
    assert page.count(begin) == 1 and page.count(end) == 1
    assert page.split(begin)[1].split(end)[0] == surface_table(), \
        "docs/privacy/surfaces.md: paste surface_table()'s output between its markers"

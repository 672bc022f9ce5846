"""`sketchrec bench --results PAGE` rewrites only the results page's generated block."""

from __future__ import annotations

from pathlib import Path

import pytest

from sketchrec.benchmarks.suite import RESULTS_BEGIN, RESULTS_END, main, results_block, write_results

REPO = Path(__file__).resolve().parents[2]
REPORT = "# sketchrec bench\n\nCommand: `sketchrec bench`\n\n## Learners\n\n| learner | ratings/s |\n|---|---|\n| a | 1 |\n"


def test_the_results_page_has_the_block_the_bench_writes():
    results_block((REPO / "docs" / "results.md").read_text())


def test_the_block_is_replaced_and_the_rest_of_the_page_kept(tmp_path):
    page = tmp_path / "results.md"
    before, after = "# Results\n\nhand-written\n\n", "\n\n## More\n\nalso hand-written\n"
    page.write_text(f"{before}{RESULTS_BEGIN}\nold figures\n{RESULTS_END}{after}")
    write_results(page, REPORT)
    text = page.read_text()
    assert text.startswith(before + RESULTS_BEGIN) and text.endswith(RESULTS_END + after)
    assert "old figures" not in text and "### Learners" in text and "| a | 1 |" in text
    assert "sketchrec bench\n" not in text.split(RESULTS_BEGIN)[1].splitlines()[1]   # its title dropped
    write_results(page, REPORT.replace("| a | 1 |", "| a | 2 |"))                   # again: replaced, not appended
    assert page.read_text().count("| a |") == 1 and "| a | 2 |" in page.read_text()


@pytest.mark.parametrize("text", ["# Results\n", f"{RESULTS_BEGIN}\n", f"{RESULTS_END}\n{RESULTS_BEGIN}\n",
                                  f"{RESULTS_BEGIN}\n{RESULTS_END}\n{RESULTS_BEGIN}\n{RESULTS_END}\n"])
def test_a_page_without_one_ordered_pair_of_markers_is_refused_and_left_alone(tmp_path, text):
    page = tmp_path / "results.md"
    page.write_text(text)
    with pytest.raises(ValueError):
        write_results(page, REPORT)
    assert page.read_text() == text


def test_the_command_refuses_a_page_without_markers_before_measuring(tmp_path, capsys):
    page = tmp_path / "notes.md"
    page.write_text("# Notes\n")
    with pytest.raises(SystemExit) as stop:
        main(["--results", str(page), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--results" in err and RESULTS_BEGIN in err
    assert not (tmp_path / "out").exists()   # nothing measured, nothing written

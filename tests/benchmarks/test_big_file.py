"""`sketchrec bench big-file`: its figures land in their own block of the results page, and each
process's peak memory is its own."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sketchrec.benchmarks import big_file
from sketchrec.benchmarks.suite import RESULTS_BEGIN, RESULTS_END, write_results

REPO = Path(__file__).resolve().parents[2]
REPORT = {"ratings": 1000, "string_over_int": {"replay_wall": 1.25, "replay_peak": 1.1, "parse_rate": 2.0},
          "runs": {"int": {"parse": {"wall": 1.0, "cpu": 0.9, "peak_mb": 200.0, "ratings_per_cpu_second": 5000},
                           "time": {"wall": 2.0, "cpu": 1.5, "peak_mb": 300.0, "throughput_per_s": 400.0,
                                    "sources_changed": True}}}}


def test_the_results_page_has_the_big_file_block():
    text = (REPO / "docs" / "results.md").read_text()
    assert text.count(big_file.RESULTS_BEGIN) == 1 and text.count(big_file.RESULTS_END) == 1


def test_the_big_file_block_is_written_and_the_suites_block_kept(tmp_path):
    page = tmp_path / "results.md"
    suite_block = f"{RESULTS_BEGIN}\nsuite figures\n{RESULTS_END}\n"
    page.write_text(f"# Results\n{suite_block}\n{big_file.RESULTS_BEGIN}\nold\n{big_file.RESULTS_END}\n")
    markers = {"begin": big_file.RESULTS_BEGIN, "end": big_file.RESULTS_END}
    write_results(page, "# big file\n\n" + big_file.markdown(REPORT, "sketchrec bench big-file"), **markers)
    text = page.read_text()
    assert suite_block in text and "old" not in text
    assert "| int | parse only | 1.0 | 0.9 | 200 | 5,000 |  |" in text
    assert "| int | replay (time order) (sources changed while it ran: may include compiling) | 2.0 | 1.5 | 300 |  | 400 |" in text
    assert "replay wall 1.25x" in text


def test_a_child_reports_its_own_peak_not_the_parents(tmp_path):
    # the parent holds ~760 MB: a child's wait4 rusage would report at least that (Linux keeps the
    # high-water mark of the memory the child was forked from); the child's own is far less
    ballast = np.ones(100_000_000)
    path = tmp_path / "ratings.csv"
    big_file.write(str(path), 2_000)
    result = big_file.child(["parse", str(path)], tmp_path / "log")
    assert result["ratings"] == 2_000 and result["wall"] > 0 and result["cpu"] > 0
    assert 20 < result["peak_mb"] < 500 < ballast.nbytes / 2**20

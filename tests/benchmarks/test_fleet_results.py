"""`sketchrec bench fleet --results PAGE`: the fleet's figures land in their own blocks of the results
page, each replaced whole by its command, the rest of the page kept. The measuring itself needs a
broker, member processes and minutes (a member waits seconds of idleness before it reports), so
these tests hand ``main`` a report of the shape ``measure`` returns and check what is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from sketchrec.benchmarks import fleet, fleet_results
from sketchrec.benchmarks.suite import RESULTS_BEGIN, RESULTS_END

REPO = Path(__file__).resolve().parents[2]


def report(member_cpu_us: float) -> dict:
    """A report as ``fleet.measure`` makes it: one message form, a plain learner at 2 CPU-µs per
    rating, fleets of 2 and 4 members."""
    members = {str(m): {"ratings_per_s": 1000.0 * m, "learned": 200_000, "cpu_us_per_rating": member_cpu_us * m,
                        "cpu_per_rating_ratio": member_cpu_us * m / 2.0, "delta_bytes_per_rating": 100.0 * m,
                        "ratings_per_delta": 2000.0 / m, "other_threads_share": 0.1 * m} for m in (2, 4)}
    out = {"ratings": 200_000, "sync_ratings": None,
           "batched_100": {"bare_consume_ratings_per_s": 3e6, "bare_compiled_reader_ratings_per_s": 4e6,
                           "plain_learner_ratings_per_s": 5e5, "plain_cpu_us_per_rating": 2.0, "members": members}}
    fleet._ratios(out, ["batched_100"], [2, 4])
    return out


def page_with_blocks(tmp_path: Path) -> Path:
    page = tmp_path / "results.md"
    page.write_text(f"# Results\n{RESULTS_BEGIN}\nsuite figures\n{RESULTS_END}\n"
                    f"{fleet_results.CPU_BEGIN}\nold\n{fleet_results.CPU_END}\n"
                    f"{fleet_results.ACCURACY_BEGIN}\nold accuracy\n{fleet_results.ACCURACY_END}\nkept\n")
    return page


def test_the_results_page_holds_each_fleet_block_once():
    text = (REPO / "docs" / "results.md").read_text()
    for marker in (fleet_results.CPU_BEGIN, fleet_results.CPU_END,
                   fleet_results.ACCURACY_BEGIN, fleet_results.ACCURACY_END):
        assert text.count(marker) == 1, marker


def test_the_cpu_block_is_written_then_replaced_whole(tmp_path, monkeypatch):
    page = page_with_blocks(tmp_path)
    monkeypatch.setattr(fleet, "measure", lambda args: report(4.0))
    fleet.main(["--bootstrap", "127.0.0.1:1", "--json", "--results", str(page)])
    text = page.read_text()
    assert "old\n" not in text and "suite figures" in text and "old accuracy" in text and text.endswith("kept\n")
    assert "`sketchrec bench fleet --bootstrap 127.0.0.1:1 --json --results" in text
    # M = 2 spends 8 CPU-µs per rating in all: 2 / 8e-6 = 250,000 ratings/s on two cores, 0.5× a
    # plain learner at 2 CPU-µs (500,000/s on one)
    assert "| 100 ratings per message | 2 | 2.00 | 8.00 | 4.00× | 20 % | 200 | 1,000 | 250,000 | 0.50× |" in text
    assert "| 100 ratings per message | 4 | 2.00 | 16.00 | 8.00× | 40 % | 400 | 500 | 250,000 | 0.50× |" in text
    assert '"cpu_per_rating_ratio": {"2": 4.0, "4": 8.0}' in text
    assert "the plain learner 500,000/s, 2 members 2,000/s, 4 members 4,000/s while all learned" in text

    monkeypatch.setattr(fleet, "measure", lambda args: report(1.0))   # again: replaced, not appended
    fleet.main(["--bootstrap", "127.0.0.1:1", "--json", "--results", str(page)])
    text = page.read_text()
    assert text.count(fleet_results.CPU_BEGIN) == 1 and "| 4.00× |" not in text
    assert "| 100 ratings per message | 2 | 2.00 | 2.00 | 1.00× | 20 % | 200 | 1,000 | 1,000,000 | 2.00× |" in text
    assert "suite figures" in text and "old accuracy" in text


def test_the_accuracy_block_is_its_own(tmp_path, monkeypatch):
    page = page_with_blocks(tmp_path)
    cell = {"mean": 1.005, "sd": 0.001, "min": 1.004, "max": 1.006}
    monkeypatch.setattr("sketchrec.benchmarks.fleet_accuracy.accuracy",
                        lambda *a, **k: {"mix": {"2": {"ml-100k": cell, "sparse": cell, "all": cell}}})
    monkeypatch.setattr(fleet, "data_file", lambda path: None)
    fleet.main(["--accuracy", "--json", "--results", str(page)])
    text = page.read_text()
    assert "old accuracy" not in text and "\nold\n" in text   # the CPU block is left as it was
    assert "| learner | M | ml-100k | sparse | all |" in text
    assert "| default (`mix`) | 2 | +0.50 % [+0.40, +0.60] | +0.50 % [+0.40, +0.60] | +0.50 % (sd 0.10) |" in text


def test_a_page_without_the_blocks_markers_is_refused_before_measuring(tmp_path, monkeypatch, capsys):
    page = tmp_path / "notes.md"
    page.write_text(f"# Notes\n{fleet_results.ACCURACY_BEGIN}\n{fleet_results.ACCURACY_END}\n")

    def measure(args):
        raise AssertionError("measured before the page was checked")
    monkeypatch.setattr(fleet, "measure", measure)
    with pytest.raises(SystemExit) as stop:
        fleet.main(["--bootstrap", "127.0.0.1:1", "--results", str(page)])
    assert "--results" in str(stop.value) and fleet_results.CPU_BEGIN in str(stop.value)
    assert page.read_text().startswith("# Notes\n")

"""`sketchrec bench --quick` produces a complete report (its figures are not asserted: speed is
measured by the benchmark, never by tests). Its serving part is `sketchrec bench serving`, whose
report tests/benchmarks/test_bench_serving.py checks: here it is left out (--no-serving), as a
user may."""

import json

import pytest

from sketchrec.cli import sketchrec_main

LEARNERS = {"sketch_batch", "sketch_batch_monitored", "sketch_learn_one", "dense_batch", "river_biasedmf",
            "vowpal_wabbit"}


@pytest.mark.usefixtures("ml100k")
def test_bench_quick_report_is_complete(tmp_path, capsys):
    assert sketchrec_main(["bench", "--quick", "--no-serving", "--json", "--out", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for stream in ("ml100k", "synthetic"):
        table = report["learners"][stream]
        assert LEARNERS <= set(table) and table["dim"] == 32
        for name in LEARNERS:
            assert table[name]["throughput_per_s"] > 0 and 0 < table[name]["rmse"] < 3
    for ratio in ("ratio_sketch_over_river", "ratio_sketch_over_vw", "ratio_monitor_overhead"):
        assert report[ratio] > 0
    for model in ("sketch", "dense", "river"):
        rows = report["memory"][model]
        assert [r["distinct_users"] for r in rows] == sorted(r["distinct_users"] for r in rows)
        assert all(r["rss_total_bytes"] > 0 and r["model_bytes"] > 0 for r in rows)
    assert report["physical_limit"]["cells_per_rating"] == 2 * 4 * 32
    assert report["serving"] is None   # left out
    assert report["kafka"]["csv_per_message"]["topic_to_model_ratings_per_s"] > 0
    assert {p.name for p in tmp_path.iterdir()} >= {"bench.json", "bench.md", "memory.png"}
    assert json.loads((tmp_path / "bench.json").read_text())["learners"].keys() == {"ml100k", "synthetic"}

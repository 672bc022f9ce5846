"""`sketchrec bench serving --quick --json` runs and its last line is the JSON report with the
figures while learning and without (its figures are not asserted: speed is measured by the
benchmark, never by tests)."""

import json

import pytest

from sketchrec.cli import sketchrec_main


@pytest.mark.usefixtures("ml100k")
def test_bench_serving_quick_prints_the_json_keys(capsys):
    # half-second windows: each window keeps a learner and the load client busy, and the keys and
    # the request counts are there after any window length. One serving process each: reader
    # processes' start-up would be most of the test's CPU, and readers serving while a learner
    # learns are tests/integration/test_workers.py's
    assert sketchrec_main(["bench", "serving", "--quick", "--seconds", "0.5", "--json",
                           "--client", "httpx", "--workers", "1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for run in ("learning", "baseline"):
        assert {"requests_per_s", "p99_ms", "server_cpu_us_per_request",
                "reader_cpu_us_per_request"} <= set(report[run])
        assert report[run]["requests"] > 0 and report[run]["errors"] == 0
        assert report[run]["reader_cpu_us_per_request"] is None   # served by the one process
    assert "learning_kept" in report["learning"]
    assert set(report["targets"]) == {"requests_per_s", "p99_ms", "learning_kept"}
    assert isinstance(report["met"], bool)

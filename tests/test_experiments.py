"""Experiments run in --quick mode: their files exist and their numbers are finite and in range."""

import json
import math
from pathlib import Path

import pytest

from replay.cli import sketchrec_main

ML100K = Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-100k" / "u.data"


def test_experiment_list_names_every_registered_experiment(capsys):
    assert sketchrec_main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out
    assert "b1-table" in out and "Table 4.2" in out
    assert sketchrec_main(["experiment", "no-such-thing"]) == 2


@pytest.mark.skipif(not ML100K.exists(), reason="ml-100k not in ../shared/data")
def test_b1_table_quick(tmp_path):
    assert sketchrec_main(["experiment", "b1-table", "--quick", "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"b1_table.json", "b1_table.md", "b1_table.png"}
    result = json.loads((tmp_path / "b1_table.json").read_text())
    for model in ("regular", "count_sketch_k4", "feature_hashing_k1"):
        rmse = result["rmse"][model]
        assert math.isfinite(rmse["mean"]) and 0.8 < rmse["mean"] < 1.2 and rmse["std"] >= 0
        assert len(rmse["folds"]) == result["folds"] == 1
    assert "Table 4.2" in (tmp_path / "b1_table.md").read_text()

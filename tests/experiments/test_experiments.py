"""Experiments run in --quick mode: their files exist and their numbers are finite and in range."""

import json
import math

import pytest

from sketchrec.cli import sketchrec_main


def test_experiment_list_names_every_registered_experiment(capsys):
    assert sketchrec_main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out
    assert "b1-table" in out and "Table 4.2" in out
    assert sketchrec_main(["experiment", "no-such-thing"]) == 2


@pytest.fixture(scope="module")
def ml100k_head(ml100k, tmp_path_factory):
    """The first 25,000 ratings of u.data (its lines are in no user or time order): for the
    experiments whose test checks the shape and range of their output, a quarter of the
    training work."""
    path = tmp_path_factory.mktemp("ml100k_head") / "u.data"
    with open(ml100k) as src:
        path.write_text("".join(line for _, line in zip(range(25_000), src)))
    return path


def _quick(tmp_path, name: str, data=None) -> dict:
    assert sketchrec_main(["experiment", name, "--quick", "--out", str(tmp_path),
                           *(["--data", str(data)] if data else [])]) == 0
    stem = name.replace("-", "_")
    assert {p.name for p in tmp_path.iterdir()} == {f"{stem}.json", f"{stem}.md", f"{stem}.png"}
    assert (tmp_path / f"{stem}.png").stat().st_size > 5000
    return json.loads((tmp_path / f"{stem}.json").read_text())


def _in_range(values, lo=0.5, hi=2.0) -> bool:
    return all(math.isfinite(v) and lo < v < hi for v in values)


def test_b1_table_quick(tmp_path, ml100k_head):
    result = _quick(tmp_path, "b1-table", ml100k_head)
    for model in ("regular", "count_sketch_k4", "feature_hashing_k1"):
        rmse = result["rmse"][model]
        assert math.isfinite(rmse["mean"]) and 0.8 < rmse["mean"] < 1.2 and rmse["std"] >= 0
        assert len(rmse["folds"]) == result["folds"] == 1
    assert "Table 4.2" in (tmp_path / "b1_table.md").read_text()


def test_b1_heatmap_quick(tmp_path, ml100k_head):
    result = _quick(tmp_path, "b1-heatmap", ml100k_head)
    for k in ("k1", "k4"):
        grid = result["rmse"][k]
        assert len(grid) == len(result["dims"]) and len(grid[0]) == len(result["space_gains"])
        assert _in_range([x for row in grid for x in row])


def test_b1_dynamic_quick(tmp_path, ml100k_head):
    result = _quick(tmp_path, "b1-dynamic", ml100k_head)
    for kind in ("regular", "sketch", "hashing"):
        assert _in_range(result["one_pass_test_rmse"][kind])
        curve = result["per_epoch_test_rmse"][kind]
        assert len(curve) == 3 and _in_range(curve)
    # equal memory: gamma = 32 / d_r
    assert result["space_gain"] == [32 / d for d in result["d_regular"]]


def test_b1_regularization_quick(tmp_path, ml100k_head):
    result = _quick(tmp_path, "b1-regularization", ml100k_head)
    for kind, curve in result["test_rmse_d32_gamma1"].items():
        assert len(curve) == len(result["lambdas"]) and _in_range(curve)
    grid = result["best_lambda_sketch"]
    assert all(x in grid["grid"] for row in grid["best"] for x in row)


def test_b2_privacy_quick(tmp_path, ml100k_head):
    result = _quick(tmp_path, "b2-privacy", ml100k_head)
    rows = [r for rows in result["sketch_clip"].values() for r in rows] + \
        [r for rows in result["regular_clip"].values() for r in rows] + result["dp_sgd"]
    assert _in_range([r["rmse"] for r in rows])
    assert all(math.isfinite(r["kld"]) and r["kld"] >= 0 for r in rows)
    assert 1.9 < result["dp_sgd"][0]["proven_epsilon"] <= 2.0 + 1e-6


def test_dp_sgd_quick(tmp_path, ml100k_head):
    result = _quick(tmp_path, "dp-sgd", ml100k_head)
    assert _in_range([r["rmse"] for r in result["rating_level"] + result["user_level"]])
    finite = [r for r in result["rating_level"] if math.isfinite(r["target_epsilon"])]
    assert all(r["epsilon"] <= r["target_epsilon"] + 1e-6 for r in finite)


@pytest.mark.usefixtures("ml100k")
def test_blip_attacks_quick(tmp_path):
    result = _quick(tmp_path, "blip-attacks")
    for eps, row in result["results"].items():
        for method in ("popularity", "single", "joint", "joint_popularity_prior"):
            assert 0 <= row[method]["cosine_mean"] <= 1 and 0 <= row[method]["map10"] <= 1
    assert row["flip_probability"] == 0.5  # eps = 0 is the last row


def test_qolsh_quick(tmp_path):
    result = _quick(tmp_path, "qolsh")
    for name in ("lsh", "lsh_frame", "qolsh", "optimal"):
        assert set(result[name]) >= {"mse", "entropy_bits", "us_per_vector"}
        assert 0 < result[name]["mse"] < 1 and 0 < result[name]["entropy_bits"] <= 16
    assert result["optimal"]["mse"] <= result["qolsh"]["mse"] < result["lsh_frame"]["mse"] < result["lsh"]["mse"]
    recall = result["recall_at_R"]
    assert all(0 <= v <= 1 for rec in recall.values() for v in rec.values())
    assert recall["qolsh"]["1000"] >= recall["lsh"]["1000"]


def test_retrieval_quick(tmp_path, ml100k_head):
    result = _quick(tmp_path, "retrieval", ml100k_head)
    for cat in result["catalogues"].values():
        for run in cat["runs"]:
            assert 0 <= run["recall_at_10"] <= 1 and 0 < run["scored_exactly"] <= 1
            assert run["index_us_per_query"] > 0 and run["exact_us_per_query"] > 0


def test_huber_synthetic_quick(tmp_path):
    result = _quick(tmp_path, "huber-synthetic")
    for row in result["rows"]:
        for m in ("none", "gaussian", "laplace", "huber"):
            assert math.isfinite(row[m][0]) and row[m][0] > 0
        assert row["none"][0] <= min(row[m][0] for m in ("gaussian", "laplace", "huber"))
    at_eps = [r for r in result["rows"] if r["compare_at"] == "epsilon"]
    assert all(r["laplace_epsilon"] == r["huber_epsilon"] == r["level"] for r in at_eps)


def test_blp_mog_quick(tmp_path, ml100k_head):
    result = _quick(tmp_path, "blp-mog", ml100k_head)
    for row in result["rows"] + list(result["non_private"].values()):
        assert 0.5 < row["rmse"] < 2.5 and 0 <= row["f_at_10"] <= 1
    assert {r["perturbation"] for r in result["rows"]} == {"blp", "laplace_clamp"}


@pytest.mark.usefixtures("ml100k")
def test_dp_nmf_quick(tmp_path):
    result = _quick(tmp_path, "dp-nmf")
    private = [r for r in result["rows"] if r["epsilon_t"] is not None]
    assert private and all(r["epsilon_pld"] <= r["epsilon_rdp"] + 1e-6 <= r["epsilon_theorem_3_1"] + 1e-6
                           for r in private)
    assert all(math.isfinite(r["observed_rmse_normalised"]) and math.isfinite(r["test_rmse"]) for r in result["rows"])


def test_huber_movielens_quick(tmp_path, ml100k_head):
    result = _quick(tmp_path, "huber-movielens", ml100k_head)
    values = [v for cells in result["seed_methods"].values() for v in cells.values()]
    assert _in_range(values, 0.5, 3.0) and len(values) == 5
    for r in result["dp_sgd_sketch"].values():
        assert _in_range([r["rmse"]], 0.5, 3.0) and r["proven_epsilon"] <= 8.0 + 1e-6


@pytest.mark.usefixtures("ml100k")
def test_tuning_free_quick(tmp_path):
    # the defaults are <= the damped bias baseline and within 2% of the grid's best,
    # on ML-100k, on the change-point stream and on streams where most users rate once
    result = _quick(tmp_path, "tuning-free")
    assert set(result["streams"]) == {"change-point", "ml-100k", "sparse 80% once", "sparse 95% once"}
    for stream in result["streams"].values():
        assert stream["defaults_le_bias"] and stream["defaults_within_2pct"], stream
    assert result["streams"]["ml-100k"]["defaults"] <= 0.950

"""The windowed prequential curve (replay.curve) and the synthetic stream with a change-point
(sketchrec.data.SyntheticStream) it is meant to show."""

import json

import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models import DenseMF, SketchMF
from sketchrec.cli.replay import replay_main
from sketchrec.replay.curve import WindowedErrors, plot_curves
from sketchrec.replay.protocols import prequential, rmse_on


def test_windows_partition_the_stream_and_pool_to_the_overall_rmse():
    rng = np.random.default_rng(0)
    truth, pred = rng.normal(3, 1, 1003), rng.normal(3, 1, 1003)
    w = WindowedErrors(window=100)
    for cut in np.split(np.arange(1003), [7, 7, 250, 400, 401, 999]):   # odd and empty pieces
        w.add(pred[cut], truth[cut])
    curve = w.curve()
    assert curve["n"] == [100] * 10 + [3] and curve["end"][-1] == 1003
    assert curve["end"] == list(np.cumsum(curve["n"]))
    pooled = np.sqrt(np.dot(curve["n"], np.square(curve["rmse"])) / sum(curve["n"]))
    assert pooled == pytest.approx(np.sqrt(np.mean((pred - truth) ** 2)), rel=1e-12)
    assert curve["rmse"][3] == pytest.approx(np.sqrt(np.mean((pred - truth)[300:400] ** 2)))


def test_prequential_curve_matches_its_overall_figures(tmp_path):
    stream = SyntheticStream(5000, 100, 80, seed=1)
    result = prequential(SketchMF(capacity=180, dim=8), stream.batches(700), window=450)
    curve = result["curve"]
    assert sum(curve["n"]) == result["ratings"] == 5000 and curve["window"] == 450
    pooled = np.sqrt(np.dot(curve["n"], np.square(curve["rmse"])) / 5000)
    assert pooled == pytest.approx(result["rmse"], rel=1e-12)
    plot_curves({"sketch": curve}, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_change_point_stream_is_seeded_and_keeps_the_stream_before_it():
    make = lambda seed, cp=0.5: SyntheticStream(4000, 150, 120, seed=seed, change_point=cp, taste=1.0).all()
    a, b, other, plain = make(3), make(3), make(4), make(3, None)
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("users", "items", "ratings", "timestamps"))
    assert not np.array_equal(a.ratings, other.ratings)
    assert np.array_equal(a.ratings[:2000], plain.ratings[:2000])
    assert np.array_equal(a.users, plain.users) and np.array_equal(a.items, plain.items)
    assert np.mean(a.ratings[2000:] != plain.ratings[2000:]) > 0.4   # a new truth after it


def test_a_model_trained_before_the_change_point_does_worse_after_it():
    kind = dict(n_ratings=40_000, n_users=200, n_items=200, taste=1.0, noise=0.35, seed=5)
    drifting, steady = (SyntheticStream(**kind, change_point=0.5).all(), SyntheticStream(**kind).all())
    model = DenseMF(dim=8, lr=0.05, reg=0.02, seed=0)
    before = drifting.take(slice(0, 20_000))
    for _ in range(3):
        model.learn_many(before.users, before.items, before.ratings)
    same_truth = rmse_on(model, steady.take(slice(20_000, None)))
    new_truth = rmse_on(model, drifting.take(slice(20_000, None)))
    floor = SyntheticStream(**kind, change_point=0.5).noise_floor()
    assert floor < same_truth < 0.75 < new_truth


def test_replay_reports_the_curve_topn_and_noise_floor(tmp_path, capsys):
    plot = tmp_path / "c.png"
    code = replay_main(["--synthetic-ratings", "6000", "--synthetic-users", "150", "--synthetic-items",
                        "100", "--change-point", "0.5", "--synthetic-taste", "1", "--window", "1000",
                        "--plot", str(plot), "--topn", "200", "--json", "--quiet", "--no-monitor"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["curve"]["end"] == [1000 * k for k in range(1, 7)]
    assert result["synthetic"]["change_at"] == 3000 and 0.4 < result["synthetic"]["noise_floor"] < 0.6
    top = result["topn"]
    assert 0 < top["events"] <= 200 and set(top["popularity"]) == {"recall_at_10", "ndcg_at_10"}
    assert 0 <= top["ndcg_at_10"] <= top["recall_at_10"] <= 1
    assert plot.stat().st_size > 1000

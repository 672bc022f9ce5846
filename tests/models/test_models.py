"""Behaviour of the factorization learners: sketch == dense without collisions, learning, memory,
loss clipping, SGLD noise, and the river interface."""

import numpy as np
import pytest
from river import evaluate, metrics

from sketchrec.models import DenseMF, SketchMF
from sketchrec.models.river_adapters import RankerRegressor, RiverBiasedMF
from sketchrec.replay.protocols import ErrorStats, holdout, prequential
from sketchrec.sketches import keys_of
from sketchrec.data import SyntheticStream

HUGE_WIDTH = 1 << 26  # no collisions among a few hundred ids (p ~ 1e-4 over the whole test)


def small_stream(n=3000, seed=0):
    return SyntheticStream(n_ratings=n, n_users=200, n_items=100, seed=seed).all()


def test_sketch_sgd_equals_dense_sgd_without_collisions():
    data = small_stream(600)
    kw = dict(dim=8, lr=0.05, reg=0.02, init_std=0.1, seed=3)
    sketch, dense = SketchMF(width=HUGE_WIDTH, depth=3, **kw), DenseMF(**kw)
    pred_s = sketch.learn_many(data.users, data.items, data.ratings)
    pred_d = dense.learn_many(data.users, data.items, data.ratings)
    np.testing.assert_allclose(pred_s, pred_d, rtol=0, atol=1e-5)
    users, items = data.users[::7], data.items[::5][: len(data.users[::7])]
    users = users[: len(items)]
    np.testing.assert_allclose(sketch.predict_many(users, items), dense.predict_many(users, items), atol=1e-5)
    assert sketch.n_learned == dense.n_learned == 600
    # the latent vectors themselves agree, and they moved away from their start
    np.testing.assert_allclose(sketch.user_vectors(data.users[:20]),
                               dense._tables[0].vectors[dense._rows(keys_of(data.users[:20]), 0, False)],
                               atol=1e-5)


def test_one_sketch_with_collisions_differs_from_dense():
    data = small_stream(2000)
    kw = dict(dim=8, lr=0.05, reg=0.02, seed=3)
    tight = SketchMF(width=64, depth=2, **kw).learn_many(data.users, data.items, data.ratings)
    dense = DenseMF(**kw).learn_many(data.users, data.items, data.ratings)
    assert np.abs(tight - dense).max() > 1e-3


def test_learning_reduces_error_on_low_rank_stream():
    data = small_stream(20_000)
    for model in (SketchMF(capacity=300, dim=8, lr=0.02), DenseMF(dim=8, lr=0.02)):
        result = holdout(model, data, 0.2, 10, seed=1)
        _, test = __import__("sketchrec.replay.protocols", fromlist=["split_holdout"]).split_holdout(data, 0.2, 1)
        baseline = np.sqrt(np.mean((test.ratings - data.ratings.mean()) ** 2))
        assert result["rmse"] < 0.85 * baseline, (type(model).__name__, result["rmse"], baseline)
    # prequentially, the second half of a one-pass stream is predicted better than the first
    preds = SketchMF(capacity=300, dim=8, lr=0.02).learn_many(data.users, data.items, data.ratings)
    half = len(preds) // 2
    first, second = ErrorStats(), ErrorStats()
    first.add(preds[:half], data.ratings[:half])
    second.add(preds[half:], data.ratings[half:])
    assert second.rmse < 0.95 * first.rmse


def test_sketch_memory_is_fixed_while_dense_grows():
    sketch, dense = SketchMF(width=4096, dim=8), DenseMF(dim=8)
    before = sketch.nbytes
    for seed in range(3):
        batch = SyntheticStream(n_ratings=20_000, n_users=50_000, n_items=5_000, seed=seed).all()
        sketch.learn_many(batch.users + seed * 10**6, batch.items, batch.ratings)
        dense.learn_many(batch.users + seed * 10**6, batch.items, batch.ratings)
    assert sketch.nbytes == before  # cells + filter slots + stats + counters, within the budget:
    assert before == sketch.vectors.nbytes + sketch.biases.nbytes + sketch.heavy.nbytes + 56
    assert before <= (4 * 4096 + 4 * 2048) * 4 + 56
    assert dense.nbytes > 10 * before


def test_space_gain_sets_width():
    model = SketchMF(dim=32, depth=4, space_gain=2.0, capacity=2625)
    assert model.width == int(np.ceil(2625 * 32 / (2.0 * 4)))
    assert model.biases.width == int(np.ceil(model.width * 4 / 32))  # ~ capacity / gamma


def test_loss_clipping_skips_large_losses_and_leaves_model_untouched():
    model = SketchMF(width=1 << 16, dim=4, clip_loss=0.25)
    model.learn_many([1], [1], [3.0])  # first rating: mean 0, loss 9 > 0.25 -> skipped
    assert model.n_skipped_clip == 1 and model.n_learned == 0
    assert not learned_parameters(model).any()
    unclipped = SketchMF(width=1 << 16, dim=4)
    unclipped.learn_many([1], [1], [3.0])
    assert unclipped.n_learned == 1 and learned_parameters(unclipped).any()


def learned_parameters(model: SketchMF) -> np.ndarray:
    """Everything SGD writes: sketch cells and heavy-filter slots (the ids' slots hold what
    they learned while they hold one)."""
    return np.concatenate([model.vectors.cells.ravel(), model.biases.cells.ravel(),
                           model.heavy.cells.ravel()])


def test_sgld_noise_has_the_documented_variance():
    """Each SGLD step moves a touched parameter by sqrt(lr) * N(0, tau) beyond its gradient step."""
    lr, tau, n = 0.05, 2.0, 3000
    model = SketchMF(width=1 << 24, depth=4, dim=8, lr=lr, reg=0.0, init_std=0.0,
                     sgld_temperature=tau, seed=5)
    users, items = np.arange(n), np.arange(n) + 10**6
    model.learn_many(users, items, np.zeros(n))  # with zero start vectors the gradient step is 0
    moved = model.user_vectors(users)
    assert abs(moved.mean()) < 4 * np.sqrt(lr * tau / moved.size)
    assert abs(moved.var() / (lr * tau) - 1) < 0.06
    dense = DenseMF(dim=8, lr=lr, reg=0.0, init_std=0.0, sgld_temperature=tau, seed=5)
    dense.learn_many(users, items, np.zeros(n))
    assert abs(dense._tables[0].vectors[:n].var() / (lr * tau) - 1) < 0.06


def test_predictions_are_clipped_to_the_range_seen():
    data = small_stream(2000)
    model = SketchMF(capacity=300, dim=8, lr=0.05)
    model.learn_many(data.users, data.items, data.ratings)
    pred = model.predict_many(data.users, data.items)
    assert pred.min() >= data.ratings.min() and pred.max() <= data.ratings.max()
    assert model.rating_range == (data.ratings.min(), data.ratings.max())


def test_ranker_interface_and_rank_order():
    model = SketchMF(capacity=300, dim=8, lr=0.05)
    data = small_stream(3000)
    for u, i, r in zip(data.users[:50].tolist(), data.items[:50].tolist(), data.ratings[:50].tolist()):
        model.learn_one(u, i, r)
    assert model.n_learned == 50
    candidates = list(range(1, 40))
    ranked = model.rank(7, candidates)
    scores = model.predict_many(np.full(len(ranked), 7), ranked, clip=False)
    assert sorted(ranked) == candidates and (np.diff(scores) <= 1e-12).all()
    assert isinstance(model.predict_one(7, 3), float)


def test_river_progressive_val_score_equals_our_prequential_run():
    data = small_stream(2000)
    kw = dict(capacity=300, dim=8, lr=0.03, seed=2)
    stream = ({"user": u, "item": i} for u, i in zip(data.users.tolist(), data.items.tolist()))
    metric = evaluate.progressive_val_score(zip(stream, data.ratings.tolist()),
                                            RankerRegressor(SketchMF(**kw)), metrics.RMSE())
    ours = prequential(SketchMF(**kw), data.batches(256))
    assert metric.get() == pytest.approx(ours["rmse"], rel=1e-9)


def test_river_baseline_adapter_learns():
    data = small_stream(3000)
    model = RiverBiasedMF(dim=4, lr=0.02)
    preds = model.learn_many(data.users, data.items, data.ratings)
    assert preds.shape == (3000,) and model.n_learned == 3000 and np.isfinite(preds).all()
    assert model.predict_many(data.users[:5], data.items[:5]).shape == (5,)


@pytest.mark.parametrize("kwargs", [dict(dim=0), dict(lr=0), dict(reg=-1), dict(sgld_temperature=-1),
                                    dict(clip_loss=0)])
def test_bad_hyper_parameters_are_refused(kwargs):
    with pytest.raises(ValueError):
        SketchMF(**kwargs)


def test_bad_batches_are_refused_without_touching_the_model():
    model = SketchMF(width=1024, dim=4)
    with pytest.raises(ValueError):
        model.learn_many([1, 2], [1], [3.0, 4.0])
    with pytest.raises(ValueError):
        model.learn_many([1], [1], [float("nan")])
    assert model.n_learned == 0 and not learned_parameters(model).any()


def test_score_items_equals_unclipped_predictions():
    data = small_stream(3000)
    for model in (SketchMF(capacity=300, dim=8, lr=0.05), DenseMF(dim=8, lr=0.05)):
        model.learn_many(data.users, data.items, data.ratings)
        items = np.unique(data.items)
        expected = model.predict_many(np.full(len(items), 17), items, clip=False)
        np.testing.assert_allclose(model.score_items(17, items), expected, rtol=0, atol=1e-12)


def test_a_diverging_learner_never_writes_inf_or_nan():
    data = small_stream(5000)
    for model in (SketchMF(capacity=300, dim=16, lr=2.0, reg=0.0, bias_reg=0.0),
                  DenseMF(dim=16, lr=2.0, reg=0.0, bias_reg=0.0)):
        preds = model.learn_many(data.users, data.items, data.ratings)
        assert model.n_skipped_diverged > 0  # this learning rate does blow up
        assert model.n_learned + model.n_skipped_diverged == 5000
        assert np.isfinite(model.predict_many(data.users, data.items)).all()
        cells = learned_parameters(model) if isinstance(model, SketchMF) else model._tables[0].vectors
        assert np.isfinite(cells).all()
        assert np.isfinite(preds[: 100]).all()

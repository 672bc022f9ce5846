"""The tuning-free default's parts: AdaGrad steps in sketches, the damped bias baseline, the
Hedge combination."""

import numpy as np
import pytest

from sketchrec.models._adaptive import adagrad_id_scale, adagrad_scale
from sketchrec.models.bias_baseline import BiasBaseline
from sketchrec.models.mix import Experts
from sketchrec.models.registry import MODELS
from sketchrec.models.sketch_mf import SketchMF
from sketchrec.experiments.tuning_free import change_point_stream, prequential_rmse
from sketchrec.stream.recommender import Recommender


def test_adagrad_accumulates_squared_gradients_and_shrinks_the_step():
    cells, heavy = np.zeros((2, 8), np.float32), np.zeros((0, 0), np.float32)
    addr = np.array([[1, 5], [3, 5]])            # two components, k = 2 rows
    lr, g = 0.1, np.array([2.0, -1.0])
    steps = []
    for _ in range(3):
        delta = -lr * g
        adagrad_scale(cells, heavy, -1, 0, addr, delta, lr, 1.0)
        steps.append(np.abs(delta))
    # G = n g^2 after n steps, in every row (count-min, conservative update)
    assert cells[0, 1] == cells[1, 3] == pytest.approx(12.0)
    assert cells[0, 5] == cells[1, 5] == pytest.approx(3.0)
    assert steps[0][0] == pytest.approx(0.2 / np.sqrt(5.0)) and steps[2][0] == pytest.approx(0.2 / 13 ** 0.5)
    assert (np.diff(np.array(steps), axis=0) < 0).all()
    # a heavy id's sums live in its slot's row, from the given column on
    rows = np.zeros((2, 3), np.float32)
    delta = -lr * g
    adagrad_scale(cells, rows, 1, 1, addr, delta, lr, 1.0)
    assert rows[1].tolist() == [0.0, 4.0, 1.0] and rows[0].sum() == 0


def test_adagrad_per_id_keeps_one_sum_per_id():
    cells, addr = np.zeros((2, 8), np.float32), np.array([[2], [6]])
    first, second = -0.1 * np.array([2.0, -2.0]), -0.1 * np.array([2.0, -2.0])
    adagrad_id_scale(cells, np.zeros((0, 0), np.float32), -1, 0, addr, first, 0.1, 1.0)
    adagrad_id_scale(cells, np.zeros((0, 0), np.float32), -1, 0, addr, second, 0.1, 1.0)
    assert cells[0, 2] == cells[1, 6] == pytest.approx(8.0)   # mean g^2 = 4, twice
    assert abs(first[0]) == pytest.approx(0.2 / 5 ** 0.5)       # 0.1 * 2 / sqrt(1 + 4)
    assert abs(second[0]) == pytest.approx(0.2 / 3.0)           # 0.1 * 2 / sqrt(1 + 8): smaller


@pytest.mark.parametrize("optimizer", ["adagrad", "adagrad-id"])
def test_adagrad_model_checkpoints_its_accumulators_and_refuses_dp(optimizer):
    model = SketchMF(dim=4, width=512, optimizer=optimizer, lr=0.2, heavy_slots=16)
    rng = np.random.default_rng(0)
    model.learn_many(rng.integers(0, 40, 500), rng.integers(0, 30, 500), rng.integers(1, 6, 500))
    assert model.acc.cells.sum() > 0 and model.acc.heavy.sum() > 0
    back = SketchMF.from_bytes(model.to_bytes())
    for m in (model, back):
        m.learn_many([1, 2], [3, 4], [5.0, 1.0])
    assert back.predict_many([1, 2], [3, 4]).tolist() == model.predict_many([1, 2], [3, 4]).tolist()
    with pytest.raises(ValueError, match="plain SGD"):
        SketchMF(dim=4, width=64, optimizer="adagrad", dp={"noise_multiplier": 1.0},
                 heavy_fraction=0.0)


def test_bias_baseline_is_the_damped_running_mean():
    m = BiasBaseline(width=4096, user_damping=1.0, item_damping=1.0, horizon=1e9)
    out = m.learn_many(["u1", "u2"], ["i1", "i1"], [4.0, 2.0])
    # the first rating sets mu = 4; the second: item residual 2 - 4 = -2 over 1 + 1 -> b_i = -1,
    # then the user's residual 2 - 4 + 1 = -1 over 1 + 1 -> b_u = -0.5; mu is now 3
    assert out.tolist() == [0.0, 4.0]   # nothing learned yet; then mu
    assert m.predict_many(["u2"], ["i1"], clip=False)[0] == pytest.approx(3 - 0.5 - 1)
    assert m.factors(["i1"], 1)[1][0] == pytest.approx(-1.0)
    # past the horizon a bias is a moving average: it follows a change of taste
    fast = BiasBaseline(width=4096, horizon=5)
    fast.learn_many(["a"] * 200 + ["b"] * 200, ["x"] * 400, [5.0] * 100 + [1.0] * 100 + [3.0] * 200)
    assert fast.predict_many(["a"], ["x"], clip=False)[0] < 2.0


def test_experts_move_their_weight_after_a_change_point():
    # members: a bias learner that never forgets and one that forgets fast; the stream's users
    # change taste halfway: the slow one wins before, the fast one after
    stream = change_point_stream(30_000, 100, 200, seed=3)
    members = [{"model": "BiasBaseline", "horizon": 1e9}, {"model": "BiasBaseline", "horizon": 8}]
    m = Experts(members, capacity=300)
    half, weights = 15_000, []
    for lo, hi in ((0, half), (half, half + 3_000)):
        m.learn_many(stream.users[lo:hi], stream.items[lo:hi], stream.ratings[lo:hi])
        weights.append(m.weights)
    assert weights[0][0] > 0.9 and weights[1][1] > 0.9


def test_combination_beats_the_bias_baseline_and_round_trips_through_a_checkpoint():
    stream = change_point_stream(20_000, 300, 200)
    mix, bias = Experts(capacity=500), BiasBaseline(capacity=500)
    mix_rmse, bias_rmse = prequential_rmse(mix, stream)[0], prequential_rmse(bias, stream)[0]
    assert mix_rmse < bias_rmse
    back = MODELS["Experts"].from_bytes(mix.to_bytes())
    users, items = stream.users[:50], stream.items[:50]
    assert back.predict_many(users, items).tolist() == mix.predict_many(users, items).tolist()
    assert back.score_items(5, items).tolist() == mix.score_items(5, items).tolist()
    # serving: factors give the combined score (user vectors carry the weights)
    p, bu = mix.factors([5], 0)
    q, bi = mix.factors(items, 1)
    assert np.allclose(mix.global_mean + bu[0] + bi + q @ p[0], mix.score_items(5, items))
    rec = Recommender(mix, pair_capacity=1000)
    rec.learn_many(users, items, stream.ratings[:50])
    again = Recommender.from_parts(rec.state_parts(), Experts)
    assert again.recommend(users[0], 5) == rec.recommend(users[0], 5)


def test_planned_epochs_keep_the_slice_unlearned_until_the_last_pass():
    # the holdout protocol tells the combination its passes: before the last one the members
    # never learn the validation slice (their weights follow errors on ratings they never saw),
    # in the last they learn it; a member's "epochs" settings replace its one-pass ones
    from sketchrec.models.mix import validation_slice
    from sketchrec.sketches.hashing import as_keys
    from sketchrec.replay.protocols import train_epochs
    stream = change_point_stream(2_000, 50, 40, seed=1)
    members = [{"model": "BiasBaseline"},
               {"model": "SketchMF", "lr": 0.2, "reg": 0.02, "epochs": {"reg": 0.1}}]
    mix = Experts(members, capacity=100)
    held = int(validation_slice(as_keys(stream.users), as_keys(stream.items)).sum())
    learned = []
    # through the serving recommender (replay --serve trains it): the plan reaches the model
    train_epochs(Recommender(mix, pair_capacity=1_000), stream, 3, seed=0,
                 after_epoch=lambda e, n: learned.append(mix.members_[1].n_learned))
    assert mix.members_[1].reg == 0.1 and 0 < held < 2_000
    assert learned == [2_000 - held, 2 * (2_000 - held), 3 * 2_000 - 2 * held]
    # once trained, what it learns is a stream again (served, learning live): every rating
    mix.learn_many(stream.users, stream.items, stream.ratings)
    assert mix.planned_epochs is None and mix.members_[1].n_learned == learned[-1] + 2_000

"""DP-SGD on the sketch: clipping in released-cell space, noise on every cell, the accounting that
flows from the command line, budgets, user caps, and ledgers that survive restarts."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from sketchrec.models import SketchMF
from sketchrec.models.private.dp_sgd import DPConfig
from sketchrec.privacy.accounting import PrivacyLedger
from sketchrec.cli import replay_main
from sketchrec.replay.protocols import cap_per_user, train_private_epochs
from sketchrec.stream.checkpoint import operator_parts, restore_operator_parts
from sketchrec.data import Ratings, SyntheticStream


def released(model) -> np.ndarray:
    """Everything a DP-SGD model releases, in the units its gradient is clipped in: the cells and
    the offset's parameter theta = mu * sqrt(B)."""
    theta = model.stats[1] * math.sqrt(model.dp.batch_size)
    return np.concatenate([model.vectors.cells.ravel().astype(np.float64),
                           model.biases.cells.ravel().astype(np.float64), [theta]])


def one_step_change(model, users, items, ratings) -> np.ndarray:
    before = released(model)
    model.noisy_step(users, items, ratings)
    return (released(model) - before) / model.hyper(0)[0]


@pytest.mark.parametrize("width", [4, 64, 4096])  # width 4: a rating's own cells collide
def test_one_ratings_update_is_clipped_to_C_in_released_space(width):
    for clip in (0.05, 0.5, 3.0):
        model = SketchMF(dim=8, depth=3, width=width, lr=0.5, init_std=0.5, seed=2,
                         dp=DPConfig(noise_multiplier=0.0, clip=clip, batch_size=1))
        norms = []
        for n in range(30):
            change = one_step_change(model, [f"u{n % 5}"], [f"i{n % 7}"], [5.0 if n % 2 else 0.5])
            norms.append(np.linalg.norm(change))
        assert max(norms) <= clip * (1 + 1e-5)  # float32 cells round the last digits
        assert max(norms) >= clip * 0.99 or clip == 3.0  # large errors do reach the bound


def test_removing_one_rating_moves_a_steps_sum_by_at_most_C():
    data = SyntheticStream(400, 50, 40, seed=3)
    batch = next(iter(data.batches(400)))
    sums, id_keys = [], None
    for keep in (slice(None), slice(1, None)):  # neighbouring batches: with and without rating 0
        model = SketchMF(dim=8, depth=4, width=256, lr=0.1, seed=4,
                         dp=DPConfig(noise_multiplier=0.0, clip=1.0, batch_size=400))
        id_keys = id_keys or model.id_keys   # one operator: one secret id key for both
        model.id_keys = id_keys
        sums.append(one_step_change(model, batch.users[keep], batch.items[keep], batch.ratings[keep]))
    assert np.linalg.norm(sums[0] - sums[1]) <= 1.0 + 1e-4


def test_noise_reaches_every_cell_with_the_calibrated_distribution():
    sigma, clip, lr = 1.7, 0.8, 0.05
    model = SketchMF(dim=8, depth=4, width=2048, lr=lr, seed=5,
                     dp=DPConfig(noise_multiplier=sigma, clip=clip, batch_size=10))
    cells_before = model.vectors.cells.copy()
    model.noisy_step(["a"], ["b"], [4.0])
    moved = (model.vectors.cells - cells_before).astype(np.float64) / lr
    assert np.count_nonzero(moved) == moved.size  # untouched cells move too
    # all but the rating's own 2 * d * k cells are pure noise N(0, (sigma C)^2): those are left
    # out, so the test's false alarms are exactly its level, 1e-4 (it failed once at 1e-3 with
    # the gradient cells in)
    from sketchrec.models.storage import ITEM, USER
    from sketchrec.sketches.count_sketch import locate
    from sketchrec.sketches.hashing import as_keys
    gradient = np.zeros(moved.shape, dtype=bool)
    for family, key in ((USER, as_keys(["a"])[0]), (ITEM, as_keys(["b"])[0])):
        salts = model.store.salts[family]
        addr, sign = np.empty(salts.shape, dtype=np.int64), np.empty(salts.shape)
        locate(salts, key, moved.shape[1], addr, sign)
        for row in range(addr.shape[0]):
            gradient[row, addr[row]] = True
    assert 0 < gradient.sum() <= 2 * 8 * 4
    p = stats.kstest(moved[~gradient], "norm", args=(0.0, sigma * clip)).pvalue
    assert p > 1e-4
    # the check has power: on its 8,128 draws, noise 25% too wide or narrow is rejected (KS
    # distance ~0.053 against 0.025 at the level: five standard errors)
    for wrong in (1.25, 1 / 1.25):
        assert stats.kstest(moved[~gradient], "norm", args=(0.0, wrong * sigma * clip)).pvalue < 1e-4


def test_a_restored_checkpoint_never_replays_noise_unless_debug_seeded():
    cfg = DPConfig(noise_multiplier=1.0, clip=1.0, batch_size=5)
    a = SketchMF(dim=4, width=512, seed=6, dp=cfg)
    a.noisy_step(["u"], ["i"], [3.0])
    restored = SketchMF.from_bytes(a.to_bytes())
    assert restored.dp == cfg and restored.dp_steps[0] == 1
    assert np.array_equal(a.vectors.cells, restored.vectors.cells)
    a.noisy_step(["u"], ["i"], [3.0])
    restored.noisy_step(["u"], ["i"], [3.0])
    # same state, same step index, same batch: fresh entropy, so different noise (defect D2)
    assert not np.allclose(a.vectors.cells, restored.vectors.cells)
    debug = DPConfig(noise_multiplier=1.0, clip=1.0, batch_size=5, debug_noise_seed=6)
    b = SketchMF(dim=4, width=512, seed=6, dp=debug)
    b.noisy_step(["u"], ["i"], [3.0])
    again = SketchMF.from_bytes(b.to_bytes())
    b.noisy_step(["u"], ["i"], [3.0])
    again.noisy_step(["u"], ["i"], [3.0])
    assert np.array_equal(b.vectors.cells, again.vectors.cells)  # debug: reproducible


def test_stream_mode_caps_each_user_exactly():
    model = SketchMF(dim=4, width=512, seed=7,
                     dp=DPConfig(noise_multiplier=0.5, batch_size=4, unit="user", user_cap=3))
    users = ["heavy"] * 10 + ["light"] * 2
    preds = model.learn_many(users, [f"i{n}" for n in range(12)], np.full(12, 4.0))
    assert model.n_learned == 5 and np.isfinite(preds).all()
    assert model.user_counts[next(iter(model.user_counts))] in (2, 3)
    again = SketchMF.from_bytes(model.to_bytes())
    assert again.user_counts == {}  # exact cap counts are operator state, not in the model bytes
    restore_operator_parts(again, operator_parts(model))   # the cap counts and the id key
    assert sorted(again.user_counts.values()) == [2, 3]
    again.learn_many(["heavy"], ["x"], [1.0])
    assert again.n_learned == 5  # the cap survives a checkpoint


def test_cap_per_user_keeps_the_first_m_of_each_user():
    data = Ratings(np.array([1, 1, 2, 1, 2, 1]), np.arange(6), np.arange(6, dtype=float),
                   np.arange(6))
    capped = cap_per_user(data, 2)
    assert capped.items.tolist() == [0, 1, 2, 4]


def test_epoch_training_records_every_step_and_stops_at_the_budget():
    data = Ratings.concat(list(SyntheticStream(3000, 100, 60, seed=8).batches(3000)))
    model = SketchMF(dim=4, width=512, seed=9, dp=DPConfig(noise_multiplier=1.0, batch_size=300))
    ledger = PrivacyLedger("rating", 1e-5)
    full = train_private_epochs(model, data, epochs=2, seed=1, ledger=ledger)
    # the steps, and before them the training size's noised release the plan reads
    assert full["steps"] == 20 and ledger.n_releases == 21 and not full["stopped_by_budget"]
    budget = ledger.epsilon() * 0.6
    model2 = SketchMF(dim=4, width=512, seed=9, dp=DPConfig(noise_multiplier=1.0, batch_size=300))
    ledger2 = PrivacyLedger("rating", 1e-5)
    part = train_private_epochs(model2, data, epochs=2, seed=1, ledger=ledger2, budget=budget)
    assert part["stopped_by_budget"] and 0 < part["steps"] < 20
    assert ledger2.epsilon() <= budget
    assert ledger2.epsilon_if(1.0, part["sampling_rate"], 1) > budget
    target = train_private_epochs(
        SketchMF(dim=4, width=512, seed=9, dp=DPConfig(noise_multiplier=0.0, batch_size=300)),
        data, epochs=2, seed=1, ledger=(ledger3 := PrivacyLedger("rating", 1e-5)), target_epsilon=2.0)
    assert target["steps"] == 20 and 1.98 <= ledger3.epsilon() <= 2.0 + 1e-6


def _replay_json(capsys, *argv) -> dict:
    assert replay_main(list(argv)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_replay_reports_the_proven_epsilon_of_the_run(capsys):
    common = ["--synthetic-ratings", "20000", "--synthetic-users", "300", "--synthetic-items", "200",
              "--quiet", "--json"]
    out = _replay_json(capsys, "--holdout", "0.2", "--epochs", "3", "--dp-epsilon", "2",
                       "--dp-batch", "500", *common)
    priv = out["privacy"]
    assert priv["mode"] == "dp-sgd" and priv["proven_bound"] is True
    assert priv["privacy_unit"] == "add/remove rating" and priv["delta"] == 1e-5
    assert priv["unit"] == "rating" and priv["neighbouring"] == "add/remove"
    assert 1.98 <= priv["epsilon"] <= 2.0 + 1e-6 and math.isfinite(out["rmse"])
    stream = _replay_json(capsys, "--dp-epsilon", "1", "--dp-unit", "user", "--dp-user-cap", "20",
                          *common)
    assert stream["privacy"]["privacy_unit"] == "replace-one user (stream length public)"
    assert "replaced by another (the stream's length is public)" in stream["privacy"]["guarantee"]
    assert 0.98 <= stream["privacy"]["epsilon"] <= 1.0 + 1e-6
    budget = _replay_json(capsys, "--holdout", "0.2", "--epochs", "3", "--dp-noise", "0.8",
                          "--budget-epsilon", "0.5", *common)
    assert budget["privacy"]["epsilon"] <= 0.5 and budget["operator"]["dp_training"]["stopped_by_budget"]
    loss_clip = _replay_json(capsys, "--clip-loss", "4", *common)
    assert loss_clip["privacy"]["proven_bound"] is False
    assert "heuristic" in loss_clip["privacy"]["guarantee"]


def test_a_restart_never_resets_the_ledger(tmp_path):
    from sketchrec.stream.checkpoint import CheckpointStore
    from sketchrec.stream.recommender import Recommender
    from sketchrec.stream.service import LearningService
    model = SketchMF(dim=4, width=512, seed=10, dp=DPConfig(noise_multiplier=3.0, batch_size=50))
    service = LearningService(Recommender(model, pair_capacity=1000), CheckpointStore(tmp_path))
    assert service.begin_private_pass("rating", 1e-5, budget=None)
    service.recommender.learn_many(["a", "b"], ["x", "y"], [3.0, 4.0])
    first = service.privacy()["epsilon"]
    service.checkpoint()
    resumed = LearningService.from_checkpoint(tmp_path, {"SketchMF": SketchMF})
    assert resumed.privacy()["epsilon"] == pytest.approx(first)
    assert resumed.begin_private_pass("rating", 1e-5, budget=None)  # replayed offsets: counted again
    assert resumed.privacy()["epsilon"] > first
    assert not resumed.begin_private_pass("rating", 1e-5, budget=resumed.privacy()["epsilon"])
    assert resumed.privacy()["budget_exhausted"] is True


def test_dp_config_refuses_bad_settings():
    with pytest.raises(ValueError):
        DPConfig(noise_multiplier=1.0, unit="user")  # no cap
    with pytest.raises(ValueError):
        DPConfig(noise_multiplier=-1.0)
    with pytest.raises(ValueError):
        SketchMF(dp=DPConfig(noise_multiplier=1.0), clip_loss=2.0)
    with pytest.raises(ValueError):
        SketchMF().noisy_step(["u"], ["i"], [1.0])


def test_sgld_with_clipped_gradients_is_accounted_as_a_gaussian_mechanism(capsys):
    out = _replay_json(capsys, "--holdout", "0.2", "--epochs", "2", "--sgld-dp", "0.0004", "--lr", "0.01",
                       "--depth", "4", "--dp-clip", "2", "--synthetic-ratings", "10000",
                       "--synthetic-users", "200", "--synthetic-items", "100", "--quiet", "--json")
    priv = out["privacy"]
    assert priv["mode"] == "sgld-dp" and priv["proven_bound"] is True
    # per-cell Langevin noise sqrt(k lr tau) = lr * sigma * C  =>  sigma = sqrt(k tau / lr) / C
    assert priv["dp"]["noise_multiplier"] == pytest.approx(math.sqrt(4 * 0.0004 / 0.01) / 2)
    assert math.isfinite(priv["epsilon"]) and priv["epsilon"] > 0

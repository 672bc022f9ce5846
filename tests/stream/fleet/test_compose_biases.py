"""Composed item biases (stream.fleet.compose_biases): a sketch replica scales its own change of each
item's bias at a take, held items in their slot rows and the others in their bias cells, and keeps
what it publishes, so every replica still holds the deltas published."""

import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models import SketchMF
from sketchrec.models.base import ITEM
from sketchrec.stream.fleet.compose import share
from sketchrec.stream.fleet.deltas import ModelReplica
from sketchrec.stream.fleet.tracker import DeltaTracker
from sketchrec.stream.recommender import Recommender

DATA = SyntheticStream(12_000, n_users=400, n_items=60, seed=3).all()
ITEMS = np.arange(int(DATA.items.max()) + 1)


@pytest.mark.parametrize("heavy_slots", [0, 4096])
def test_an_items_bias_change_is_scaled_by_its_share(heavy_slots):
    """Each item's bias change since the last take shrinks by f(M k) / (M f(k)): held items in
    their slot rows (exactly), the others in their bias cells (a wide sketch: few cells shared)."""
    rec = Recommender(SketchMF(dim=8, width=1 << 16, heavy_slots=heavy_slots, seed=0), pair_capacity=50_000)
    model, tracker = rec.model, DeltaTracker(rec)
    tracker.fleet_size(4)

    def learn(rows):
        rec.learn_many(DATA.users[rows], DATA.items[rows], DATA.ratings[rows])
        return model.factors(ITEMS, ITEM)[1]
    learn(slice(0, 2000))
    tracker.take()
    before = model.factors(ITEMS, ITEM)[1]
    learned = learn(slice(2000, 2600))
    tracker.take()
    ratio = (model.factors(ITEMS, ITEM)[1] - before) / np.where(learned == before, 1, learned - before)
    k = np.bincount(DATA.items[2000:2600], minlength=len(ITEMS)).astype(float)
    s = share(k, np.full(len(ITEMS), model.lr * (1 + model.bias_reg)), 4)
    moved = (k > 0) & (np.abs(learned - before) > 1e-4)
    held = tracker._model.slots.locate(model.id_keys.as_keys(ITEMS), np.full(len(ITEMS), ITEM, np.uint8)) \
        if heavy_slots else np.full(len(ITEMS), -1)
    assert moved.sum() > 40 and (np.all(held[moved] >= 0) if heavy_slots else np.all(held < 0))
    close = np.isclose(ratio[moved], s[moved], rtol=1e-3)
    assert close.all() if heavy_slots else close.mean() > 0.8, (ratio[moved], s[moved])
    assert np.all(s[moved] < 0.96)   # the check above is not one of a ratio of about 1


def test_replicas_hold_what_the_members_published():
    """Three sketch members composed, and two readers that only apply, in the same order: the
    readers hold the same state bit for bit, and every replica predicts what they do; the scale
    is kept by the member that published it."""
    recs = [Recommender(SketchMF(dim=8, capacity=500, seed=1), pair_capacity=50_000) for _ in range(5)]
    trackers = [DeltaTracker(rec, member=f"m{k}") for k, rec in enumerate(recs)]
    for tracker in trackers[:3]:
        tracker.fleet_size(3)
    parts = [np.flatnonzero(DATA.users % 3 == k) for k in range(3)]
    for start in range(0, max(map(len, parts)), 800):
        blobs = []
        for k in range(3):
            rows = parts[k][start:start + 800]
            recs[k].learn_many(DATA.users[rows], DATA.items[rows], DATA.ratings[rows])
            blobs.append((k, trackers[k].take()))
        for k, tracker in enumerate(trackers):
            for j, blob in blobs:
                if j != k and blob is not None:
                    tracker.apply(blob)
    for tracker in trackers:
        tracker.settle()
    assert trackers[3].state_digest() == trackers[4].state_digest()
    q = np.random.default_rng(3).integers(0, 400, 300), np.random.default_rng(4).integers(0, len(ITEMS), 300)
    predictions = np.array([r.model.predict_many(*q) for r in recs])
    np.testing.assert_allclose(predictions, np.broadcast_to(predictions[-1], predictions.shape), atol=1e-5)


def test_a_noisy_step_rule_is_never_composed():
    """A scale set from raw per-item counts is no post-processing of noised steps, and it would
    shrink SGLD's Langevin noise with the gradient: a DP-SGD or SGLD replica ignores the fleet's
    size, and its take publishes its learning unscaled."""
    from sketchrec.models.private.dp_sgd import DPConfig
    model = SketchMF(dim=8, capacity=500, seed=0,
                     dp=DPConfig(noise_multiplier=1.0, clip=1.0, batch_size=100, rating_range=(0.5, 5.0)))
    replica = ModelReplica(model)
    replica.fleet_size(4)
    assert replica.biases.members == 1
    sgld = ModelReplica(SketchMF(dim=8, capacity=500, seed=0, sgld_temperature=1.0))
    sgld.fleet_size(4)
    assert sgld.biases.members == 1
    plain = ModelReplica(SketchMF(dim=8, capacity=500, seed=0))
    plain.fleet_size(4)
    assert plain.biases.members == 4   # the broken variant's number, on a model without DP

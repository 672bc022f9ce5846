"""Replicas of every model kind that runs in a fleet, walked from ``state_arrays()``: what one
replica learns reaches the others as deltas, the default learner's loss sums merge exactly, and
a kind whose state does not add is refused in one line."""

import numpy as np
import pytest

from sketchrec.data import SyntheticStream
from sketchrec.models.base import MERGES, FactorizationModel
from sketchrec.models.bias_baseline import BiasBaseline
from sketchrec.models.dense_mf import DenseMF
from sketchrec.models.mix import Experts
from sketchrec.models.sketch_mf import SketchMF
from sketchrec.stream.fleet.array_replica import ArrayReplica
from sketchrec.stream.fleet.model_replicas import MixReplica, replica_for

DATA = SyntheticStream(n_ratings=8000, n_users=300, n_items=120, seed=4).all()
KINDS = {"mix": lambda: Experts(capacity=500, seed=3), "sketch": lambda: SketchMF(dim=8, capacity=500, seed=3),
         "bias": lambda: BiasBaseline(capacity=500, seed=3), "dense": lambda: DenseMF(dim=8, seed=3)}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_state_arrays_are_the_live_arrays_with_a_known_rule(kind):
    model = KINDS[kind]()
    before = {name: state.array.copy() for name, state in model.state_arrays().items()}
    model.learn_many(DATA.users[:200], DATA.items[:200], DATA.ratings[:200])
    states = model.state_arrays()
    assert all(state.merge in MERGES for state in states.values())
    assert isinstance(model, FactorizationModel) and states["counters"].array[0] == 200
    moved = [name for name, state in states.items() if name in before
             and (state.array.shape != before[name].shape or not np.array_equal(state.array, before[name]))]
    assert "counters" in moved and "stats" in moved   # learning wrote the arrays handed out


def _fleet(make, members: int, chunk: int, replica=replica_for):
    """``members`` replicas learning the stream's users split by id, exchanging deltas every
    ``chunk`` ratings each, and a read-only replica that applies everything; the models."""
    models = [make() for _ in range(members + 1)]
    replicas = [replica(m) for m in models]
    part = DATA.users % members
    for at in range(0, len(DATA), chunk * members):
        deltas = []
        for j in range(members):
            idx = np.flatnonzero(part[at:at + chunk * members] == j) + at
            models[j].learn_many(DATA.users[idx], DATA.items[idx], DATA.ratings[idx])
            deltas.append(replicas[j].take())
        for j, delta in enumerate(deltas):
            for k, r in enumerate(replicas):
                if k != j and delta:
                    r.apply(delta)
    return models


@pytest.mark.parametrize("kind", ["mix", "bias", "sketch"])
def test_every_replica_holds_what_the_fleet_learned(kind):
    models = _fleet(KINDS[kind], 2, 500)
    predictions = [m.predict_many(DATA.users[:500], DATA.items[:500]) for m in models]
    assert [m.n_learned for m in models] == [len(DATA)] * 3
    for p in predictions[:-1]:
        np.testing.assert_allclose(p, predictions[-1], atol=1e-5)
    if kind == "mix":
        np.testing.assert_allclose(models[0].weights, models[-1].weights, atol=1e-9)


class _AddedLosses(MixReplica):
    """Broken on purpose: the loss sums merged as plain additive deltas."""

    def __init__(self, model):
        super().__init__(model)
        self.losses = _Plain(model)


class _Plain:
    def __init__(self, model):
        self.model, self.base = model, model.losses.copy()

    def take(self):
        change, self.base = self.model.losses - self.base, self.model.losses.copy()
        return {"loss_sums": change} if change.any() else {}

    def check(self, delta):
        return (delta.get("loss_sums"),)

    def absorb(self):
        pass

    def add(self, change):
        if change is not None:
            self.model.losses += change
            self.base += change


def test_the_loss_sums_stay_a_discounted_sum_with_four_members():
    one = Experts(capacity=500, seed=3)
    one.learn_many(DATA.users, DATA.items, DATA.ratings)
    exact = _fleet(KINDS["mix"], 4, 400)
    broken = _fleet(KINDS["mix"], 4, 400, replica=_AddedLosses)
    # each member's decay of the shared sums, added up, overshoots: a factor 4f^n - 3 per round
    assert np.all(np.abs(broken[-1].losses) > 3 * one.losses)
    # kept once per rating, aged by the fleet's count (a member's own ratings of a round are aged
    # by the others' too: smaller than one learner's, never larger), the same on every replica
    assert np.all((exact[-1].losses > 0) & (exact[-1].losses <= one.losses))
    np.testing.assert_allclose(exact[0].losses, exact[-1].losses, rtol=1e-9)


def test_a_kind_whose_rows_grow_is_refused_in_one_line():
    with pytest.raises(TypeError, match="DenseMF's users_keys is rows per id") as refused:
        replica_for(DenseMF(dim=4))
    assert "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="does not fit"):   # a delta of another shape
        ArrayReplica(BiasBaseline(capacity=500).state_arrays()).apply(
            {"biases.d": np.zeros(3, np.float32)})

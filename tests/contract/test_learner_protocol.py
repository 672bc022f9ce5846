"""The contract every learner keeps, run over every learner through its public interface only.

- river's ``reco.base.Ranker``: ``learn_one`` / ``predict_one`` / ``rank``, and the
  ``RankerRegressor`` view that ``river.evaluate`` drives gives the same errors;
- the batch path is the one-by-one path: ``learn_many`` returns what ``predict_one`` says just
  before each ``learn_one``, and ends in the same model;
- a checkpoint (``to_bytes`` / ``from_bytes``) restores a model that predicts, ranks and keeps
  learning exactly as the original;
- memory: a ``SketchMF`` costs the same bytes however many new ids arrive; a ``DenseMF`` grows.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from river import evaluate, metrics
from river.reco.base import Ranker as RiverRanker

from sketchrec.data import SyntheticStream
from sketchrec.models import DenseMF, SketchMF
from sketchrec.models.bias_baseline import BiasBaseline
from sketchrec.models.mix import Experts
from sketchrec.models.ranker import Ranker
from sketchrec.models.river_adapters import RankerRegressor, RiverBiasedMF

KW = dict(dim=8, lr=0.05, seed=3)


@dataclass(frozen=True)
class Learner:
    name: str
    make: Callable[[], object]
    ranker: bool = True        # river's Ranker interface (learn_one, predict_one, rank)
    checkpoint: bool = True    # to_bytes / from_bytes
    fixed_memory: bool | None = None  # nbytes: True fixed, False grows with the ids seen


LEARNERS = [
    # narrow on purpose: collisions in the sketch and exchanges in the heavy filter both happen
    Learner("SketchMF-heavy-filter", lambda: SketchMF(width=256, depth=4, **KW), fixed_memory=True),
    Learner("SketchMF-pure-sketch", lambda: SketchMF(width=256, depth=4, heavy_fraction=0.0, **KW),
            fixed_memory=True),
    Learner("DenseMF", lambda: DenseMF(**KW), fixed_memory=False),
    Learner("RiverBiasedMF", lambda: RiverBiasedMF(dim=8, lr=0.05, seed=3), ranker=False, checkpoint=False,
            fixed_memory=False),
    # AdaGrad steps, the bias baseline, the default combination of learners
    Learner("SketchMF-adagrad-id", lambda: SketchMF(width=256, depth=4, optimizer="adagrad-id", **KW),
            fixed_memory=True),
    Learner("BiasBaseline", lambda: BiasBaseline(width=64, seed=3), fixed_memory=True),
    Learner("Experts", lambda: Experts(capacity=64, seed=3), fixed_memory=True),
]


def learners(**want) -> list:
    chosen = [c for c in LEARNERS if all(getattr(c, k) == v for k, v in want.items())]
    return [pytest.param(c, id=c.name) for c in chosen]


# ids of both kinds, from small pools so that ids come back; ratings on MovieLens' half-star scale
user_ids = st.one_of(st.integers(0, 25), st.sampled_from(["ann", "bob", "cy"]))
item_ids = st.one_of(st.integers(0, 15), st.sampled_from(["m-1", "m-2"]))
ratings = st.tuples(user_ids, item_ids, st.sampled_from([x / 2 for x in range(2, 11)]))
streams = st.lists(ratings, min_size=1, max_size=120)


def columns(stream):
    users, items, r = zip(*stream)
    return np.array(users, dtype=object), np.array(items, dtype=object), np.array(r, dtype=np.float64)


def synthetic(n=1500, seed=0, users=150, items=60):
    data = SyntheticStream(n_ratings=n, n_users=users, n_items=items, seed=seed).all()
    return data.users, data.items, data.ratings


def all_pairs(users, items):
    """Every (user, item) pair of the ids given, plus an unseen user and item."""
    us = list(dict.fromkeys(users.tolist())) + ["never-seen"]
    it = list(dict.fromkeys(items.tolist())) + ["never-seen"]
    return (np.array([u for u in us for _ in it], dtype=object),
            np.array([i for _ in us for i in it], dtype=object))


# --- river's Ranker interface ----------------------------------------------------------------------

@pytest.mark.parametrize("case", learners(ranker=True))
def test_river_ranker_interface(case):
    model = case.make()
    assert isinstance(model, Ranker)
    # river drives a ranker by its verbs' names (duck typing): each of river's, same parameters
    for verb in ("learn_one", "predict_one", "rank"):
        assert list(inspect.signature(getattr(model, verb)).parameters) == \
            list(inspect.signature(getattr(RiverRanker, verb)).parameters)[1:], verb
    users, items, r = synthetic(600)
    for u, i, y in zip(users.tolist(), items.tolist(), r.tolist()):
        assert model.learn_one(u, i, y) is None
    lo, hi = r.min(), r.max()
    prediction = model.predict_one(users[0], items[0])
    assert isinstance(prediction, float) and lo <= prediction <= hi  # clipped to the range seen
    catalogue = list(dict.fromkeys(items.tolist()))[:30] + ["never-seen"]
    ranked = model.rank(users[0], catalogue)
    assert sorted(ranked, key=str) == sorted(catalogue, key=str)  # a permutation of the items
    scores = model.predict_many(np.full(len(ranked), users[0]), np.array(ranked, dtype=object), clip=False)
    assert (np.diff(scores) <= 0).all()  # best first, by unclipped score
    assert model.rank(users[0], []) == []


@pytest.mark.parametrize("case", learners(ranker=True))
def test_river_evaluate_sees_the_errors_of_the_batch_path(case):
    users, items, r = synthetic(800, seed=2)
    batch = case.make().learn_many(users, items, r)
    dataset = ({"user": u, "item": i} for u, i in zip(users.tolist(), items.tolist()))
    rmse = evaluate.progressive_val_score(zip(dataset, r.tolist()), RankerRegressor(case.make()),
                                          metrics.RMSE())
    assert rmse.get() == pytest.approx(float(np.sqrt(np.mean((batch - r) ** 2))), rel=1e-9)


# --- batch path == one-by-one path -----------------------------------------------------------------

@pytest.mark.parametrize("case", learners(ranker=True))
@settings(max_examples=25, deadline=None)
@given(stream=streams)
def test_learn_many_is_predict_one_then_learn_one(case, stream):
    users, items, r = columns(stream)
    batch, single = case.make(), case.make()
    predicted = batch.learn_many(users, items, r)
    one_by_one = []
    for u, i, y in stream:
        one_by_one.append(single.predict_one(u, i))
        single.learn_one(u, i, y)
    # the same sums in a different order (and a float64 start vector for an id not yet stored by
    # DenseMF) leave differences far below any rating's precision
    np.testing.assert_allclose(predicted, one_by_one, rtol=0, atol=1e-8)
    pairs = all_pairs(users, items)
    assert np.array_equal(batch.predict_many(*pairs), single.predict_many(*pairs))  # the same model
    assert batch.predict_many(*pairs).tolist() == [single.predict_one(u, i) for u, i in zip(*pairs)]


@pytest.mark.parametrize("case", learners())
@settings(max_examples=15, deadline=None)
@given(stream=streams, cuts=st.lists(st.integers(0, 120), max_size=4))
def test_learn_many_in_chunks_is_learn_many_at_once(case, stream, cuts):
    users, items, r = columns(stream)
    whole, chunked = case.make(), case.make()
    at_once = whole.learn_many(users, items, r)
    bounds = [0, *sorted(c for c in cuts if c < len(r)), len(r)]
    in_chunks = np.concatenate([chunked.learn_many(users[a:b], items[a:b], r[a:b])
                                for a, b in zip(bounds, bounds[1:])])
    assert np.array_equal(at_once, in_chunks)
    pairs = all_pairs(users, items)
    assert np.array_equal(whole.predict_many(*pairs), chunked.predict_many(*pairs))


# --- checkpoints -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", learners(checkpoint=True))
@settings(max_examples=20, deadline=None)
@given(stream=streams, later=streams)
def test_restored_model_predicts_and_keeps_learning_identically(case, stream, later):
    model = case.make()
    model.learn_many(*columns(stream))
    blob = model.to_bytes()
    restored = type(model).from_bytes(blob)
    assert restored.to_bytes() == blob
    pairs = all_pairs(*columns(stream + later)[:2])
    assert np.array_equal(restored.predict_many(*pairs), model.predict_many(*pairs))
    assert np.array_equal(restored.predict_many(*pairs, clip=False), model.predict_many(*pairs, clip=False))
    catalogue = pairs[1][: len(set(pairs[1].tolist()))].tolist()
    assert restored.rank(stream[0][0], catalogue) == model.rank(stream[0][0], catalogue)
    assert np.array_equal(restored.learn_many(*columns(later)), model.learn_many(*columns(later)))
    assert restored.to_bytes() == model.to_bytes()
    assert np.array_equal(restored.predict_many(*pairs), model.predict_many(*pairs))


def test_checkpoint_of_one_learner_is_refused_by_another():
    blob = SketchMF(width=64, **KW).to_bytes()
    with pytest.raises(ValueError):
        DenseMF.from_bytes(blob)


# --- memory ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", learners(fixed_memory=True))
def test_sketch_memory_is_fixed_as_new_ids_arrive(case):
    model = case.make()
    empty, blob = model.nbytes, len(model.to_bytes())
    for seed in range(3):  # each round brings ids never seen before
        users, items, r = synthetic(1000, seed=seed, users=300, items=100)
        model.learn_many(users + 1000 * seed, items + 1000 * seed, r)
        assert model.nbytes == empty and len(model.to_bytes()) == blob


@pytest.mark.parametrize("case", learners(fixed_memory=False))
def test_unbounded_learners_grow_with_new_ids(case):
    model = case.make()
    sizes = [model.nbytes]
    for seed in range(3):
        users, items, r = synthetic(1000, seed=seed, users=300, items=100)
        model.learn_many(users + 1000 * seed, items + 1000 * seed, r)
        sizes.append(model.nbytes)
    assert sizes == sorted(sizes) and sizes[-1] > sizes[1] > sizes[0]


def test_the_heavy_filter_changes_what_the_sketch_learns():
    # the two SketchMF cases above are two learners, not one under two names
    users, items, r = synthetic(1500)
    with_filter, pure = (case.make().learn_many(users, items, r) for case in LEARNERS[:2])
    assert np.abs(with_filter - pure).max() > 1e-3

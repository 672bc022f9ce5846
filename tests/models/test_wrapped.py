"""The one learner wrapper (monitor + prediction map) and the serving recommender built on it."""

import numpy as np

from sketchrec.data import SyntheticStream
from sketchrec.models import SketchMF
from sketchrec.models.wrapped import Wrapped
from sketchrec.privacy.audit import Canaries, real_rows
from sketchrec.stream.recommender import Recommender


class Recorder:
    """A stand-in monitor that keeps what it was shown."""

    def __init__(self):
        self.seen = []

    def observe(self, model, ukeys, ikeys, ratings, predictions):
        self.seen.append((model, len(ukeys), ratings.copy(), predictions.copy()))


def small_data(n=3000, seed=3):
    return SyntheticStream(n_ratings=n, n_users=80, n_items=60, seed=seed).all()


def test_wrapped_learns_exactly_as_the_bare_model_and_feeds_its_monitor():
    data = small_data()
    bare, inner, monitor = SketchMF(capacity=200, dim=8), SketchMF(capacity=200, dim=8), Recorder()
    wrapped = Wrapped(inner, monitor)
    for batch in data.batches(1000):
        expected = bare.learn_many(batch.users, batch.items, batch.ratings)
        np.testing.assert_array_equal(wrapped.learn_many(batch.users, batch.items, batch.ratings),
                                      expected)
    assert [n for _, n, _, _ in monitor.seen] == [1000, 1000, 1000]
    assert all(model is inner for model, *_ in monitor.seen)
    assert wrapped.n_learned == len(data) and wrapped.dim == 8   # everything else is the model's


def test_every_prediction_and_the_ranker_verbs_go_through_the_map():
    data = small_data()
    model = SketchMF(capacity=200, dim=8)
    model.learn_many(data.users, data.items, data.ratings)
    flipped = Wrapped(model, predict_map=lambda p: 10.0 - p)
    user, items = data.users[0], list(np.unique(data.items)[:20])
    np.testing.assert_array_equal(flipped.predict_many(data.users, data.items),
                                  10.0 - model.predict_many(data.users, data.items))
    assert flipped.predict_one(user, items[0]) == 10.0 - model.predict_one(user, items[0])
    assert len(set(model.predict_many([user] * 20, items, clip=False))) == 20   # no ties
    assert flipped.rank(user, items) == model.rank(user, items)[::-1]
    monitor = Recorder()
    Wrapped(model, monitor).learn_one(user, items[0], 4.0)
    assert len(monitor.seen) == 1                  # learn_one is watched like learn_many


def test_recommender_hooks_are_its_learners():
    data = small_data()
    monitor = Recorder()
    rec = Recommender(SketchMF(capacity=200, dim=8), pair_capacity=10_000, monitor=monitor)
    rec.learn_many(data.users, data.items, data.ratings)
    assert rec.monitor is monitor and len(monitor.seen) == 1
    before = rec.predict_many(data.users[:50], data.items[:50])
    rec.debias = lambda p: p + 1.0
    np.testing.assert_array_equal(rec.predict_many(data.users[:50], data.items[:50]), before + 1.0)
    assert rec.learner.predict_map is rec.debias
    assert not hasattr(rec, "dp")                  # a Recommender does not pose as its model


def test_restored_recommender_keeps_popularity_order_and_constructor_defaults():
    data = small_data(6000)
    rec = Recommender(SketchMF(capacity=200, dim=8), pair_capacity=20_000, popular=15,
                      index_threshold=7, index_shortlist=0.5)
    rec.learn_many(data.users, data.items, data.ratings)
    back = Recommender.from_parts(rec.state_parts(), SketchMF, refresh_s=5.0)
    assert back.popularity.most_common() == rec.popularity.most_common()
    assert back.popularity.capacity == 15 and back.refresh_s == 5.0
    defaults = Recommender(SketchMF(capacity=10, dim=2))
    assert (back.index_threshold, back.index_shortlist) == (defaults.index_threshold,
                                                            defaults.index_shortlist)
    assert back.monitor is None and back.debias is None and back.learning.is_set()


def test_canary_rows_are_dropped_whatever_the_id_array_type():
    canaries = Canaries.make(4, seed=1)
    mixed = np.array(["alice", canaries.users[0], "bob", canaries.users[1]], dtype=object)
    assert real_rows(mixed).tolist() == [True, False, True, False]
    assert real_rows(mixed.astype(str)).tolist() == [True, False, True, False]
    assert real_rows(np.arange(3)) == slice(None)
    rec = Recommender(SketchMF(capacity=50, dim=4), pair_capacity=1000)
    rec.learn_many(list(mixed), ["film"] * 4, [4.0, 1.0, 5.0, 1.0])   # a list of text ids, too
    assert rec.model.n_learned == 4 and rec.catalogue.snapshot()[0] == ["film"]
    assert rec.recommend(canaries.users[0], 5)[1] == "popular"          # never seen as a user

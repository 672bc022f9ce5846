"""The implicit-feedback term of the sketch learner (models/implicit.py, SVD++'s sum of the items
a user rated): which items a user chose reaches its vector, its history stays bounded, and the
learner's usual contracts (prediction before learning, checkpoints, ranking) hold with it on."""

import numpy as np
import pytest

from sketchrec.models.mix import Experts
from sketchrec.models.implicit import ImplicitHistory
from sketchrec.models.sketch_mf import SketchMF
from sketchrec.models.storage import USER


def chosen_items_world(seed: int, users_per_group: int = 150):
    """Two groups of users. Group A rates some of items 0-19 and group B some of 20-39, every one
    of those ratings a 3 (the item's mean: the rating itself says nothing of the user); both rate
    the "taste" items 40-49: 5 from A, 1 from B. Returns the training stream and, for new users
    who rated only 3s of their group's items, their group and their history."""
    rng = np.random.default_rng(seed)
    users, items, ratings = [], [], []

    def history(user, group):
        for item in rng.choice(20, size=10, replace=False) + 20 * group:
            users.append(user), items.append(int(item)), ratings.append(3.0)

    for user in range(2 * users_per_group):
        group = user % 2
        history(user, group)
        for item in rng.choice(10, size=5, replace=False) + 40:
            users.append(user), items.append(int(item)), ratings.append(5.0 if group == 0 else 1.0)
    train = (np.array(users), np.array(items), np.array(ratings))
    users, items, ratings = [], [], []
    newcomers = range(10_000, 10_040)
    for user in newcomers:
        history(user, user % 2)
    return train, (np.array(users), np.array(items), np.array(ratings)), list(newcomers)


def taste_gap(model, seed: int) -> float:
    """Mean predicted rating of the taste items for new group-A users minus new group-B users,
    after each has rated only 3s of its own group's items."""
    train, newcomer_history, newcomers = chosen_items_world(seed)
    rng = np.random.default_rng(seed + 1)
    for _ in range(8):   # a few passes, shuffled, as epoch training does
        order = rng.permutation(len(train[0]))
        model.learn_many(*(a[order] for a in train))
    model.learn_many(*newcomer_history)
    taste = np.arange(40, 50)
    mean_for = {g: np.mean([model.predict_many([u] * 10, taste) for u in newcomers if u % 2 == g])
                for g in (0, 1)}
    return float(mean_for[0] - mean_for[1])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_which_items_a_user_rated_predicts_its_taste(seed):
    # with the implicit term, a newcomer's 3s on its group's items place it with its group (the true
    # gap is 4); without it (the broken variant: the same learner, term off) nothing tells them apart
    on = taste_gap(SketchMF(dim=8, capacity=600, implicit=16, implicit_lr=0.05, seed=seed), seed)
    off = taste_gap(SketchMF(dim=8, capacity=600, seed=seed), seed)
    assert on > 2.0, on
    assert abs(off) < 0.5, off


def small_stream(n=3_000, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 80, n), rng.integers(0, 120, n),
            rng.integers(1, 6, n).astype(np.float64))


def test_learning_returns_what_predict_said_just_before():
    users, items, ratings = small_stream()
    model = SketchMF(dim=8, capacity=200, implicit=8)
    for n in range(0, 600):
        before = model.predict_many(users[n:n + 1], items[n:n + 1])
        assert model.learn_many(users[n:n + 1], items[n:n + 1], ratings[n:n + 1])[0] == before[0]
    assert model.history.arrays.seen.sum() > 0


def test_a_checkpoint_keeps_the_histories_and_a_model_without_them_saves_none():
    users, items, ratings = small_stream()
    model = SketchMF(dim=8, capacity=200, implicit=8)
    model.learn_many(users, items, ratings)
    twin = SketchMF.from_bytes(model.to_bytes())
    assert twin.implicit == 8
    np.testing.assert_array_equal(twin.predict_many(users, items), model.predict_many(users, items))
    assert "implicit_vectors" not in SketchMF(dim=8, capacity=200)._state_arrays()


def test_scores_and_factors_include_the_implicit_term():
    users, items, ratings = small_stream()
    model = SketchMF(dim=8, capacity=200, implicit=8)
    model.learn_many(users, items, ratings)
    catalogue = np.arange(120)
    np.testing.assert_allclose(model.score_items(3, catalogue),
                               model.predict_many([3] * 120, catalogue, clip=False), rtol=1e-12)
    with_term = model.factors([3], USER)[0]
    model.history = ImplicitHistory.off(8)
    model._bind_store()
    assert not np.allclose(with_term, model.factors([3], USER)[0])


def test_a_history_holds_the_last_distinct_items_and_the_memory_is_fixed():
    model = SketchMF(dim=4, capacity=64, implicit=4)
    size = model.nbytes
    model.learn_many([7] * 6, [1, 2, 2, 3, 1, 4], [3.0] * 6)   # repeats join once
    arrays = model.history.arrays
    row = int(np.flatnonzero(arrays.seen)[0])
    assert arrays.seen[row] == 4 and arrays.owners[row] == model.history.arrays.owners[row]
    model.learn_many([7] * 3, [5, 6, 7], [3.0] * 3)           # 7 distinct: the last 4 are kept
    assert arrays.seen[row] == 7
    kept = set(arrays.items[row].tolist())
    from sketchrec.models.implicit import bucket_of
    from sketchrec.sketches.hashing import as_keys
    assert kept == {int(bucket_of(arrays, k)) for k in as_keys([4, 5, 6, 7])}
    model.learn_many(np.arange(1000, 3000), np.arange(2000) % 50, np.full(2000, 3.0))
    assert model.nbytes == size


def test_the_privacy_modes_refuse_the_term():
    with pytest.raises(ValueError, match="implicit"):
        SketchMF(dim=4, capacity=64, implicit=8, clip_loss=1.0)
    with pytest.raises(ValueError, match="implicit"):
        SketchMF(dim=4, capacity=64, implicit=8, sgld_temperature=0.1)


def test_the_combination_switches_the_term_on_for_epochs_only():
    model = Experts(capacity=100)
    factor = model.members_[1]
    assert factor.implicit == 0
    model.plan_epochs(20)
    assert factor.implicit > 0


def test_a_combination_trained_for_epochs_shares_and_restores_its_histories():
    # readers bind a twin built from the constructor's specs (term off) to the writer's arrays;
    # a checkpoint rebuilds the members: both must predict with the term, as the trained model
    from sketchrec.replay.protocols import train_epochs
    from sketchrec.data import Ratings
    from sketchrec.stream.serving.workers.binding import bind_model, model_arrays
    users, items, ratings = small_stream()
    model = Experts(capacity=200, seed=4)
    train_epochs(model, Ratings(users, items, ratings, np.zeros(len(users), dtype=np.int64)), 3, 0)
    assert model.members_[1].implicit > 0
    expected = model.predict_many(users, items)
    twin = Experts(capacity=200, seed=4)
    bind_model(twin, model_arrays(model), None)
    np.testing.assert_array_equal(twin.predict_many(users, items), expected)
    np.testing.assert_array_equal(Experts.from_bytes(model.to_bytes()).predict_many(users, items),
                                  expected)


def test_users_keep_their_histories_while_the_table_has_room_and_a_light_one_goes_first():
    # 8 rows for 8 users: whatever their hashes, each finds a row of its own (a table addressed
    # by the hash alone loses some to collisions); a 9th takes the row holding the fewest items
    from sketchrec.sketches.hashing import as_keys
    model = SketchMF(dim=4, capacity=8, implicit=4)
    for user in range(8):
        model.learn_many([user] * (user + 2), np.arange(user + 2), np.full(user + 2, 3.0))
    arrays = model.history.arrays
    assert sorted(arrays.owners.tolist()) == sorted(as_keys(list(range(8))).tolist())
    model.learn_many([99], [1], [3.0])
    owners = set(arrays.owners.tolist())
    assert int(as_keys([99])[0]) in owners and int(as_keys([0])[0]) not in owners
    assert all(int(k) in owners for k in as_keys(list(range(1, 8))))


def test_the_space_gain_shrinks_the_histories_too():
    # --space-gain is the model's memory knob: the term's table and vectors follow it
    plain, terse = (SketchMF(dim=8, capacity=4_000, implicit=16, space_gain=g) for g in (1.0, 4.0))
    assert terse.history.nbytes * 4 == pytest.approx(plain.history.nbytes, rel=0.01)
    assert terse.history.nbytes < plain.history.nbytes

"""Count sketch of vectors: exact without collisions, independent families, unbiased with the
predicted variance, mergeable."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.sketches import CountSketch, keys_of

ids = st.one_of(st.integers(min_value=-(2**62), max_value=2**62), st.text(max_size=20))


def test_count_sketch_exact_without_collisions_for_both_estimators():
    cs = CountSketch(width=1 << 20, depth=3, dim=4, seed=2)
    vecs = {u: np.arange(4) + 10 * n for n, u in enumerate(["a", "b", 7])}
    for u, v in vecs.items():
        cs.update(u, v)
    for u, v in vecs.items():
        assert np.allclose(cs.read(u), v)
        assert np.allclose(cs.read(u, estimator="median"), v)
    assert np.allclose(cs.read("never-seen"), 0)


def test_families_hash_independently():
    cs = CountSketch(width=4096, depth=4, dim=8, seed=0)
    cs.update("x", np.ones(8), family=0)
    assert np.allclose(cs.read("x", family=0), 1)
    assert np.abs(cs.read("x", family=1)).max() < 1  # another family sees at most collision noise


def test_count_sketch_estimate_is_unbiased_with_predicted_variance():
    """Thesis §4.2: each estimate carries centred noise of variance sum_e v_e^2 / (w k)."""
    rng = np.random.default_rng(7)
    n, w, k, d = 20_000, 2_000, 4, 4
    cs = CountSketch(width=w, depth=k, dim=d, seed=11)
    truth = rng.normal(0, 1, (n, d))
    keys = keys_of(np.arange(n))
    cs.update_many(keys, truth)
    err = cs.read_many(keys) - truth
    sem = err.std() / np.sqrt(err.size)
    assert abs(err.mean()) < 3 * sem
    # every (id, component) shares the same k rows: the noise energy is the sum over all n*d values
    predicted = (truth ** 2).sum() / (w * k)
    assert abs(err.var() / predicted - 1) < 0.2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(ids, st.lists(st.integers(-50, 50), min_size=3, max_size=3)), max_size=40),
       st.integers(0, 40))
def test_merge_equals_sketch_of_concatenated_stream(updates, cut):
    # integer deltas keep float32 sums exact, so equality is bit-for-bit
    whole, left, right = (CountSketch(31, 3, 3, seed=5) for _ in range(3))
    for n, (u, v) in enumerate(updates):
        whole.update(u, v)
        (left if n < cut else right).update(u, v)
    left += right
    assert left == whole

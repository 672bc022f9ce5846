"""Count-min sketch: never under-counts, meets its (epsilon, delta) bound; conservative update."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.sketches import CountMinSketch, key_of

ids = st.one_of(st.integers(min_value=-(2**62), max_value=2**62), st.text(max_size=20))


@settings(max_examples=60, deadline=None)
@given(st.lists(ids, max_size=300), st.booleans(), st.integers(1, 40), st.integers(1, 4))
def test_count_min_never_under_counts(stream, conservative, width, depth):
    cms = CountMinSketch(width=width, depth=depth, seed=1, conservative=conservative)
    cms.add_many(stream)
    truth: dict = {}
    for x in stream:
        k = key_of(x)
        truth[k] = truth.get(k, 0) + 1
    keys = np.array(list(truth), dtype=np.uint64)
    est = cms.estimate_many(keys)
    assert (est >= np.array(list(truth.values()))).all()
    assert cms.total == len(stream)


def test_count_min_error_bound_holds_with_probability():
    eps, delta = 0.01, 0.01
    cms = CountMinSketch(epsilon=eps, delta=delta, seed=2)
    rng = np.random.default_rng(0)
    stream = rng.zipf(1.3, 50_000) % 20_000
    cms.add_many(stream)
    values, counts = np.unique(stream, return_counts=True)
    over = cms.estimate_many(values) - counts
    assert (over >= 0).all()
    assert np.mean(over > eps * len(stream)) <= delta


def test_conservative_update_never_worse():
    rng = np.random.default_rng(1)
    stream = rng.integers(0, 5000, 20_000)
    plain = CountMinSketch(width=500, depth=3, seed=5)
    cons = CountMinSketch(width=500, depth=3, seed=5, conservative=True)
    plain.add_many(stream)
    cons.add_many(stream)
    values, counts = np.unique(stream, return_counts=True)
    e_plain, e_cons = plain.estimate_many(values), cons.estimate_many(values)
    assert (e_cons >= counts).all() and (e_cons <= e_plain).all()
    assert e_cons.sum() < e_plain.sum()


def test_count_min_sizing_and_validation():
    cms = CountMinSketch(epsilon=0.001, delta=0.05)
    assert (cms.width, cms.depth) == (2719, 3)
    with pytest.raises(ValueError):
        CountMinSketch()
    with pytest.raises(ValueError):
        CountMinSketch(width=10, depth=2).add_many([1], [-1])

"""What the Sketch base gives every sketch: merging (sum or union) and bit-exact bytes; refusals
of mismatched merges and corrupt blobs (tests/contract/ runs the generic contract over every sketch)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.sketches import BloomFilter, CountMinSketch, CountSketch

ids = st.one_of(st.integers(min_value=-(2**62), max_value=2**62), st.text(max_size=20))


def test_merge_of_count_min_and_bloom_is_sum_and_union():
    a, b, both = (CountMinSketch(width=50, depth=3, seed=1) for _ in range(3))
    a.add_many([1, 2, 3]); b.add_many([3, 4]); both.add_many([1, 2, 3, 3, 4])
    assert a + b == both and (a + b).total == 5
    fa, fb, fboth = (BloomFilter(100, 0.01, seed=2) for _ in range(3))
    fa.add_many(["x"]); fb.add_many(["y"]); fboth.add_many(["x", "y"])
    assert fa + fb == fboth


def test_merge_refuses_different_shape_or_seed():
    with pytest.raises(ValueError):
        CountSketch(10, 2, 2, seed=0).merge(CountSketch(10, 2, 2, seed=1))
    with pytest.raises(ValueError):
        CountMinSketch(width=10, depth=2).merge(CountMinSketch(width=11, depth=2))
    with pytest.raises(ValueError):
        BloomFilter(10, 0.1).merge(CountSketch(10, 2))


@settings(max_examples=30, deadline=None)
@given(st.lists(ids, max_size=50), st.integers(0, 2**31))
def test_serialisation_round_trips_bit_exactly(items, seed):
    cs = CountSketch(64, 3, 2, seed=seed)
    cs.update_many(items, np.random.default_rng(seed).normal(size=(len(items), 2)))
    cms = CountMinSketch(width=20, depth=3, seed=seed, conservative=True)
    cms.add_many(items)
    bf = BloomFilter(30, 0.02, seed=seed)
    bf.add_many(items)
    for sketch in (cs, cms, bf):
        blob = sketch.to_bytes()
        back = type(sketch).from_bytes(blob)
        assert back == sketch and back.to_bytes() == blob
        assert back.params() == sketch.params()
    assert CountMinSketch.from_bytes(cms.to_bytes()).total == len(items)


def test_corrupt_blobs_are_refused():
    blob = CountSketch(8, 2, 2).to_bytes()
    with pytest.raises(ValueError):
        CountSketch.from_bytes(blob[:-3])
    with pytest.raises(ValueError):
        CountMinSketch.from_bytes(blob)
    with pytest.raises(ValueError):
        CountSketch.from_bytes(b"XXXX" + blob[4:])

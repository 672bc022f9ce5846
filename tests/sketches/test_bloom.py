"""Bloom filter: no false negatives, the false-positive rate it was sized for, its bit array."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.sketches import BloomFilter

ids = st.one_of(st.integers(min_value=-(2**62), max_value=2**62), st.text(max_size=20))


@settings(max_examples=60, deadline=None)
@given(st.lists(ids, max_size=200), st.integers(1, 200))
def test_bloom_has_no_false_negatives(items, capacity):
    bf = BloomFilter(capacity, 0.05, seed=9)
    bf.add_many(items)
    assert all(x in bf for x in items)
    if items:
        assert bf.contains_many(items).all()


def test_bloom_false_positive_rate_at_capacity():
    for fp_rate in (0.01, 0.05):
        bf = BloomFilter(20_000, fp_rate, seed=4)
        bf.add_many(np.arange(20_000))
        probes = np.arange(10**6, 10**6 + 200_000)
        measured = bf.contains_many(probes).mean()
        assert measured <= 1.5 * fp_rate, (fp_rate, measured)
        assert measured >= 0.5 * fp_rate  # the sizing is not wastefully loose either


def test_bloom_bits_can_be_flipped_and_count_estimated():
    bf = BloomFilter(1000, 0.01, seed=0)
    bf.add_many(range(500))
    assert abs(bf.estimated_count() - 500) < 25
    bits = bf.bits
    flipped = ~bits
    bf.set_bits(flipped)
    assert np.array_equal(bf.bits, flipped)
    with pytest.raises(ValueError):
        bf.set_bits(bits[:-1])


def test_a_key_sets_exactly_its_codeword_bits_and_the_filter_keeps_its_pinned_bits():
    """Snapshots and checkpoints hold the bits: however the adds are computed, a key sets its
    codeword's positions and no others (blocks of keys of any length), and a pinned filter's
    bits do not move."""
    import hashlib
    from sketchrec.sketches.bloom import codewords
    from sketchrec.sketches.hashing import as_keys
    bf = BloomFilter(5_000, 0.01, seed=3)
    keys = as_keys(np.arange(1_000))
    for n in (1, 63, 64, 65, 200):
        one = BloomFilter(5_000, 0.01, seed=3)
        one.add_many(keys[:n])
        want = np.zeros(one.m_bits, bool)
        want[codewords(keys[:n], one.n_hashes, one.m_bits, seed=3).reshape(-1)] = True
        np.testing.assert_array_equal(one.bits, want)
    bf.add_many(keys)
    assert hashlib.sha256(bf.cells.tobytes()).hexdigest()[:16] == PINNED


PINNED = "e1519e1c5ad6d97a"   # keys 0..999, capacity 5,000, fp 0.01, seed 3: as filters were written

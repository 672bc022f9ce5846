"""Guarantees of the sketches: property tests for the bounds, statistical tests for the estimators."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.sketches import BloomFilter, CountMinSketch, CountSketch, HeavyHitters, key_of, keys_of, pair_keys

ids = st.one_of(st.integers(min_value=-(2**62), max_value=2**62), st.text(max_size=20))


# --- hashing ---------------------------------------------------------------------------------------

def test_int_and_decimal_string_are_the_same_id():
    assert key_of(5) == key_of("5") == key_of(np.int64(5))
    assert key_of(5) != key_of(6)
    assert keys_of(np.array([5, 6, 5])).tolist() == [key_of(5), key_of(6), key_of(5)]
    assert keys_of(["a", "b", "a"]).tolist() == [key_of("a"), key_of("b"), key_of("a")]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=1, max_size=50),
       st.integers(min_value=0, max_value=2**32 - 1))
def test_vectorised_integer_keys_equal_mmh3_of_the_decimal_text(values, seed):
    # the numba MurmurHash3 port used for int arrays must give exactly mmh3's keys
    expected = [key_of(v, seed) for v in values]
    assert keys_of(np.array(values, dtype=np.int64), seed).tolist() == expected
    assert keys_of(np.array(values, dtype=np.int64).astype(np.int32, casting="unsafe"), seed).tolist() == [
        key_of(int(v), seed) for v in np.array(values, dtype=np.int64).astype(np.int32, casting="unsafe")]


def test_vectorised_integer_keys_at_the_edges_of_every_integer_type():
    edges = [0, 1, 9, 10, 99, 100, 10**15 - 1, 10**15, 10**16, 2**63 - 1, 2**64 - 1]  # 16 digits = a block
    assert keys_of(np.array(edges, dtype=np.uint64)).tolist() == [key_of(v) for v in edges]
    signed = [-(2**63), -(10**16), -1, 0, 2**63 - 1]
    assert keys_of(np.array(signed, dtype=np.int64)).tolist() == [key_of(v) for v in signed]
    assert keys_of(np.array([3, 250], dtype=np.uint8)).tolist() == [key_of(3), key_of(250)]


def test_unsupported_id_types_are_refused():
    for bad in (1.5, None, True):
        with pytest.raises(TypeError):
            key_of(bad)


def test_pair_keys_depend_on_order():
    a, b = keys_of([1, 2]), keys_of([2, 1])
    pk = pair_keys(a, b)
    assert pk[0] != pk[1]
    assert pair_keys(a, b).tolist() == pk.tolist()


def test_keys_and_addresses_identical_across_processes():
    script = ("from sketchrec.sketches import keys_of, CountSketch, BloomFilter\n"
              "cs = CountSketch(97, 3, 2, seed=4); cs.update_many(['x', 7, 'y'], [[1, 2], [3, 4], [5, 6]])\n"
              "b = BloomFilter(100, 0.01, seed=3); b.add_many(['x', 'z'])\n"
              "print(keys_of(['alice', 42, 'héllo']).tolist(), cs.cells.tobytes().hex(), b.cells.tobytes().hex())")
    outs = set()
    for hashseed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed)
        outs.add(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                check=True).stdout)
    assert len(outs) == 1
    assert str(key_of("alice")) in outs.pop()


# --- count-min -------------------------------------------------------------------------------------

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


def test_heavy_hitters_finds_most_frequent_within_capacity():
    rng = np.random.default_rng(3)
    stream = rng.zipf(1.5, 30_000) % 3000
    hh = HeavyHitters(10, CountMinSketch(epsilon=0.001, delta=0.01, seed=1))
    for chunk in np.array_split(stream, 30):
        hh.add_many(chunk)
    assert len(hh) == 10
    values, counts = np.unique(stream, return_counts=True)
    true_top = set(values[np.argsort(-counts)[:5]].tolist())
    found = [item for item, _ in hh.most_common(5)]
    assert set(found) == true_top
    estimates = [c for _, c in hh.most_common()]
    assert estimates == sorted(estimates, reverse=True)


# --- Bloom -----------------------------------------------------------------------------------------

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


# --- count sketch ----------------------------------------------------------------------------------

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

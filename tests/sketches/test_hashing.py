"""Hashing of ids to keys: one key per id whatever its type, the same in every process."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sketchrec.sketches import key_of, keys_of, pair_keys


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

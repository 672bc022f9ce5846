"""Hashing of ids to keys: one key per id whatever its type, the same in every process."""

import os
import subprocess
import sys

import mmh3
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


# --- every str and every int is an id ----------------------------------------------------------------

# every code point, lone surrogates included (hypothesis leaves category Cs out unless asked)
_ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())


def _decimal_text(value: int) -> bytes:
    """The reference decimal text of an int of any size (str() with its digit limit lifted)."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return str(value).encode()
    finally:
        sys.set_int_max_str_digits(limit)


def test_a_lone_surrogate_nul_and_a_long_id_hash_instead_of_raising():
    for odd in ("\ud800", "\udfff", "a\ud800b", "\x00", "x\x00y", "é" * 100_000):
        assert 0 <= key_of(odd) < 2**64
        assert keys_of([odd, 1]).tolist() == [key_of(odd), key_of(1)]
    assert key_of("\ud800") != key_of("\ud801")
    # a surrogate pair written as two code units is not the character it would encode
    assert key_of("\ud83d\ude00") != key_of("\U0001F600")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_ANY_CHAR, max_size=64), st.integers(min_value=0, max_value=2**32 - 1))
def test_every_str_hashes_and_keys_of_text_that_encoded_before_are_unchanged(text, seed):
    key = key_of(text, seed)
    assert 0 <= key < 2**64 and keys_of([text], seed).tolist() == [key]
    try:
        strict = text.encode("utf-8")
    except UnicodeEncodeError:
        return  # never hashed before: only required to hash, which it did
    assert key == mmh3.hash64(strict, seed, signed=False)[0]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_ANY_CHAR, max_size=16), st.text(alphabet=_ANY_CHAR, max_size=16))
def test_distinct_strs_have_distinct_bytes(a, b):
    # the keys of distinct ids only collide by chance, never because their bytes coincide
    from sketchrec.sketches.hashing import id_bytes
    assert (id_bytes(a) == id_bytes(b)) == (a == b)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(), st.integers(min_value=-(10**9000), max_value=10**9000)),
       st.integers(min_value=0, max_value=2**32 - 1))
def test_ints_of_any_size_are_the_id_of_their_decimal_text(value, seed):
    expected = mmh3.hash64(_decimal_text(value), seed, signed=False)[0]
    assert key_of(value, seed) == expected
    assert keys_of([value], seed).tolist() == [expected]
    if -(2**63) <= value < 2**63:
        assert keys_of(np.array([value], dtype=np.int64), seed).tolist() == [expected]


def test_ints_past_the_str_digit_limit_hash():
    for value in (10**5000, -(10**5000) + 7, 2**70, -(2**64) - 1, 10**1000, 10**1000 - 1):
        assert key_of(value) == mmh3.hash64(_decimal_text(value), 0, signed=False)[0]
        assert key_of(value) == key_of(_decimal_text(value).decode())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=_ANY_CHAR, max_size=40), min_size=1, max_size=30),
       st.integers(min_value=0, max_value=2**32 - 1))
def test_text_ids_hashed_in_one_compiled_pass_give_each_ids_own_key(texts, seed):
    # a column of str ids is hashed from arrow's UTF-8 buffers, not id by id: the same keys
    from sketchrec.sketches.hashing import _as_utf8
    column = np.array(texts, dtype=object)
    assert keys_of(column, seed).tolist() == [key_of(t, seed) for t in texts]
    assert keys_of(column[1::2], seed).tolist() == [key_of(t, seed) for t in texts[1::2]]
    encodable = all(not any("\ud800" <= c <= "\udfff" for c in t) for t in texts)
    assert (_as_utf8(column) is not None) == encodable   # the compiled pass is the one taken


def test_a_text_column_with_ints_or_none_among_its_ids_takes_the_per_id_path():
    assert keys_of(np.array(["7", 7, "x"], dtype=object)).tolist() == [key_of(7), key_of(7), key_of("x")]
    with pytest.raises(TypeError):
        keys_of(np.array(["x", None], dtype=object))
